"""Linear solvers for implicit differentiation: ``solve(matvec, b) -> x`` with ``A x ~= b``.

The IFT hypergradient (FedL2P Eq. 7, Alg. 2) needs ``x = H^{-1} v`` for the Hessian
``H`` of the training loss and ``v = d L_V / d theta``. ``H`` is never formed: it is
only available through Hessian-vector products. The solvers here are pure functions
of a ``matvec`` callable and a right-hand side that is a list (or tuple) of tensors,
one per parameter tensor, so they know nothing about models or losses (DESIGN.md:
the hypergradient says *what* to solve, the solver *how*).

* `neumann`: the truncated Neumann series of FedL2P Alg. 2 / Lorraine et al. (2020).
* `cg`: conjugate gradients (for symmetric positive definite ``A``), used as an
  independent check and as an option for well-conditioned problems.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from pflkit import kernels

Vector = Sequence[torch.Tensor]
MatVec = Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]

__all__ = ["neumann", "cg", "dot"]


def dot(a: Vector, b: Vector) -> torch.Tensor:
    """Inner product of two lists of tensors, accumulated in float64."""
    return sum((x.double() * y.double()).sum() for x, y in zip(a, b))


def _check_rhs(name: str, b: Vector) -> list[torch.Tensor]:
    if not isinstance(b, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in b):
        raise TypeError(f"{name}: b must be a list or tuple of tensors, got {type(b).__name__}")
    return [t.detach() for t in b]


def _check_matvec_out(name: str, out: Sequence[torch.Tensor], like: list[torch.Tensor]) -> list[torch.Tensor]:
    out = list(out)
    if len(out) != len(like) or any(o.shape != t.shape for o, t in zip(out, like)):
        raise ValueError(f"{name}: matvec returned shapes {[tuple(o.shape) for o in out]}, "
                         f"expected {[tuple(t.shape) for t in like]}")
    return [o.detach() for o in out]


def neumann(matvec: MatVec, b: Vector, *, steps: int, psi: float, scaled: bool = True) -> list[torch.Tensor]:
    """Truncated Neumann series for ``A^{-1} b`` (FedL2P Alg. 2 lines 1-5).

    With ``v_0 = p_0 = b`` and, for ``q = 1..steps``, ``v_q = v_{q-1} - psi * A v_{q-1}``,
    ``p_q = p_{q-1} + v_q``, one gets ``p = sum_{j=0}^{steps} (I - psi A)^j b``. Since
    ``A^{-1} = psi * sum_{j>=0} (I - psi A)^j`` whenever the spectral radius of
    ``I - psi A`` is below one (``0 < psi < 2 / lambda_max`` for SPD ``A``), the series
    converges to ``A^{-1} b`` as ``steps`` grows when it is multiplied by ``psi``.

    Args:
        matvec: ``u -> A u`` on lists of tensors shaped like ``b``.
        b: right-hand side (list or tuple of tensors); detached first.
        steps: Q, the number of Hessian-vector products (FedL2P: 3).
        psi: the series step (FedL2P: 0.1).
        scaled: return ``psi * p`` (the consistent approximation of ``A^{-1} b``; True)
            or ``p`` itself, exactly what Alg. 2 outputs (False). FedL2P's Alg. 2 and the
            authors' code omit the factor psi, i.e. scale the implicit term by ``1 / psi``.

    Returns:
        A list of tensors shaped like ``b``.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"neumann: steps must be an integer >= 0, got {steps!r}")
    if not (isinstance(psi, (int, float)) and psi > 0):
        raise ValueError(f"neumann: psi must be > 0, got {psi!r}")
    v = _check_rhs("neumann", b)
    p = list(v)
    for _ in range(steps):
        hv = _check_matvec_out("neumann", matvec(list(v)), v)
        # Alg. 2 lines 3-4, v <- v - psi H v; p <- p + v: one multi-tensor kernel on CUDA
        v, p = kernels.neumann_update(v, hv, p, float(psi))
    return [psi * t for t in p] if scaled else p


def cg(matvec: MatVec, b: Vector, *, steps: int, tol: float = 1e-10) -> list[torch.Tensor]:
    """Conjugate gradients for ``A x = b`` with symmetric positive definite ``A``.

    Starts from ``x = 0`` and stops after ``steps`` iterations or when the residual
    norm falls below ``tol * ||b||``. In exact arithmetic it solves an n-dimensional
    system in n steps. Scalars are computed in float64.

    Args:
        matvec: ``u -> A u`` on lists of tensors shaped like ``b``.
        b: right-hand side (list or tuple of tensors).
        steps: maximum number of iterations (matvecs).
        tol: relative residual tolerance.

    Returns:
        A list of tensors shaped like ``b``.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"cg: steps must be an integer >= 0, got {steps!r}")
    if not tol >= 0:
        raise ValueError(f"cg: tol must be >= 0, got {tol!r}")
    b = _check_rhs("cg", b)
    x = [torch.zeros_like(t) for t in b]
    r = list(b)
    d = list(r)
    rr = dot(r, r)
    stop = (tol * torch.sqrt(rr)) ** 2
    for _ in range(steps):
        if rr <= stop or rr == 0:
            break
        ad = _check_matvec_out("cg", matvec(list(d)), b)
        curvature = dot(d, ad)
        if curvature <= 0:
            raise ValueError(f"cg: the matrix is not positive definite (d^T A d = {float(curvature):.3g})")
        alpha = rr / curvature
        x = [xi + (alpha * di.double()).to(xi.dtype) for xi, di in zip(x, d)]
        r = [ri - (alpha * ai.double()).to(ri.dtype) for ri, ai in zip(r, ad)]
        rr_new = dot(r, r)
        d = [ri + ((rr_new / rr) * di.double()).to(ri.dtype) for ri, di in zip(r, d)]
        rr = rr_new
    return x
