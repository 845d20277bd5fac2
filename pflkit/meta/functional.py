"""Functional fine-tuning with layer-wise learning rates and FedL2P's losses (sec. 3.3).

The model's parameters and buffers are plain dicts of tensors passed through
`torch.func.functional_call`, so a fine-tuned model is a value, not a mutated module,
and the same module object serves every client. ``eta`` is a (P,) tensor, one learning
rate per parameter tensor in ``named_parameters`` order (`pflkit.meta.metanets`);
``beta`` is None (leave the BN layers as they are), a float, or a (B,) tensor, one
mixing weight per `MixedBatchNorm` layer (Eq. 2).

* `finetune`: Alg. 1 line 9, e epochs of SGD where tensor k steps with eta_k (no graph);
  it can hand back its last step (weights before it, batch, gradient) for L_T.
* `lookahead_loss`: the training loss of Eq. 9-10, explicit in eta through one step
  ``theta' = theta - eta * g``: ``g`` either the gradient of a step batch at theta or a
  given constant (the last fine-tuning step's, `pflkit.meta.objectives`' default), the
  outer forward pass in training or evaluation mode.
* `validation_loss`: L_V of sec. 3.3, explicit in beta through the BN layers.

How beta's gradient flows (our reading of Eq. 2 in both BN modes): in training mode a
BN layer normalizes with ``(1 - beta) mu_pt + beta mu_batch`` (and the same for the
variance), so beta is differentiable through the current batch's statistics; in
evaluation mode (L_V, L_T by default, test) with ``(1 - beta) mu_pt + beta mu_client``,
the client's running statistics (reset to 0 / 1 or set by one pass over its train split,
`pflkit.models.mixed_bn`, then tracked during fine-tuning). Passes that only compute a
loss for a hypergradient work on copies of the buffers, so they never move the client's
running statistics.
"""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from pflkit import kernels
from pflkit.errors import Diverged
from pflkit.models.mixed_bn import mixed_bn_layers, set_bn_mode

log = logging.getLogger(__name__)

Params = dict[str, torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]
Beta = float | torch.Tensor | None

__all__ = ["model_tensors", "load_tensors", "using_beta", "forward", "sgd_step", "finetune", "lookahead_step",
           "lookahead_loss", "validation_loss"]


def model_tensors(model: nn.Module) -> tuple[Params, Params]:
    """Detached copies of the model's parameters and of all its buffers (non-persistent included)."""
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    return params, buffers


@torch.no_grad()
def load_tensors(model: nn.Module, params: Params, buffers: Params | None = None) -> nn.Module:
    """Copy ``params`` (and ``buffers``) into the module in place; returns it."""
    for name, value in params.items():
        model.get_parameter(name).copy_(value)
    for name, value in (buffers or {}).items():
        model.get_buffer(name).copy_(value)
    return model


@contextmanager
def using_beta(model: nn.Module, beta: Beta):
    """Set every `MixedBatchNorm` layer to ``mode="mixed"`` with ``beta`` (Eq. 2); restore after.

    ``beta`` None leaves the layers untouched; a float or 0-d tensor applies to every layer;
    a (B,) tensor gives one value per layer (differentiable).
    """
    if beta is None:
        yield
        return
    layers = mixed_bn_layers(model)
    if not layers:
        raise ValueError("using_beta: beta given but the model has no MixedBatchNorm layer (call convert_bn)")
    saved = [(layer.mode, layer.beta) for layer in layers]
    if isinstance(beta, torch.Tensor) and beta.dim() == 1:
        if beta.numel() != len(layers):
            raise ValueError(f"using_beta: {beta.numel()} betas for {len(layers)} BN layers")
        set_bn_mode(model, "mixed", list(beta.unbind()))
    else:
        set_bn_mode(model, "mixed", beta)
    try:
        yield
    finally:
        for layer, (mode, b) in zip(layers, saved):
            layer.mode, layer.beta = mode, b


def forward(model: nn.Module, params: Params, buffers: Params, x: torch.Tensor, *, beta: Beta = None,
            training: bool) -> torch.Tensor:
    """``f_{theta, beta}(x)`` with the given tensors; in training mode BN layers update the
    client statistics inside ``buffers`` in place."""
    with using_beta(model, beta):
        model.train(training)
        return functional_call(model, (params, buffers), (x,))


