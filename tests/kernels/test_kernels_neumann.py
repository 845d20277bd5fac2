"""neumann_update (FedL2P Alg. 2 lines 3-4): the series it builds, and the multi-tensor
Triton kernel (one launch for all tensors) against the reference."""
from __future__ import annotations

import pytest
import torch
from kernel_helpers import DEVICE, assert_close, requires_triton

from pflkit.kernels import _triton_common, neumann_triton, reference

# sizes around the kernel's 2048-element block: empty, scalar-like, odd, exact, one past
SHAPES = [(3,), (1,), (513,), (2048,), (2049,), (0,), (2, 3, 3, 3), (64, 7)]


def _lists(shapes, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g).to(DEVICE, dtype) for s in shapes] for _ in range(3)]


def _spd(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    return a @ a.T / n + torch.eye(n, dtype=torch.float64)


@pytest.mark.parametrize("impl", ["reference", pytest.param("triton", marks=requires_triton)])
def test_q_steps_give_the_truncated_neumann_series(impl):
    """After Q steps from p = v = b: p = sum_{j<=Q} (I - psi H)^j b, and psi p -> H^-1 b."""
    fn = {"reference": reference.neumann_update, "triton": neumann_triton.neumann_update}[impl]
    dtype = torch.float64 if impl == "reference" else torch.float32
    H = _spd(6)
    b = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    psi, Q = 0.3, 60
    # split the vector over two "parameter tensors" of different shapes
    v = [b[:2].to(DEVICE, dtype), b[2:].reshape(2, 2).to(DEVICE, dtype)]
    p = [t.clone() for t in v]
    for q in range(Q):
        flat = torch.cat([t.reshape(-1) for t in v]).double().cpu()
        hv_flat = (H @ flat).to(DEVICE, dtype)
        hv = [hv_flat[:2], hv_flat[2:].reshape(2, 2)]
        v, p = fn(v, hv, p, psi)
        if q == 2:  # Q = 3 as in FedL2P: compare with the closed form
            M = torch.eye(6, dtype=torch.float64) - psi * H
            series = sum(torch.linalg.matrix_power(M, j) for j in range(4)) @ b
            got = torch.cat([t.reshape(-1) for t in p]).double().cpu()
            torch.testing.assert_close(got, series, atol=1e-5, rtol=1e-5)
    got = psi * torch.cat([t.reshape(-1) for t in p]).double().cpu()
    torch.testing.assert_close(got, torch.linalg.solve(H, b), atol=1e-4, rtol=1e-4)


def test_reference_leaves_inputs_untouched_and_checks_arguments():
    v, hv, p = _lists([(3,), (2, 2)], torch.float32)
    before = [t.clone() for t in v + hv + p]
    reference.neumann_update(v, hv, p, 0.1)
    assert all(torch.equal(a, b) for a, b in zip(v + hv + p, before))
    with pytest.raises(ValueError, match="equal lengths"):
        reference.neumann_update(v, hv[:1], p, 0.1)
    with pytest.raises(ValueError, match="shapes differ"):
        reference.neumann_update(v, [hv[1], hv[0]], p, 0.1)


@requires_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triton_matches_reference(dtype, tol):
    v, hv, p = _lists(SHAPES, dtype)
    before = [t.clone() for t in v + hv + p]
    got_v, got_p = neumann_triton.neumann_update(v, hv, p, 0.1)
    want_v, want_p = reference.neumann_update(v, hv, p, 0.1)
    for i in range(len(SHAPES)):
        assert_close(got_v[i], want_v[i], tol, f"v[{i}]")
        assert_close(got_p[i], want_p[i], tol, f"p[{i}]")
    assert all(torch.equal(a, b) for a, b in zip(v + hv + p, before)), "inputs were modified"


@requires_triton
def test_triton_mixed_dtypes_strided_and_misaligned_inputs(tol):
    """Per-dtype launches; a transposed view and a tensor starting off a 16-byte boundary."""
    g = torch.Generator().manual_seed(2)
    base = torch.randn(1 + 3 * 5, generator=g).to(DEVICE)
    v = [base[1:].reshape(3, 5), torch.randn(4, 6, generator=g).to(DEVICE).T,
         torch.randn(7, generator=g).to(DEVICE).half()]
    hv = [torch.randn(t.shape, generator=g).to(DEVICE, t.dtype) for t in v]
    p = [torch.randn(t.shape, generator=g).to(DEVICE, t.dtype) for t in v]
    got_v, got_p = neumann_triton.neumann_update(v, hv, p, 0.25)
    want_v, want_p = reference.neumann_update(v, hv, p, 0.25)
    for a, b, name in zip(got_v + got_p, want_v + want_p, ["v0", "v1", "v2", "p0", "p1", "p2"]):
        assert_close(a, b, tol, name)


@requires_triton
def test_triton_outputs_feed_the_next_iteration_aligned():
    """Outputs are views of one padded buffer; each starts on a 16-byte boundary."""
    v, hv, p = _lists([(3,), (5,), (1,), (9,)], torch.float32)
    v2, p2 = neumann_triton.neumann_update(v, hv, p, 0.1)
    assert _triton_common.all_aligned(v2, p2)
    v3, p3 = neumann_triton.neumann_update(v2, hv, p2, 0.1)
    w2, q2 = reference.neumann_update(v, hv, p, 0.1)
    w3, q3 = reference.neumann_update(w2, hv, q2, 0.1)
    for a, b in zip(v3 + p3, w3 + q3):
        torch.testing.assert_close(a, b)


@requires_triton
def test_triton_one_launch_per_call(triton_launches):
    """Q iterations cost Q launches, whatever the number of tensors."""
    v, hv, p = _lists([(4,)] * 30, torch.float32)
    for _ in range(3):
        v, p = neumann_triton.neumann_update(v, hv, p, 0.1)
    assert triton_launches == ["_neumann_kernel"] * 3


@requires_triton
def test_triton_refuses_to_build_a_graph():
    v, hv, p = _lists([(3,)], torch.float32)
    v[0].requires_grad_()
    assert neumann_triton.unsupported_reason(v, hv, p, 0.1) is not None
    with pytest.raises(ValueError, match="not differentiable"):
        neumann_triton.neumann_update(v, hv, p, 0.1)
    with torch.no_grad():
        neumann_triton.neumann_update(v, hv, p, 0.1)
