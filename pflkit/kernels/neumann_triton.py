"""Triton multi-tensor update of the Neumann-series loop (FedL2P Alg. 2, lines 3-4).

Math. Alg. 2 approximates ``p = v0 (d^2_theta L_T)^-1 / psi`` (the inverse-Hessian-vector
product of the IFT hypergradient, Eq. 7) by the truncated Neumann series

    v_0 = p_0 = d_theta L_V,
    v_{q+1} = v_q - psi * (H v_q),      p_{q+1} = p_q + v_{q+1},     q = 0..Q-1,

so ``p_Q = sum_{j<=Q} (I - psi H)^j v_0``. Each iteration needs one Hessian-vector product
``H v`` (autograd, outside this file) and the two vector updates above, over every
parameter tensor of the model. Done per tensor that is ``2 x (number of tensors)`` small
kernels per iteration (124 for ResNet-18); here it is ONE launch: every tensor of the list
is cut into ``BLOCK``-element tiles, one program per tile, the tensors' addresses read from
an int64 pointer table (see `_triton_common.MultiTensorPlan`). The arithmetic is done in
fp32 whatever the storage dtype; each element is read three times and written twice, the
minimum for an out-of-place update.

The op is not differentiable (Alg. 2 runs on detached vectors); asking for a graph raises.
"""
from __future__ import annotations

import torch

from . import reference
from ._triton_common import (all_aligned, check_same_device, group_by_dtype, lazy_jit, plan_for, pointer_table,
                             split_flat)

# `tl` is bound to triton.language in the namespace the kernels are jitted in
# (`_triton_common.lazy_jit`), so importing this module does not import Triton.
tl = None

BLOCK = 2048      # elements per program: 8 per thread at 8 warps (low register use, many warps in flight)
NUM_WARPS = 8


@lazy_jit
def _neumann_tile(v_ptr, hv_ptr, p_ptr, v_out_ptr, p_out_ptr, offs, out, n, psi, MASKED: tl.constexpr):
    """v' = v - psi * hv, p' = p + v' on one tile; unmasked (vectorizable) unless MASKED."""
    if MASKED:
        mask = offs < n
        other = 0.0
    else:
        mask = None
        other = None
    v = tl.load(v_ptr + offs, mask=mask, other=other).to(tl.float32)
    hv = tl.load(hv_ptr + offs, mask=mask, other=other).to(tl.float32)
    p = tl.load(p_ptr + offs, mask=mask, other=other).to(tl.float32)
    v_new = (v - psi * hv).to(v_out_ptr.dtype.element_ty)
    # p' adds v' as stored (rounded to the storage dtype), as the reference does.
    p_new = p + v_new.to(tl.float32)
    tl.store(v_out_ptr + out, v_new, mask=mask)
    tl.store(p_out_ptr + out, p_new.to(p_out_ptr.dtype.element_ty), mask=mask)


@lazy_jit
def _neumann_kernel(table_ptr, L, v_out_ptr, p_out_ptr, tile_tensor_ptr, tile_index_ptr, numel_ptr,
                    flat_start_ptr, psi, ALIGNED: tl.constexpr, ALIGN: tl.constexpr, BLOCK: tl.constexpr):
    """One program per tile of the multi-tensor plan (see `_triton_common.MultiTensorPlan`)."""
    tile = tl.program_id(0)
    i = tl.load(tile_tensor_ptr + tile)
    start = tl.load(tile_index_ptr + tile).to(tl.int64) * BLOCK
    n = tl.load(numel_ptr + i)
    # Rows 0/1/2 of the table hold the addresses of v, hv, p; the output buffers' pointer
    # type gives the storage dtype to cast the addresses to.
    v_ptr = tl.load(table_ptr + i).to(v_out_ptr.dtype)
    hv_ptr = tl.load(table_ptr + L + i).to(v_out_ptr.dtype)
    p_ptr = tl.load(table_ptr + 2 * L + i).to(v_out_ptr.dtype)
    if ALIGNED:  # the host checked every address is 16-byte aligned: allow vector accesses
        v_ptr = tl.multiple_of(v_ptr, 16)
        hv_ptr = tl.multiple_of(hv_ptr, 16)
        p_ptr = tl.multiple_of(p_ptr, 16)
    offs = start + tl.arange(0, BLOCK)
    out = tl.multiple_of(tl.load(flat_start_ptr + i), ALIGN) + offs
    if start + BLOCK <= n:
        _neumann_tile(v_ptr, hv_ptr, p_ptr, v_out_ptr, p_out_ptr, offs, out, n, psi, False)
    else:
        _neumann_tile(v_ptr, hv_ptr, p_ptr, v_out_ptr, p_out_ptr, offs, out, n, psi, True)


def _check(v, hv, p) -> None:
    reference.check_neumann_args(v, hv, p)
    tensors = v + hv + p
    check_same_device("neumann_update", tensors)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise ValueError("neumann_update (triton) is not differentiable; call it on detached tensors "
                         "or under torch.no_grad() (Alg. 2 never differentiates through it)")


def _launch_group(v, hv, p, psi: float):
    """One launch for tensors sharing a dtype; returns (v', p') as views of two flat buffers."""
    v = [t.contiguous() for t in v]
    hv = [h.to(t.dtype).contiguous() for h, t in zip(hv, v)]
    p = [t.to(v[i].dtype).contiguous() for i, t in enumerate(p)]
    plan = plan_for(v, BLOCK)
    v_flat = torch.empty(plan.total, dtype=v[0].dtype, device=v[0].device)
    p_flat = torch.empty_like(v_flat)
    if plan.num_tiles > 0:
        _neumann_kernel[(plan.num_tiles,)](
            pointer_table(v, hv, p), len(v), v_flat, p_flat, plan.tile_tensor, plan.tile_index, plan.numels,
            plan.flat_start, float(psi), ALIGNED=all_aligned(v, hv, p), ALIGN=plan.align, BLOCK=BLOCK,
            num_warps=NUM_WARPS)
    return split_flat(v_flat, v, plan), split_flat(p_flat, v, plan)


def neumann_update(v, hv, p, psi: float):
    """Triton twin of `pflkit.kernels.reference.neumann_update` (same signature and result).

    Args:
        v, hv, p: equal-length lists of same-shape tensors (current v, H v and p of Alg. 2).
        psi: the Neumann step size (FedL2P uses 0.1).

    Returns:
        ``(v_new, p_new)``, new lists (inputs untouched); one launch per distinct dtype.
    """
    v, hv, p = list(v), list(hv), list(p)
    _check(v, hv, p)
    if not v:
        return [], []
    v_new: list = [None] * len(v)
    p_new: list = [None] * len(v)
    for idx in group_by_dtype(v).values():
        gv, gp = _launch_group([v[i] for i in idx], [hv[i] for i in idx], [p[i] for i in idx], psi)
        for j, i in enumerate(idx):
            v_new[i], p_new[i] = gv[j], gp[j]
    return v_new, p_new


SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def unsupported_reason(v, hv, p, psi) -> str | None:
    """Why the Triton op cannot take these inputs (the dispatcher then uses the reference), or None."""
    tensors = list(v) + list(hv) + list(p)
    bad = sorted({str(t.dtype) for t in tensors if t.dtype not in SUPPORTED_DTYPES})
    if bad:
        return f"dtypes {bad} (supported: fp32, fp16, bf16)"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "inputs that require grad (the Triton op is not differentiable)"
    return None