def _detach(beta: Beta) -> Beta:
    return beta.detach() if isinstance(beta, torch.Tensor) else beta


def _check_eta(eta: torch.Tensor, params: Params) -> None:
    if not isinstance(eta, torch.Tensor) or eta.dim() != 1 or eta.numel() != len(params):
        shape = tuple(eta.shape) if isinstance(eta, torch.Tensor) else type(eta).__name__
        raise ValueError(f"eta must be a 1-D tensor with one learning rate per parameter tensor "
                         f"({len(params)}), got {shape}")


def sgd_step(params: Params, grads: Sequence[torch.Tensor], eta: torch.Tensor) -> Params:
    """``theta_k - eta_k * g_k`` for every tensor k (Eq. 10; differentiable in theta, g and eta).

    Runs ``pflkit.kernels.layerwise_sgd_step`` (one multi-tensor Triton launch on CUDA, the
    PyTorch reference elsewhere).
    """
    _check_eta(eta, params)
    return dict(zip(params, kernels.layerwise_sgd_step(list(params.values()), list(grads), eta)))


def _ce_grads(model, params: Params, buffers: Params, batch: Batch, create_graph: bool):
    """Cross-entropy of ``batch`` in training mode and its gradient w.r.t. ``params``."""
    xb, yb = batch
    loss = F.cross_entropy(functional_call(model, (params, buffers), (xb,)), yb)
    got = torch.autograd.grad(loss, list(params.values()), create_graph=create_graph, allow_unused=True)
    return loss, [torch.zeros_like(p) if g is None else g for p, g in zip(params.values(), got)]


def finetune(model: nn.Module, params: Params, buffers: Params, batches: Iterable[Batch], eta: torch.Tensor,
             beta: Beta = None, *, skip_nonfinite: bool = False, where: str = "fine-tuning",
             keep_last: bool = False) -> tuple[Params, dict]:
    """Fine-tune ``params`` with per-tensor learning rates ``eta`` (Alg. 1 line 9, sec. 3.2).

    Plain SGD, one step per batch: ``theta_k <- theta_k - eta_k * grad_k CE``; BN layers in
    training mode mix the batch statistics with the pretrained ones by ``beta`` and track
    the client's running statistics in ``buffers`` (updated in place). Nothing keeps a graph
    (beta and eta are detached), as in the authors' code for every step but the last.

    Args:
        model: the module structure (BN layers converted if beta is given).
        params: starting parameters (not modified).
        buffers: running statistics; the client's are updated in place.
        batches: training batches (inputs, labels), e.g. e shuffled epochs.
        eta: (P,) learning rates.
        beta: BN mixing weights (see `using_beta`).
        skip_nonfinite: skip a batch whose loss is NaN/inf (the authors' code) instead of
            raising `pflkit.errors.Diverged` (the pflkit convention).
        where: names the run in error messages.
        keep_last: also return the last step taken, ``stats["last"] = {"params": weights
            before it, "batch": its batch, "grads": its gradient (list, detached)}``, or None
            when no step was taken; the default L_T of FedL2P differentiates through it.

    Returns:
        ``(params, {"loss": mean training loss, "steps": steps taken, "skipped": batches skipped})``.
    """
    _check_eta(eta, params)
    eta, beta = eta.detach(), _detach(beta)
    rates = eta.tolist()
    cur = {n: t.detach() for n, t in params.items()}
    total, seen, steps, skipped = 0.0, 0, 0, 0
    last = None
    with using_beta(model, beta):
        model.train()
        for xb, yb in batches:
            leaves = {n: t.detach().requires_grad_(True) for n, t in cur.items()}
            # a skipped batch must not leave its statistics in the running estimates
            saved = {n: b.clone() for n, b in buffers.items()} if skip_nonfinite else None
            loss, grads = _ce_grads(model, leaves, buffers, (xb, yb), create_graph=False)
            value = float(loss.detach())
            if not math.isfinite(value):
                if not skip_nonfinite:
                    raise Diverged(f"non-finite loss ({value}) in {where}")
                log.warning("%s: skipping a batch with loss %s", where, value)
                for n, b in saved.items():
                    buffers[n].copy_(b)
                skipped += 1
                continue
            if keep_last:
                last = {"params": cur, "batch": (xb, yb), "grads": [g.detach() for g in grads]}
            with torch.no_grad():
                # the very op of torch.optim.SGD (p + (-lr) g), so that eta = lr everywhere
                # reproduces the FT baselines bit for bit
                cur = {n: torch.add(p, g, alpha=-e) for (n, p), g, e in zip(cur.items(), grads, rates)}
            total, seen, steps = total + value * len(yb), seen + len(yb), steps + 1
    stats = {"loss": total / max(seen, 1), "steps": steps, "skipped": skipped}
    if keep_last:
        stats["last"] = last
    return cur, stats


