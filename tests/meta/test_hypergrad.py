"""IFT hypergradient (Eq. 6-7, Alg. 2) against closed forms, dense inverses and finite differences."""
from functools import partial

import pytest
import torch

from pflkit.meta.hypergrad import clip_by_value, fo_maml_metagrad, fomaml_plus, hf_maml_metagrad, ift_hypergrad
from pflkit.meta.linear_solve import cg, neumann

D = torch.float64


# --- ridge regression: theta*(lambda) in closed form -------------------------------------------

def _ridge(seed=0, n=30, nv=20, d=5):
    g = torch.Generator().manual_seed(seed)
    x, xv = torch.randn(n, d, generator=g, dtype=D), torch.randn(nv, d, generator=g, dtype=D)
    w = torch.randn(d, generator=g, dtype=D)
    y, yv = x @ w + 0.3 * torch.randn(n, generator=g, dtype=D), xv @ w + 0.3 * torch.randn(nv, generator=g, dtype=D)
    # lambda = (log of the ridge weight of coordinates 0-2, of coordinates 3-4, a weight that
    # enters only the validation loss): three hyperparameters, one with a direct term only.
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0], dtype=D)

    def reg(lam):
        return torch.exp(lam[0]) * mask + torch.exp(lam[1]) * (1 - mask)

    def train_loss(theta, lam):
        t = theta[0]
        return 0.5 * ((x @ t - y) ** 2).mean() + 0.5 * (reg(lam[0]) * t * t).sum()

    def val_loss(theta, lam):
        return 0.5 * ((xv @ theta[0] - yv) ** 2).mean() + 0.1 * (lam[0][2] - 0.3) ** 2 + 0.05 * (lam[0][0] ** 2)

    def solve_theta(lam):
        h = x.T @ x / n + torch.diag(reg(lam))
        return torch.linalg.solve(h, x.T @ y / n)

    def hessian(lam):
        return x.T @ x / n + torch.diag(reg(lam))

    return train_loss, val_loss, solve_theta, hessian, reg, (xv, yv, nv)


LAM = torch.tensor([-0.5, 0.7, 0.2], dtype=D)


def _exact_ridge_hypergrad():
    train_loss, val_loss, solve_theta, hessian, reg, (xv, yv, nv) = _ridge()
    theta = solve_theta(LAM)
    h = hessian(LAM)
    # d theta*/d lambda = -H^{-1} d_lambda grad_theta L_T; grad_theta L_T has reg(lam) * theta.
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0], dtype=D)
    dgrad = torch.stack([torch.exp(LAM[0]) * mask * theta, torch.exp(LAM[1]) * (1 - mask) * theta,
                         torch.zeros(5, dtype=D)], dim=1)
    dtheta = -torch.linalg.solve(h, dgrad)
    gv = xv.T @ (xv @ theta - yv) / nv
    direct = torch.tensor([0.1 * LAM[0], 0.0, 0.2 * (LAM[2] - 0.3)], dtype=D)
    return theta, direct + gv @ dtheta


def test_ift_with_an_exact_solve_matches_the_closed_form_and_finite_differences():
    train_loss, val_loss, solve_theta, _, _, _ = _ridge()
    theta, expected = _exact_ridge_hypergrad()
    got = ift_hypergrad(train_loss, val_loss, [theta], [LAM], solve=partial(cg, steps=50, tol=1e-15))[0]
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-10)
    h = 1e-6
    for i in range(3):
        e = torch.zeros(3, dtype=D)
        e[i] = h
        f = [float(val_loss([solve_theta(LAM + s * e)], [LAM + s * e])) for s in (1, -1)]
        assert abs((f[0] - f[1]) / (2 * h) - float(got[i])) < 1e-7


