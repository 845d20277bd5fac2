"""Neumann series and conjugate gradients against dense linear algebra."""
import pytest
import torch

from pflkit.meta.linear_solve import cg, neumann


def _spd(n: int, seed: int, cond: float = 10.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    eig = torch.linspace(1.0, cond, n, dtype=torch.float64)
    return q @ torch.diag(eig) @ q.T


def _blocks(vec: torch.Tensor, shapes):
    out, i = [], 0
    for s in shapes:
        n = int(torch.tensor(s).prod())
        out.append(vec[i:i + n].reshape(s))
        i += n
    return out


SHAPES = [(2, 3), (4,), (1, 1, 2)]  # 12 unknowns split over three "parameter tensors"


def _problem(seed=0, cond=10.0):
    a = _spd(12, seed, cond)
    b = torch.randn(12, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)

    def matvec(u):
        return _blocks(a @ torch.cat([t.reshape(-1) for t in u]), SHAPES)

    return a, b, matvec


def _flat(xs):
    return torch.cat([t.reshape(-1) for t in xs])


def test_neumann_converges_to_the_inverse_with_many_terms():
    a, b, matvec = _problem()
    exact = torch.linalg.solve(a, b)
    psi = 1.0 / 10.0  # eigenvalues in [1, 10]: spectral radius of I - psi A is 0.9
    x = neumann(matvec, _blocks(b, SHAPES), steps=400, psi=psi)
    assert [t.shape for t in x] == [torch.Size(s) for s in SHAPES]
    torch.testing.assert_close(_flat(x), exact, atol=1e-12, rtol=1e-10)
    few = _flat(neumann(matvec, _blocks(b, SHAPES), steps=3, psi=psi))
    assert (few - exact).norm() > 1e-2  # three terms are only an approximation


def test_neumann_with_q_terms_is_the_truncated_series():
    a, b, matvec = _problem(seed=3)
    psi, q = 0.1, 3
    m = torch.eye(12, dtype=torch.float64) - psi * a
    series = sum(torch.linalg.matrix_power(m, j) @ b for j in range(q + 1))
    unscaled = _flat(neumann(matvec, _blocks(b, SHAPES), steps=q, psi=psi, scaled=False))
    scaled = _flat(neumann(matvec, _blocks(b, SHAPES), steps=q, psi=psi))
    torch.testing.assert_close(unscaled, series, atol=1e-12, rtol=1e-12)  # Alg. 2's p as printed
    torch.testing.assert_close(scaled, psi * series, atol=1e-12, rtol=1e-12)


def test_neumann_zero_steps_returns_the_right_hand_side():
    _, b, matvec = _problem()
    out = neumann(matvec, _blocks(b, SHAPES), steps=0, psi=0.5, scaled=False)
    torch.testing.assert_close(_flat(out), b)


def test_cg_solves_an_spd_system_in_n_steps():
    a, b, matvec = _problem(seed=5, cond=100.0)
    x = cg(matvec, tuple(_blocks(b, SHAPES)), steps=40, tol=1e-14)
    torch.testing.assert_close(_flat(x), torch.linalg.solve(a, b), atol=1e-9, rtol=1e-9)


def test_cg_rejects_an_indefinite_matrix():
    a, b, _ = _problem()
    a = a - 5.5 * torch.eye(12, dtype=torch.float64)  # eigenvalues in [-4.5, 4.5]
    with pytest.raises(ValueError, match="positive definite"):
        cg(lambda u: [a @ u[0]], [b], steps=20)


@pytest.mark.parametrize("kwargs, match", [
    ({"steps": -1, "psi": 0.1}, "steps"),
    ({"steps": 2, "psi": 0.0}, "psi"),
])
def test_neumann_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        neumann(lambda u: u, [torch.ones(2)], **kwargs)


def test_solvers_reject_a_bare_tensor():
    with pytest.raises(TypeError, match="list or tuple"):
        neumann(lambda u: u, torch.ones(2), steps=1, psi=0.1)
    with pytest.raises(TypeError, match="list or tuple"):
        cg(lambda u: u, torch.ones(2), steps=1)


def test_matvec_with_wrong_shapes_is_reported():
    with pytest.raises(ValueError, match="matvec returned"):
        neumann(lambda u: [torch.ones(3)], [torch.ones(2)], steps=1, psi=0.1)