def lookahead_step(model: nn.Module, params: Params, buffers: Params, step_batch: Batch | None, eta: torch.Tensor,
                   beta: Beta = None, *, second_order: bool = False,
                   grads: Sequence[torch.Tensor] | None = None) -> Params:
    """Eq. 10: ``theta' = theta - eta(lambda) * grad_theta CE(f_{theta, beta}(x_s), y_s)``.

    The gradient is taken in training mode on copies of the buffers. With
    ``second_order=False`` it is detached (a constant): theta' is then differentiable in
    theta only through the identity term and exactly differentiable in eta. ``grads``
    gives that constant gradient directly (e.g. the last fine-tuning step's; then
    ``step_batch`` is unused and ``second_order`` must be False).
    """
    _check_eta(eta, params)
    if grads is not None:
        if second_order:
            raise ValueError("lookahead_step: a given gradient is a constant; second_order needs a step batch")
        return sgd_step(params, [g.detach() for g in grads], eta)
    buffers = {n: b.clone() for n, b in buffers.items()}
    # The gradient needs leaves to differentiate; with a constant gradient, fresh detached
    # ones, so that theta itself may come without a graph (FOMAML+).
    src = {n: p if (second_order and p.requires_grad) else p.detach().requires_grad_(True)
           for n, p in params.items()}
    with using_beta(model, beta if second_order else _detach(beta)):
        model.train()
        _, grads = _ce_grads(model, src, buffers, step_batch, create_graph=second_order)
    if not second_order:
        grads = [g.detach() for g in grads]
    return sgd_step(params, grads, eta)


def lookahead_loss(model: nn.Module, params: Params, buffers: Params, step_batch: Batch | None, loss_batch: Batch,
                   eta: torch.Tensor, beta: Beta = None, *, second_order: bool = False,
                   grads: Sequence[torch.Tensor] | None = None, training: bool = True) -> torch.Tensor:
    """L_T(theta, lambda) of Eq. 9-10: the loss after one SGD step.

    ``theta'`` is `lookahead_step` (Eq. 10) and ``L_T = CE(f_{theta', beta}(x_l), y_l)``
    (Eq. 9), so L_T depends explicitly on eta (through theta') and on beta (through the
    BN layers). The expectations over P_T are estimated on training batches: the step
    batch (or the given gradient ``grads``) and the loss batch.

    Args:
        model, params, buffers: the network (buffers are copied: no statistics move).
        step_batch: batch of the step's gradient (training mode); None with ``grads``.
        loss_batch: batch of the outer cross-entropy.
        eta: (P,) learning rates (differentiable).
        beta: BN mixing weights (differentiable).
        second_order: differentiate through the step's gradient (exact Eq. 10). False
            treats it as a constant, as the authors' code does for the last fine-tuning step:
            L_T keeps its exact value and its exact derivative in eta, while its Hessian in
            theta drops the third-order term (and the cost of third derivatives).
        grads: the step's gradient as a constant (the last fine-tuning step's in FedL2P's
            default L_T), instead of one computed on ``step_batch``.
        training: BN mode of the outer forward pass: True (batch statistics mixed by beta)
            or False (the client's running statistics mixed by beta, as the authors' code).
    """
    ahead = lookahead_step(model, params, buffers, step_batch, eta, beta, second_order=second_order, grads=grads)
    buffers = {n: b.clone() for n, b in buffers.items()}
    xb, yb = loss_batch
    return F.cross_entropy(forward(model, ahead, buffers, xb, beta=beta, training=training), yb)


def validation_loss(model: nn.Module, params: Params, buffers: Params, batch: Batch, beta: Beta = None) -> torch.Tensor:
    """L_V(theta, lambda) = CE(f_{theta, beta(lambda)}(x_v), y_v) in evaluation mode (sec. 3.3)."""
    xb, yb = batch
    return F.cross_entropy(forward(model, params, buffers, xb, beta=beta, training=False), yb)