def test_ift_neumann_converges_with_many_terms_and_q3_is_the_truncated_series():
    train_loss, val_loss, _, hessian, _, (xv, yv, nv) = _ridge()
    theta, expected = _exact_ridge_hypergrad()
    psi = 0.1  # the Hessian's eigenvalues are below 2 / psi here
    h = hessian(LAM)
    assert float(torch.linalg.eigvalsh(h).max()) < 2 / psi
    many = ift_hypergrad(train_loss, val_loss, [theta], [LAM], solve=partial(neumann, steps=3000, psi=psi))[0]
    torch.testing.assert_close(many, expected, atol=1e-10, rtol=1e-8)
    # Q = 3, psi = 0.1, as printed in Alg. 2 (no factor psi): output = direct - p^T d_lambda grad L_T
    got = ift_hypergrad(train_loss, val_loss, [theta], [LAM],
                        solve=partial(neumann, steps=3, psi=psi, scaled=False))[0]
    gv = xv.T @ (xv @ theta - yv) / nv
    m = torch.eye(5, dtype=D) - psi * h
    p = sum(torch.linalg.matrix_power(m, j) @ gv for j in range(4))
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0], dtype=D)
    mixed = torch.stack([torch.exp(LAM[0]) * mask * theta, torch.exp(LAM[1]) * (1 - mask) * theta,
                         torch.zeros(5, dtype=D)], dim=1)
    direct = torch.tensor([0.1 * LAM[0], 0.0, 0.2 * (LAM[2] - 0.3)], dtype=D)
    torch.testing.assert_close(got, direct - p @ mixed, atol=1e-12, rtol=1e-10)
    assert (got - expected).abs().max() > 1e-3  # the truncated, unscaled series is not the exact answer


def test_ift_direct_term_only_when_theta_does_not_enter_validation():
    train_loss, _, solve_theta, _, _, _ = _ridge()
    theta = solve_theta(LAM)

    def val_loss(th, lam):
        return (lam[0] ** 2).sum() + 0.0 * th[0].sum()

    got = ift_hypergrad(train_loss, val_loss, [theta], [LAM], solve=partial(cg, steps=20))[0]
    torch.testing.assert_close(got, 2 * LAM)


# --- FOMAML+ and the MAML baselines of App. C ---------------------------------------------------

def test_fomaml_plus_differentiates_the_last_step_only():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(4, generator=g, dtype=D), torch.randn(4, generator=g, dtype=D)
    theta = [torch.randn(4, generator=g, dtype=D)]
    grad_at_theta = 2 * (theta[0] - a)  # gradient of the "training loss" |theta - a|^2, detached

    def step(th, lam):
        return [th[0] - lam[0] * grad_at_theta]

    def val_loss(th, lam):
        return ((th[0] - b) ** 2).sum() + lam[1] ** 2

    lam = [torch.tensor(0.1, dtype=D), torch.tensor(0.5, dtype=D)]
    got = fomaml_plus(val_loss, step, theta, lam)
    ahead = theta[0] - 0.1 * grad_at_theta
    assert float(got[0]) == pytest.approx(float(-2 * (ahead - b) @ grad_at_theta), rel=1e-12)
    assert float(got[1]) == pytest.approx(1.0)


def _maml_problem():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(6, 3, generator=g, dtype=D)
    ya = torch.randn(6, generator=g, dtype=D)
    b = torch.randn(5, 3, generator=g, dtype=D)
    yb = torch.randn(5, generator=g, dtype=D)

    def inner(th):
        return (torch.tanh(a @ th[0]) - ya).pow(2).mean()

    def outer(th):
        return (torch.tanh(b @ th[0]) - yb).pow(2).mean()

    return inner, outer, [torch.randn(3, generator=g, dtype=D)]


def test_hf_maml_matches_second_order_maml():
    inner, outer, theta = _maml_problem()
    alpha = 0.3
    t = theta[0].clone().requires_grad_(True)
    (gi,) = torch.autograd.grad(inner([t]), t, create_graph=True)
    (exact,) = torch.autograd.grad(outer([t - alpha * gi]), t)
    hf = hf_maml_metagrad(inner, outer, theta, alpha=alpha, delta=1e-5)[0]
    torch.testing.assert_close(hf, exact, atol=1e-8, rtol=1e-6)
    fo = fo_maml_metagrad(inner, outer, theta, alpha=alpha)[0]
    assert (fo - exact).abs().max() > 1e-4  # first order drops the Hessian term


def test_clip_by_value():
    out = clip_by_value([torch.tensor([-3.0, 0.5, 2.0])], 1.0)[0]
    assert out.tolist() == [-1.0, 0.5, 1.0]
    assert clip_by_value([torch.tensor([5.0])], 0.0)[0].item() == 5.0
    with pytest.raises(ValueError):
        clip_by_value([torch.tensor([1.0])], -1.0)
