"""FedL2P's outer problem: the losses L_T and L_V (Eq. 6-10) and one step on lambda (Alg. 1 line 10).

Everything here works on given tensors and batches: a model structure, its fine-tuned
weights theta_i, the client's statistics and the batches of the losses. Which client the
batches come from, and when, is FedL2P's business (`pflkit.algorithms.fedl2p_client`).

Where the IFT is applied (our reading of sec. 3.3): Alg. 1 line 9 fine-tunes the
pretrained model for e epochs with the current (beta, eta), detached, giving theta_i;
the paper identifies the stationary point theta*(lambda) of L_T (Eq. 9-10) with the step's
result ("theta* coincides with theta'", "a single instance of inner-loop iterations"), so
line 10 takes theta* = theta_i and applies Eq. 6-7 there with L_V on one validation batch
and L_T chosen by ``lt_mode``:

* ``"last_step"`` (default, the authors' code): Eq. 10's step *is* the last fine-tuning
  step, ``theta' = theta_{N-1} - eta(lambda) g``, ``g`` the gradient that step took (a
  constant, computed in training mode), so theta' = theta_i; Eq. 9's cross-entropy is taken
  on one fresh training batch in evaluation mode (the client's running statistics mixed by
  beta). As a function of theta = theta_i, with eta_hat = eta's current value held constant:
  ``L_T(theta, lambda) = CE_eval(f_{theta - (eta(lambda) - eta_hat) g, beta(lambda)}(x_l), y_l)``.
  Its Hessian in theta is the cross-entropy's at theta_i and its mixed derivative in eta is
  ``-H g`` per tensor: what the authors' code gets by differentiating d_theta L_T at the
  fine-tuned weights, which carry eta's graph from the last step only. With an exact
  H^{-1} the IFT term for eta_k is then ``<d L_V / d theta_k, g_k>``.
* ``"lookahead"`` (pflkit's earlier reading): one extra step from theta_i on a fresh step
  batch, both forward passes in training mode (`pflkit.meta.functional.lookahead_loss`);
  ``second_order`` differentiates through that step's gradient.

FOMAML+ (App. F) differentiates ``L_V(theta', lambda)`` through the same step instead.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from pflkit.meta.functional import Batch, Params, lookahead_loss, lookahead_step, sgd_step, validation_loss
from pflkit.meta.hypergrad import clip_by_value
from pflkit.meta.metanets import GROUPS, group_of

__all__ = ["LT_MODES", "meta_losses", "lambda_step"]

LT_MODES = ("last_step", "lookahead")


def meta_losses(model: nn.Module, names: list[str], hyper: Callable, buffers: Params, val_b: Batch, *,
                lt_mode: str, loss_b: Batch, step_b: Batch | None = None, grads: list | None = None,
                second_order: bool = False):
    """L_T, L_V and the step theta -> theta' as functions of (theta list, lambda list).

    Args:
        model, names: the network and its parameter names (the order of the theta list).
        hyper: ``lambda list -> (beta, eta)`` (Eq. 4), differentiable.
        buffers: the client's statistics after fine-tuning (copied by every loss).
        val_b: L_V's batch.
        lt_mode: ``"last_step"`` or ``"lookahead"`` (module docstring).
        loss_b: the batch of L_T's cross-entropy (Eq. 9).
        step_b: ``"lookahead"``: the batch of the extra step's gradient.
        grads: ``"last_step"``: the last fine-tuning step's gradient (None: no step was
            taken, then L_T does not depend on eta).
        second_order: ``"lookahead"`` only: differentiate through the step's gradient.

    Returns:
        ``(train_loss, val_loss, step)``; theta is theta_i, the fine-tuned weights.
    """
    def unpack(th, lm):
        return dict(zip(names, th)), hyper(lm)

    def val_loss(th, lm):
        params, (beta, _) = unpack(th, lm)
        return validation_loss(model, params, buffers, val_b, beta)

    if lt_mode == "last_step":
        def last(th, eta):
            # (eta(lambda) - eta_hat) is zero in value, so theta' = theta_i, with d theta' / d eta_k = -g_k
            g = grads if grads is not None else [torch.zeros_like(t) for t in th]
            return [x.detach() for x in g], eta - eta.detach()

        def train_loss(th, lm):
            params, (beta, eta) = unpack(th, lm)
            g, shift = last(th, eta)
            return lookahead_loss(model, params, buffers, None, loss_b, shift, beta, grads=g, training=False)

        def step(th, lm):
            params, (_, eta) = unpack(th, lm)
            g, shift = last(th, eta)
            return list(sgd_step(params, g, shift).values())
    else:
        def train_loss(th, lm):
            params, (beta, eta) = unpack(th, lm)
            return lookahead_loss(model, params, buffers, step_b, loss_b, eta, beta, second_order=second_order)

        def step(th, lm):
            params, (beta, eta) = unpack(th, lm)
            return list(lookahead_step(model, params, buffers, step_b, eta, beta).values())

    return train_loss, val_loss, step


def lambda_step(lam: dict[str, torch.Tensor], grads: Sequence[torch.Tensor], zeta: Sequence[float],
                clip: float) -> dict[str, torch.Tensor]:
    """Alg. 1 line 10: ``lambda <- lambda - zeta * clip(d L_V / d lambda)``, detached.

    Args:
        lam: the flat meta-parameters {w_bn, w_lr, eta_tilde}.
        grads: their hypergradients (Eq. 6-7 or FOMAML+), in ``lam``'s key order.
        zeta: one SGD rate per group, in the order of ``GROUPS`` (w_bn, w_lr, eta_tilde).
        clip: clip every entry by value to ``[-clip, clip]`` first (sec. 4.1; 0: no clipping).
    """
    rates = dict(zip(GROUPS, zeta))
    clipped = clip_by_value(grads, clip)
    return {k: (v - rates[group_of(k)] * g).detach() for (k, v), g in zip(lam.items(), clipped)}
