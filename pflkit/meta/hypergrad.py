"""Meta-gradients of a validation loss with respect to hyperparameters lambda.

* `ift_hypergrad`: the implicit-function-theorem hypergradient of FedL2P Eq. 6-7 and
  Alg. 2 (Lorraine et al., 2020), given the training loss ``L_T(theta, lambda)``, the
  validation loss ``L_V(theta, lambda)`` and a fixed point ``theta*`` of ``L_T``:

      d_lambda L_V = d_lambda L_V|direct - (d_theta L_V) H^{-1} d_lambda d_theta L_T,
      H = d^2_theta L_T,

  with ``H^{-1} (d_theta L_V)`` from a separate linear solver (`pflkit.meta.linear_solve`)
  and the last product a vector-Jacobian product. The direct term is non-zero in FedL2P
  (sec. 3.2: ``d L_V / d w_bn != 0`` because beta enters the validation forward pass).
* `fomaml_plus`: the first-order meta-gradient of FedL2P App. F (Table 8): differentiate
  ``L_V`` through the last (look-ahead) step only, extended to learning rates as Eq. 9-10.
* `hf_maml_metagrad` / `fo_maml_metagrad`: the Hessian-free and first-order MAML
  meta-gradients (Per-FedAvg's HF / FO variants) that FedL2P App. C compares costs with.

Everything works on lists of tensors; callables receive lists of tensors that require
grad and must build their loss from them.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from pflkit.kernels import differentiated_twice
from pflkit.meta.conv_hvp import cheap_conv_double_backward
from pflkit.meta.linear_solve import MatVec

Tensors = Sequence[torch.Tensor]
Loss = Callable[[list[torch.Tensor], list[torch.Tensor]], torch.Tensor]
Solve = Callable[[MatVec, list[torch.Tensor]], Sequence[torch.Tensor]]

__all__ = ["ift_hypergrad", "fomaml_plus", "maml_direction", "hf_maml_metagrad", "fo_maml_metagrad", "clip_by_value",
           "leaves"]


def leaves(tensors: Tensors) -> list[torch.Tensor]:
    """Detached copies that require grad: fresh leaves of a new graph."""
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def _grads(output: torch.Tensor | Sequence[torch.Tensor], inputs: list[torch.Tensor],
           cotangents: Sequence[torch.Tensor] | None = None, *, create_graph: bool = False,
           retain_graph: bool | None = None) -> list[torch.Tensor]:
    """``torch.autograd.grad`` with zeros for unused inputs and constant outputs.

    Outputs that do not depend on anything (a gradient entry with no graph) are dropped
    together with their cotangents, so a parameter that enters a loss linearly does not
    make the vector-Jacobian product fail.
    """
    if isinstance(output, torch.Tensor):
        outs, cots = [output], None
    else:
        pairs = [(o, c) for o, c in zip(output, cotangents) if o.requires_grad]
        outs, cots = [o for o, _ in pairs], [c for _, c in pairs]
    if not outs:
        return [torch.zeros_like(x) for x in inputs]
    got = torch.autograd.grad(outs, inputs, grad_outputs=cots, allow_unused=True,
                              create_graph=create_graph, retain_graph=retain_graph)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, got)]


def ift_hypergrad(train_loss: Loss, val_loss: Loss, theta: Tensors, lam: Tensors, *,
                  solve: Solve, cheap_conv: bool = True) -> list[torch.Tensor]:
    """IFT hypergradient ``d L_V(theta*(lambda), lambda) / d lambda`` (Eq. 6-7, Alg. 2).

    Alg. 2 line 1: ``v = d_theta L_V``; lines 2-5: ``p ~= H^{-1} v`` by ``solve``
    (`pflkit.meta.linear_solve.neumann` with Q = 3, psi = 0.1 in FedL2P); output:
    ``d_lambda L_V - p d_lambda d_theta L_T``, the last term computed as the
    vector-Jacobian product of ``d_theta L_T`` (built with ``create_graph``) with ``p``.

    Cost: one graph of ``d_theta L_T`` serves the Q Hessian-vector products and the mixed
    product (Q + 1 reverse passes over it). Those passes are dominated by the second
    derivative of every convolution; with ``cheap_conv`` the graph is built with
    `pflkit.meta.conv_hvp.conv2d`, whose second derivative runs on the backward kernels
    (same values to float rounding, fewer seconds on CPU).

    Args:
        train_loss: ``L_T(theta, lambda)``; theta* should be (close to) its stationary point.
        val_loss: ``L_V(theta, lambda)``.
        theta: the fixed point theta*, one tensor per parameter tensor (detached inside).
        lam: the hyperparameters lambda (detached inside).
        solve: ``solve(matvec, b) -> x ~= H^{-1} b`` with ``matvec(u) = H u``.
        cheap_conv: build ``d_theta L_T`` with `pflkit.meta.conv_hvp.conv2d` (default) or
            with autograd's own convolution double backward (False, the earlier computation).

    Returns:
        One detached tensor per entry of ``lam``: the hypergradient.
    """
    theta, lam = leaves(theta), leaves(lam)
    n = len(theta)
    lv = val_loss(theta, lam)
    dv = _grads(lv, theta + lam)
    v, direct = dv[:n], dv[n:]
    with cheap_conv_double_backward(cheap_conv), differentiated_twice():
        lt = train_loss(theta, lam)
    dt = _grads(lt, theta, create_graph=True)

    def hvp(u: list[torch.Tensor]) -> list[torch.Tensor]:
        return [h.detach() for h in _grads(dt, theta, u, retain_graph=True)]

    p = [t.detach() for t in solve(hvp, [t.detach() for t in v])]
    mixed = _grads(dt, lam, p, retain_graph=False)
    return [(d - m).detach() for d, m in zip(direct, mixed)]


def fomaml_plus(val_loss: Loss, step: Callable[[list[torch.Tensor], list[torch.Tensor]], list[torch.Tensor]],
                theta: Tensors, lam: Tensors) -> list[torch.Tensor]:
    """First-order meta-gradient with learning rates, FedL2P's "FOMAML+" (App. F, Table 8).

    FOMAML ignores the fine-tuning trajectory except its last step; to reach the learning
    rates it uses the same trick as Eq. 9-10: the last step ``theta' = step(theta, lambda)``
    (``theta - eta(lambda) * g`` with ``g`` a detached gradient) carries the dependence on
    eta, and the meta-gradient is ``d/d lambda L_V(theta'(lambda), lambda)`` at fixed theta.

    Args:
        val_loss: ``L_V(theta, lambda)``.
        step: ``(theta, lambda) -> theta'``, the look-ahead step.
        theta: the fine-tuned parameters (detached inside: no gradient flows into them).
        lam: the hyperparameters.

    Returns:
        One detached tensor per entry of ``lam``.
    """
    theta = [t.detach() for t in theta]
    lam = leaves(lam)
    loss = val_loss(list(step(theta, lam)), lam)
    return [g.detach() for g in _grads(loss, lam)]


def maml_direction(inner_loss: Callable[[list[torch.Tensor]], torch.Tensor],
                   outer_loss: Callable[[list[torch.Tensor]], torch.Tensor], theta: Tensors, *, alpha: float,
                   hessian: str = "none", delta: float = 1e-3,
                   hessian_loss: Callable[[list[torch.Tensor]], torch.Tensor] | None = None):
    """One MAML meta-gradient and the inner loss: ``((I - alpha H(theta)) grad f_out(theta'), f_in(theta))``.

    ``theta' = theta - alpha grad f_in(theta)``. ``hessian`` says how the Hessian term is had:
    ``"none"`` drops it (first-order MAML), ``"finite_difference"`` is the Hessian-free estimate
    ``H u ~= (grad f_H(theta + delta u) - grad f_H(theta - delta u)) / (2 delta)`` (no
    second-order autograd), ``"exact"`` is double backpropagation. ``f_H`` is ``hessian_loss``,
    by default ``inner_loss``; Per-FedAvg (its Eq. 8-9) takes it on a third batch D''.
    Per-FedAvg's client step and the App. C cost benchmark both run this function.
    """
    if hessian not in ("none", "finite_difference", "exact"):
        raise ValueError(f"hessian must be 'none', 'finite_difference' or 'exact', got {hessian!r}")
    theta = leaves(theta)
    f_in = inner_loss(theta)
    g_in = _grads(f_in, theta)
    adapted = leaves([t - alpha * g for t, g in zip(theta, g_in)])
    u = [g.detach() for g in _grads(outer_loss(adapted), adapted)]
    if hessian == "none":
        return u, f_in.detach()
    f_h = hessian_loss or inner_loss
    if hessian == "exact":
        x = leaves(theta)
        with differentiated_twice():
            g = _grads(f_h(x), x, create_graph=True)
        hv = _grads(sum((a * b).sum() for a, b in zip(g, u)), x)
    else:
        plus = leaves([t + delta * d for t, d in zip(theta, u)])
        minus = leaves([t - delta * d for t, d in zip(theta, u)])
        hv = [(a - b) / (2 * delta) for a, b in zip(_grads(f_h(plus), plus), _grads(f_h(minus), minus))]
    return [(d - alpha * h).detach() for d, h in zip(u, hv)], f_in.detach()


def fo_maml_metagrad(inner_loss: Callable[[list[torch.Tensor]], torch.Tensor],
                     outer_loss: Callable[[list[torch.Tensor]], torch.Tensor], theta: Tensors, *,
                     alpha: float) -> list[torch.Tensor]:
    """First-order MAML: ``grad f_out(theta - alpha grad f_in(theta))`` (App. C baseline; `maml_direction`)."""
    return maml_direction(inner_loss, outer_loss, theta, alpha=alpha)[0]


def hf_maml_metagrad(inner_loss: Callable[[list[torch.Tensor]], torch.Tensor],
                     outer_loss: Callable[[list[torch.Tensor]], torch.Tensor], theta: Tensors, *,
                     alpha: float, delta: float = 1e-3) -> list[torch.Tensor]:
    """Hessian-free MAML meta-gradient (Per-FedAvg (HF)), the cost baseline of FedL2P App. C.

    `maml_direction` with the finite-difference Hessian-vector product of ``inner_loss``.
    """
    return maml_direction(inner_loss, outer_loss, theta, alpha=alpha, hessian="finite_difference", delta=delta)[0]


def clip_by_value(grads: Tensors, clip: float) -> list[torch.Tensor]:
    """Clamp every entry to ``[-clip, clip]`` (FedL2P sec. 4.1: "clipped by value [-1, 1]").

    ``clip = 0`` disables clipping.
    """
    if clip < 0:
        raise ValueError(f"clip_by_value: clip must be >= 0, got {clip!r}")
    if clip == 0:
        return list(grads)
    return [g.clamp(-clip, clip) for g in grads]
