"""Triton layer-wise SGD step, differentiable in eta and theta (FedL2P Eq. 9-10).

Math. Eq. 10 takes a gradient step with one learning rate per parameter tensor (LRNet's
``eta_l``, l = 1..L):

    theta'_l = theta_l - e_l * g_l,       e_l = clamp(eta_l, 0, max_lr) (forward only),

and the training loss of Eq. 9 is evaluated at ``theta'``, so the IFT hypergradient needs
gradients through this step, including second order (the Neumann series of Alg. 2 takes
Hessian-vector products of L_T, whose graph contains this step). With ``out_l = a_l + s_l b_l``
(here ``a = theta, s = -e, b = g``), for an upstream gradient ``u_l = dL/d out_l``:

    dL/da_l = u_l,        dL/db_l = s_l u_l,        dL/ds_l = <u_l, b_l>   (sum over the tensor).

The clamp uses a straight-through estimator (App. E): the forward uses the clamped value,
the backward passes ``dL/de_l`` to ``eta_l`` unchanged, even where the clamp is active.

Kernels. Two multi-tensor kernels cover every term, one launch each over ALL tensors
(tiles + pointer table, see `_triton_common`): ``axpy`` (``out_l = a_l + s_l b_l``, or
``s_l b_l``) and ``dot`` (``<a_l, b_l>`` per tensor: per-tile partial sums, then a second
small launch sums each tensor's tiles in a fixed order, so the result is deterministic,
unlike atomics). Each autograd Function's backward is written with the other Functions, so
it is itself differentiable: double backward (Hessian-vector products) works to any order.
"""
from __future__ import annotations

import torch

from . import reference
from ._triton_common import all_aligned, check_same_device, group_by_dtype, lazy_jit, plan_for, pointer_table

# `tl` is bound to triton.language in the namespace the kernels are jitted in
# (`_triton_common.lazy_jit`), so importing this module does not import Triton.
tl = None

BLOCK = 2048        # elements per program of the elementwise and partial-dot kernels (8 per thread)
NUM_WARPS = 8
SEG_BLOCK = 256     # partial sums combined per step when summing a tensor's tiles


@lazy_jit
def _tile_setup(table_ptr, L, i, tile_index_ptr, tile, ref_ptr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr):
    """Addresses of a_i and b_i (table rows 0 and 1) and the tile's element offsets."""
    a_ptr = tl.load(table_ptr + i).to(ref_ptr.dtype)
    b_ptr = tl.load(table_ptr + L + i).to(ref_ptr.dtype)
    if ALIGNED:  # checked on the host: every address is 16-byte aligned
        a_ptr = tl.multiple_of(a_ptr, 16)
        b_ptr = tl.multiple_of(b_ptr, 16)
    start = tl.load(tile_index_ptr + tile).to(tl.int64) * BLOCK
    return a_ptr, b_ptr, start, start + tl.arange(0, BLOCK)


@lazy_jit
def _axpy_tile(a_ptr, b_ptr, out_ptr, offs, n, s, HAS_A: tl.constexpr, MASKED: tl.constexpr):
    if MASKED:
        mask = offs < n
        other = 0.0
    else:
        mask = None
        other = None
    y = s * tl.load(b_ptr + offs, mask=mask, other=other).to(tl.float32)
    if HAS_A:
        y += tl.load(a_ptr + offs, mask=mask, other=other).to(tl.float32)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@lazy_jit
