"""layerwise_sgd_step (FedL2P Eq. 10): the clamp with a straight-through gradient, first and
second derivatives, and the multi-tensor Triton kernels against the reference."""
from __future__ import annotations

import pytest
import torch
from kernel_helpers import DEVICE, assert_close, requires_triton

from pflkit.kernels import reference, sgd_triton

SHAPES = [(3,), (1,), (513,), (2049,), (2, 3, 3, 3), (0,)]
BOTH = ["reference", pytest.param("triton", marks=requires_triton)]
IMPLS = {"reference": reference.layerwise_sgd_step, "triton": sgd_triton.layerwise_sgd_step}


def _problem(shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=g).to(DEVICE, dtype).requires_grad_() for s in shapes]
    eta = torch.linspace(-0.5, 1.5, len(shapes)).to(DEVICE).requires_grad_()  # some below 0, some above 1
    return params, eta


def _grads(params):
    """g(theta) with a graph (create_graph): Eq. 9 differentiates through it."""
    loss = sum((p.float() ** 3).sum() + (p.float() * p.float().roll(1)).sum() for p in params)
    return list(torch.autograd.grad(loss, params, create_graph=True))


@pytest.mark.parametrize("impl", BOTH)
def test_clamp_forward_straight_through_backward(impl):
    fn = IMPLS[impl]
    params = [torch.ones(2, device=DEVICE), torch.ones(3, device=DEVICE), torch.ones(1, device=DEVICE)]
    grads = [torch.full((2,), 2.0, device=DEVICE), torch.full((3,), 3.0, device=DEVICE),
             torch.full((1,), 4.0, device=DEVICE)]
    eta = torch.tensor([-0.5, 0.25, 7.0], device=DEVICE, requires_grad=True)
    out = fn(params, grads, eta, max_lr=1.0)
    # forward: rates clamped to [0, 1] -> 0, 0.25, 1
    torch.testing.assert_close(out[0], torch.ones(2, device=DEVICE))
    torch.testing.assert_close(out[1], torch.full((3,), 1 - 0.75, device=DEVICE))
    torch.testing.assert_close(out[2], torch.full((1,), 1 - 4.0, device=DEVICE))
    # backward: d/d eta_l of sum(out_l) = -sum(g_l), also where the clamp is active
    sum(o.sum() for o in out).backward()
    torch.testing.assert_close(eta.grad, torch.tensor([-4.0, -9.0, -4.0], device=DEVICE))


@pytest.mark.parametrize("impl", BOTH)
def test_no_clamp_lets_negative_rates_through(impl):
    out = IMPLS[impl]([torch.ones(2, device=DEVICE)], [torch.ones(2, device=DEVICE)],
                      torch.tensor([-2.0], device=DEVICE))
    torch.testing.assert_close(out[0], torch.full((2,), 3.0, device=DEVICE))


def test_reference_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g, dtype=torch.float64, device=DEVICE).requires_grad_() for s in [(3,), (2, 2)]]
    grads = [torch.randn(p.shape, generator=g, dtype=torch.float64, device=DEVICE).requires_grad_() for p in params]
    eta = torch.tensor([0.3, 0.7], dtype=torch.float64, device=DEVICE, requires_grad=True)

    def f(p0, p1, g0, g1, e):
        return tuple(reference.layerwise_sgd_step([p0, p1], [g0, g1], e, max_lr=1.0))

    inputs = (*params, *grads, eta)
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


def test_bad_arguments_raise_clear_errors():
    p = [torch.zeros(2), torch.zeros(3)]
    for fn in IMPLS.values():
        with pytest.raises(ValueError, match="one entry per tensor"):
            fn(p, p, torch.zeros(3))
        with pytest.raises(ValueError, match="one entry per tensor"):
            fn(p, p, [0.1, 0.2])
        with pytest.raises(ValueError, match="grads"):
            fn(p, p[:1], torch.zeros(2))
        with pytest.raises(ValueError, match="param"):
            fn(p, [p[1], p[0]], torch.zeros(2))


@requires_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triton_forward_and_gradients_match_reference(dtype, tol):
    """Outputs, d/d(theta, eta) through g(theta) (Eq. 9-10), and a Hessian-vector product."""
    results = {}
    for name, fn in IMPLS.items():
        params, eta = _problem(SHAPES, dtype)
        grads = _grads(params)
        out = fn(params, grads, eta, max_lr=1.0)
        loss = sum((o.float() ** 2).sum() for o in out)
        first = torch.autograd.grad(loss, params + [eta], create_graph=True)
        vec = [torch.cos(torch.arange(t.numel(), device=DEVICE, dtype=torch.float32)).reshape(t.shape).to(t.dtype)
               for t in params]
        hvp = torch.autograd.grad(sum((a * b).sum() for a, b in zip(first[:-1], vec)), params + [eta])
        results[name] = (out, first, hvp)
    for part, (got, want) in zip(("out", "grad", "hvp"), zip(results["triton"], results["reference"])):
        for i, (a, b) in enumerate(zip(got, want)):
            scale = max(1.0, b.detach().abs().max().item()) if b.numel() else 1.0
            # Everything downstream of a half-precision output agrees to that precision only (and
            # Triton's interpreter rounds fp32 -> bf16 toward zero, where GPUs round to nearest).
            assert_close(a.detach() / scale, b.detach() / scale, tol, f"{part}[{i}]", dtype)


@requires_triton
def test_triton_launches_per_call(triton_launches):
    """Forward: one launch for all tensors; backward: one axpy and a two-launch dot."""
    params, eta = _problem([(4,)] * 20)
    grads = [torch.ones_like(p) for p in params]
    out = sgd_triton.layerwise_sgd_step(params, grads, eta, max_lr=1.0)
    assert triton_launches == ["_axpy_kernel"]
    torch.autograd.grad(sum(o.sum() for o in out), [eta])
    assert sorted(triton_launches[1:]) == ["_dot_partial_kernel", "_segment_sum_kernel"]


@pytest.mark.parametrize("impl", BOTH)
def test_outputs_are_separate_tensors_that_allow_in_place_updates(impl):
    params, eta = _problem([(3,), (4,)])
    grads = [torch.ones_like(p) for p in params]
    out = IMPLS[impl](params, grads, eta)
    before = out[0].detach().clone()
    out[1].mul_(2.0)  # with autograd recording: fine for independent outputs
    torch.testing.assert_close(out[0].detach(), before)
    sum(o.sum() for o in out).backward()
    torch.testing.assert_close(eta.grad, torch.tensor([-3.0, -8.0], device=DEVICE))
