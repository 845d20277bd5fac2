"""The whole FedL2P hypergradient pipeline on a tiny net, against finite differences.

lambda (BNNet, LRNet, eta_tilde) -> (beta, eta) (Eq. 4) -> L_T = look-ahead loss (Eq. 9-10,
second order, plus a small L2 term so the minimizer is unique) -> theta*(lambda) by Newton's
method -> L_V(theta*, lambda) with beta-mixed BN (Eq. 2). The IFT hypergradient with a dense
inverse Hessian must match central differences of that pipeline, and the Neumann series
with many terms must converge to it.
"""
from functools import partial

import pytest
import torch

from pflkit.meta.client_stats import client_stats
from pflkit.meta.functional import lookahead_loss, model_tensors, validation_loss
from pflkit.meta.hypergrad import ift_hypergrad
from pflkit.meta.linear_solve import neumann
from pflkit.meta.metanets import MetaSpec, init_meta_params, meta_hyperparams

D = torch.float64
MU = 0.3  # L2 weight: makes theta* an isolated minimum


@pytest.fixture(scope="module")
def problem(tiny_bn_net):
    model = tiny_bn_net()
    g = torch.Generator().manual_seed(1)
    x, xv = torch.randn(16, 3, generator=g, dtype=D) + 0.4, torch.randn(12, 3, generator=g, dtype=D) + 0.4
    w = torch.randn(3, 3, generator=g, dtype=D)
    y, yv = (x @ w).argmax(1), (xv @ w).argmax(1)  # learnable labels: theta* is not degenerate
    stats = client_stats(model, lambda: [x])
    params, buffers = model_tensors(model)
    names = list(params)
    spec = MetaSpec(num_bn=1, num_layers=3, num_tensors=len(names), hidden=8, fixed_lr=0.1)
    nets = {k: v.double() for k, v in spec.modules().items()}
    lam = {k: v.double() for k, v in init_meta_params(spec, torch.Generator().manual_seed(2)).items()}
    keys = list(lam)
    xi, feats = stats.xi.double(), stats.features.double()

    def hyper(lm):
        return meta_hyperparams(spec, nets, dict(zip(keys, lm)), xi, feats)

    def train_loss(th, lm):
        beta, eta = hyper(lm)
        lt = lookahead_loss(model, dict(zip(names, th)), buffers, (x[:8], y[:8]), (x[8:], y[8:]), eta, beta,
                            second_order=True)
        return lt + 0.5 * MU * sum((t * t).sum() for t in th)

    def val_loss(th, lm):
        beta, _ = hyper(lm)
        return validation_loss(model, dict(zip(names, th)), buffers, (xv, yv), beta)

    shapes = [params[n].shape for n in names]
    sizes = [params[n].numel() for n in names]

    def unflat(v):
        return [t.reshape(s) for t, s in zip(torch.split(v, sizes), shapes)]

    def newton(lm, start, iters):
        flat = torch.cat([t.reshape(-1) for t in start]).detach()

        def f(v):
            return train_loss(unflat(v), lm)

        for _ in range(iters):
            v = flat.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(f(v), v)
            flat = flat - torch.linalg.solve(torch.autograd.functional.hessian(f, flat), grad)
        return unflat(flat)

    def descend(lm, start, steps=300, lr=0.3):
        th = [t.detach() for t in start]
        for _ in range(steps):
            th = [t.requires_grad_(True) for t in th]
            grads = torch.autograd.grad(train_loss(th, lm), th)
            th = [(t - lr * g).detach() for t, g in zip(th, grads)]
        return th

    lam0 = [lam[k] for k in keys]
    # gradient descent into a basin, then Newton to the minimum (quadratic convergence)
    theta0 = newton(lam0, descend(lam0, [params[n] for n in names]), iters=3)
    flat0 = torch.cat([t.reshape(-1) for t in theta0])
    hess = torch.autograd.functional.hessian(lambda v: train_loss(unflat(v), lam0), flat0)
    assert float(torch.linalg.eigvalsh(hess).min()) > 1e-3  # a strict local minimum

    def solve_theta(lm, start):
        return newton(lm, start, iters=3)  # warm start: a nearby lambda has a nearby minimum

    return dict(lam=lam0, keys=keys, train_loss=train_loss, val_loss=val_loss,
                solve_theta=solve_theta, theta=theta0, unflat=unflat, nets=nets)


def _dense_solve(matvec, b):
    flat_b = torch.cat([t.reshape(-1) for t in b])
    n = flat_b.numel()
    cols = []
    for i in range(n):
        e = torch.zeros(n, dtype=flat_b.dtype)
        e[i] = 1.0
        parts, j = [], 0
        for t in b:
            parts.append(e[j:j + t.numel()].reshape(t.shape))
            j += t.numel()
        cols.append(torch.cat([c.reshape(-1) for c in matvec(parts)]))
    h = torch.stack(cols, dim=1)
    x = torch.linalg.solve(h, flat_b)
    out, j = [], 0
    for t in b:
        out.append(x[j:j + t.numel()].reshape(t.shape))
        j += t.numel()
    return out


def _directional_fd(problem, direction, h=1e-3):
    vals = []
    for s in (1.0, -1.0):
        lm = [l + s * h * d for l, d in zip(problem["lam"], direction)]
        th = problem["solve_theta"](lm, problem["theta"])
        vals.append(float(problem["val_loss"](th, lm)))
    return (vals[0] - vals[1]) / (2 * h)


@pytest.mark.parametrize("group", ["bnnet", "lrnet", "eta_tilde"])
def test_ift_hypergradient_matches_finite_differences_of_the_pipeline(problem, group):
    grads = ift_hypergrad(problem["train_loss"], problem["val_loss"], problem["theta"], problem["lam"],
                          solve=_dense_solve)
    gen = torch.Generator().manual_seed(7)
    direction = [torch.randn(l.shape, generator=gen, dtype=D) * (k.startswith(group))
                 for k, l in zip(problem["keys"], problem["lam"])]
    norm = torch.sqrt(sum((d * d).sum() for d in direction))
    direction = [d / norm for d in direction]
    analytic = float(sum((g * d).sum() for g, d in zip(grads, direction)))
    numeric = _directional_fd(problem, direction)
    assert abs(analytic) > 1e-4  # the direction matters, so the comparison is informative
    assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def test_neumann_with_many_terms_converges_to_the_dense_solve(problem):
    exact = ift_hypergrad(problem["train_loss"], problem["val_loss"], problem["theta"], problem["lam"],
                          solve=_dense_solve)
    series = ift_hypergrad(problem["train_loss"], problem["val_loss"], problem["theta"], problem["lam"],
                           solve=partial(neumann, steps=300, psi=0.3))
    flat = lambda xs: torch.cat([t.reshape(-1) for t in xs])  # noqa: E731
    assert (flat(series) - flat(exact)).norm() <= 1e-6 * flat(exact).norm()