def _axpy_kernel(table_ptr, L, s_ptr, ref_ptr, tile_tensor_ptr, tile_index_ptr, numel_ptr,
                 HAS_A: tl.constexpr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr):
    """One tile of out_l = a_l + s_l * b_l (a omitted when not HAS_A); fp32 arithmetic.

    Table rows: a, b, out. The outputs are separate tensors (not views of one buffer), so
    autograd lets callers modify them in place, as with the reference.
    """
    tile = tl.program_id(0)
    i = tl.load(tile_tensor_ptr + tile)
    n = tl.load(numel_ptr + i)
    s = tl.load(s_ptr + i).to(tl.float32)
    a_ptr, b_ptr, start, offs = _tile_setup(table_ptr, L, i, tile_index_ptr, tile, ref_ptr, ALIGNED, BLOCK)
    out_ptr = tl.load(table_ptr + 2 * L + i).to(ref_ptr.dtype)
    if ALIGNED:
        out_ptr = tl.multiple_of(out_ptr, 16)
    if start + BLOCK <= n:
        _axpy_tile(a_ptr, b_ptr, out_ptr, offs, n, s, HAS_A, False)
    else:
        _axpy_tile(a_ptr, b_ptr, out_ptr, offs, n, s, HAS_A, True)


@lazy_jit
def _dot_partial_kernel(table_ptr, L, ref_ptr, partial_ptr, tile_tensor_ptr, tile_index_ptr, numel_ptr,
                        ALIGNED: tl.constexpr, BLOCK: tl.constexpr):
    """partial[tile] = sum over the tile of a * b (fp32)."""
    tile = tl.program_id(0)
    i = tl.load(tile_tensor_ptr + tile)
    n = tl.load(numel_ptr + i)
    a_ptr, b_ptr, start, offs = _tile_setup(table_ptr, L, i, tile_index_ptr, tile, ref_ptr, ALIGNED, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(partial_ptr + tile, tl.sum(a * b, axis=0))


@lazy_jit
def _segment_sum_kernel(partial_ptr, first_ptr, count_ptr, out_ptr, SEG_BLOCK: tl.constexpr):
    """out[l] = sum of partial[first[l] : first[l] + count[l]], one program per tensor."""
    i = tl.program_id(0)
    first = tl.load(first_ptr + i)
    count = tl.load(count_ptr + i)
    acc = tl.zeros([SEG_BLOCK], dtype=tl.float32)
    for k in range(0, count, SEG_BLOCK):
        idx = k + tl.arange(0, SEG_BLOCK)
        acc += tl.load(partial_ptr + first + idx, mask=idx < count, other=0.0)
    tl.store(out_ptr + i, tl.sum(acc, axis=0))


def _axpy_raw(s: torch.Tensor, a, b):
    """[a_l + s_l b_l] (or [s_l b_l] when a is None), fp32 s; one launch per dtype group."""
    outs: list = [None] * len(b)
    for idx in group_by_dtype(b).values():
        gb = [b[i].contiguous() for i in idx]
        ga = [a[i].to(gb[j].dtype).contiguous() for j, i in enumerate(idx)] if a is not None else gb
        plan = plan_for(gb, BLOCK)
        go = [torch.empty_like(t) for t in gb]
        if plan.num_tiles > 0:
            gs = s[idx].float().contiguous() if len(idx) < len(b) else s.float().contiguous()
            _axpy_kernel[(plan.num_tiles,)](
                pointer_table(ga, gb, go), len(gb), gs, gb[0], plan.tile_tensor, plan.tile_index, plan.numels,
                HAS_A=a is not None, ALIGNED=all_aligned(ga, gb, go), BLOCK=BLOCK, num_warps=NUM_WARPS)
        for j, t in zip(idx, go):
            outs[j] = t
    return outs


def _dot_raw(a, b) -> torch.Tensor:
    """fp32 vector [<a_l, b_l>] over the list; two launches per dtype group."""
    out = torch.zeros(len(a), dtype=torch.float32, device=a[0].device)
    for idx in group_by_dtype(a).values():
        ga = [a[i].contiguous() for i in idx]
        gb = [b[i].to(ga[j].dtype).contiguous() for j, i in enumerate(idx)]
        plan = plan_for(ga, BLOCK)
        if plan.num_tiles == 0:
            continue
        partial = torch.empty(plan.num_tiles, dtype=torch.float32, device=ga[0].device)
        _dot_partial_kernel[(plan.num_tiles,)](
            pointer_table(ga, gb), len(ga), ga[0], partial, plan.tile_tensor, plan.tile_index, plan.numels,
            ALIGNED=all_aligned(ga, gb), BLOCK=BLOCK, num_warps=NUM_WARPS)
        sums = torch.empty(len(ga), dtype=torch.float32, device=ga[0].device)
        _segment_sum_kernel[(len(ga),)](partial, plan.tensor_tile_start, plan.tensor_tiles, sums,
                                        SEG_BLOCK=SEG_BLOCK, num_warps=4)
        out[idx] = sums
    return out


class _Axpy(torch.autograd.Function):
    """out_l = a_l + s_l * b_l over lists (``has_a=False``: out_l = s_l * b_l)."""

    @staticmethod
    def forward(ctx, has_a: bool, n: int, s, *tensors):
        a, b = (tensors[:n], tensors[n:]) if has_a else (None, tensors)
        ctx.has_a, ctx.n = has_a, n
        ctx.save_for_backward(s, *b)
        return tuple(_axpy_raw(s, a, b))

    @staticmethod
    def backward(ctx, *grad_out):
        s, *b = ctx.saved_tensors
        n, has_a = ctx.n, ctx.has_a
        need = ctx.needs_input_grad
        grad_a = list(grad_out) if has_a and any(need[3:3 + n]) else [None] * (n if has_a else 0)
        grad_b = [None] * n
        if any(need[3 + (n if has_a else 0):]):
            grad_b = list(axpy(None, s, list(grad_out)))
        grad_s = dot(list(grad_out), b).to(s.dtype) if need[2] else None
        return (None, None, grad_s, *grad_a, *grad_b)


class _Dot(torch.autograd.Function):
    """s_l = <a_l, b_l> (fp32 vector, one entry per pair of tensors)."""

    @staticmethod
    def forward(ctx, n: int, *tensors):
        a, b = tensors[:n], tensors[n:]
        ctx.n = n
        ctx.save_for_backward(*tensors)
        return _dot_raw(a, b)

    @staticmethod
    def backward(ctx, grad_s):
        n = ctx.n
        saved = ctx.saved_tensors
        a, b = list(saved[:n]), list(saved[n:])
        need = ctx.needs_input_grad
        grad_a = list(axpy(None, grad_s, b)) if any(need[1:1 + n]) else [None] * n
        grad_b = list(axpy(None, grad_s, a)) if any(need[1 + n:]) else [None] * n
        return (None, *grad_a, *grad_b)


def axpy(a, s: torch.Tensor, b) -> list[torch.Tensor]:
    """Differentiable ``[a_l + s_l * b_l]`` (``a=None``: ``[s_l * b_l]``) in one launch per dtype."""
    if a is None:
        return list(_Axpy.apply(False, len(b), s, *b))
    return list(_Axpy.apply(True, len(b), s, *a, *b))


def dot(a, b) -> torch.Tensor:
    """Differentiable per-tensor inner products ``[<a_l, b_l>]`` as an fp32 vector."""
    return _Dot.apply(len(a), *a, *b)


def layerwise_sgd_step(params, grads, eta: torch.Tensor, max_lr: float | None = None) -> list[torch.Tensor]:
    """Triton twin of `pflkit.kernels.reference.layerwise_sgd_step` (same signature and result)."""
    params, grads = list(params), list(grads)
    reference.check_sgd_args(params, grads, eta)
    check_same_device("layerwise_sgd_step", params + grads + [eta])
    if not params:
        return []
    e = reference.clamp_ste(eta, max_lr)
    outs = axpy(params, -e.float(), grads)
    return [o if o.dtype == p.dtype else o.to(p.dtype) for o, p in zip(outs, params)]


SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def unsupported_reason(params, grads, eta, max_lr=None) -> str | None:
    """Why the Triton op cannot take these inputs (the dispatcher then uses the reference), or None."""
    bad = sorted({str(t.dtype) for t in list(params) + list(grads) if t.dtype not in SUPPORTED_DTYPES})
    if bad:
        return f"dtypes {bad} (supported: fp32, fp16, bf16)"
    return None
