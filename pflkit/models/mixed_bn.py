"""Batch norm whose statistics mix the pretrained and the client's (FedL2P Eq. 2).

`convert_bn` swaps every BatchNorm layer of any model for a `MixedBatchNorm`
that keeps the state-dict keys of the original (``weight``, ``bias``,
``running_mean``, ``running_var``, ``num_batches_tracked``: the *pretrained*
statistics) and adds two non-persistent buffers, ``client_mean`` and
``client_var``: the client's running statistics. The fine-tuning baselines of
FedL2P sec. 4.1.2 are modes of this layer:

* FT (BN G) = ``mode="mixed"``, beta = 0: the pretrained statistics throughout;
* FT (BN C) = ``mode="mixed"``, beta = 1: batch statistics while training (the
  client's running statistics track them), the client's statistics at test time;
* FT (BN I) = ``mode="batch"``: the incoming batch's statistics, also at test time;
* FedL2P = ``mode="mixed"`` with beta per layer from BNNet.

Where the client's running statistics start before fine-tuning re-estimates them
(`start_client_stats`, ``CLIENT_STATS_INIT``):

* ``"reset"`` (the default of FedL2P and of FT (BN C)): mean 0, variance 1, as the
  authors' code resets a BN layer's running estimates after loading the pretrained
  model (the pretrained ones are kept aside for Eq. 2); fine-tuning then tracks them
  with momentum 0.1 (`reset_client_stats`);
* ``"pass"``: the exact moments of one forward pass of the client's train split through
  the pretrained model (`init_client_stats`), an earlier pflkit reading of Alg. 1 line 6
  that gives evaluation with beta > 0 a warm estimate even after few steps.

Alg. 1 line 6's forward pass itself (the input of BNNet, Eq. 3) is made either way.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Sequence

import torch
from torch import nn

from pflkit import kernels

FT_MODES = {"client": "FT (BN C)", "global": "FT (BN G)", "batch": "FT (BN I)"}
CLIENT_STATS_INIT = ("reset", "pass")


class MixedBatchNorm(nn.Module):
    """A BatchNorm layer normalizing with beta-mixed statistics (Eq. 2)."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm):
        super().__init__()
        if not bn.track_running_stats:
            raise ValueError("MixedBatchNorm needs a BatchNorm layer that tracks running statistics")
        self.num_features, self.eps = bn.num_features, bn.eps
        self.momentum = 0.1 if bn.momentum is None else bn.momentum
        self.weight = bn.weight
        self.bias = bn.bias
        self.register_buffer("running_mean", bn.running_mean.detach().clone())
        self.register_buffer("running_var", bn.running_var.detach().clone())
        self.register_buffer("num_batches_tracked", bn.num_batches_tracked.detach().clone())
        self.register_buffer("client_mean", bn.running_mean.detach().clone(), persistent=False)
        self.register_buffer("client_var", bn.running_var.detach().clone(), persistent=False)
        self.mode = "mixed"
        self.beta: float | torch.Tensor = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.mixed_batch_norm(
            x, self.running_mean, self.running_var, self.client_mean, self.client_var,
            self.beta, self.weight, self.bias, self.training, self.momentum, self.eps, self.mode,
        )

    def extra_repr(self) -> str:
        beta = self.beta if isinstance(self.beta, float) else "tensor"
        return f"{self.num_features}, mode={self.mode}, beta={beta}"


def convert_bn(model: nn.Module) -> nn.Module:
    """Replace every BatchNorm layer of ``model`` in place by a `MixedBatchNorm`.

    Parameters are shared (not copied), so optimizers and state dicts keep working.
    Returns the model for chaining; converting twice is a no-op.
    """
    for name, child in list(model.named_children()):
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            setattr(model, name, MixedBatchNorm(child))
        else:
            convert_bn(child)
    return model


def mixed_bn_layers(model: nn.Module) -> list[MixedBatchNorm]:
    """The model's `MixedBatchNorm` layers in forward-definition order."""
    return [m for m in model.modules() if isinstance(m, MixedBatchNorm)]


def set_bn_mode(model: nn.Module, mode: str, beta: float | Sequence | torch.Tensor | None = None) -> None:
    """Set every mixed BN layer to a fine-tuning mode.

    Args:
        model: a model passed through `convert_bn`.
        mode: ``"global"`` (FT BN G), ``"client"`` (FT BN C), ``"batch"`` (FT BN I) or
            ``"mixed"`` (FedL2P; needs ``beta``).
        beta: for ``"mixed"``: one value for all layers, or one value (float, 0-d or
            per-channel tensor) per BN layer.
    """
    layers = mixed_bn_layers(model)
    if not layers:
        raise ValueError("set_bn_mode: the model has no MixedBatchNorm layer; call convert_bn first")
    if mode in ("global", "client"):
        betas = [0.0 if mode == "global" else 1.0] * len(layers)
        mode = "mixed"
    elif mode == "batch":
        betas = [0.0] * len(layers)
    elif mode == "mixed":
        if beta is None:
            raise ValueError("set_bn_mode: mode 'mixed' needs beta")
        if isinstance(beta, (int, float)) or (isinstance(beta, torch.Tensor) and beta.dim() == 0):
            betas = [beta] * len(layers)
        else:
            betas = list(beta)
            if len(betas) != len(layers):
                raise ValueError(f"set_bn_mode: got {len(betas)} betas for {len(layers)} BN layers")
    else:
        raise ValueError(f"set_bn_mode: unknown mode {mode!r}; use global, client, batch or mixed")
    for layer, b in zip(layers, betas):
        layer.mode = mode
        layer.beta = float(b) if isinstance(b, (int, float)) else b


@contextmanager
def pretrained_eval(model: nn.Module):
    """Inside the block: evaluation mode with the pretrained BN statistics (beta = 0).

    The state in which FedL2P Alg. 1 line 6 passes the client's data through the pretrained
    model. Every mixed BN layer's mode and beta and the model's training flag are restored on
    exit; a model without mixed BN layers is only put in evaluation mode.
    """
    layers = mixed_bn_layers(model)
    saved = [(layer.mode, layer.beta) for layer in layers]
    was_training = model.training
    if layers:
        set_bn_mode(model, "global")
    model.eval()
    try:
        yield model
    finally:
        for layer, (mode, beta) in zip(layers, saved):
            layer.mode, layer.beta = mode, beta
        model.train(was_training)


def pretrained_pass(model: nn.Module, batches: Iterable[torch.Tensor], layers: Sequence[nn.Module],
                    hook_for: Callable[[int], Callable]) -> None:
    """One forward pass of ``batches`` under `pretrained_eval`, ``hook_for(k)`` watching ``layers[k]``.

    The hooks (``forward_hook(module, inputs, output)``) accumulate whatever statistics the
    caller needs; they are removed afterwards, even when a batch fails.
    """
    handles = [layer.register_forward_hook(hook_for(k)) for k, layer in enumerate(layers)]
    try:
        with pretrained_eval(model):
            for x in batches:
                model(x)
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def bn_input_stats(model: nn.Module, batches: Iterable[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-channel mean and unbiased variance of every mixed BN layer's input.

    One forward pass of ``batches`` through the model in evaluation mode with the
    pretrained statistics (beta = 0), as in FedL2P Alg. 1 line 6. Sums are accumulated
    in float64 so the result is exact for the whole dataset, not a running average.
    """
    layers = mixed_bn_layers(model)
    if not layers:
        raise ValueError("bn_input_stats: the model has no MixedBatchNorm layer; call convert_bn first")
    sums = [None] * len(layers)

    def hook_for(k):
        def hook(module, inputs, output):
            x = inputs[0].detach().double()
            dims = [0] + list(range(2, x.dim()))
            n = x.numel() // x.shape[1]
            s, ss = x.sum(dim=dims), (x * x).sum(dim=dims)
            if sums[k] is None:
                sums[k] = [s, ss, n]
            else:
                sums[k][0] += s
                sums[k][1] += ss
                sums[k][2] += n
        return hook

    pretrained_pass(model, batches, layers, hook_for)
    out = []
    for k, entry in enumerate(sums):
        if entry is None:
            raise ValueError("bn_input_stats: no batch reached the model")
        s, ss, n = entry
        mean = s / n
        var = (ss - n * mean * mean) / max(n - 1, 1)
        out.append((mean.float(), var.clamp_min(0).float()))
    return out


def init_client_stats(model: nn.Module, batches: Iterable[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Set each layer's client statistics from one pass over the client's data.

    Returns the statistics (also the input of FedL2P's Eq. 3).
    """
    stats = bn_input_stats(model, batches)
    for layer, (mean, var) in zip(mixed_bn_layers(model), stats):
        layer.client_mean.copy_(mean)
        layer.client_var.copy_(var)
    return stats


@torch.no_grad()
def reset_client_stats(model: nn.Module) -> None:
    """Set every mixed BN layer's client statistics to mean 0 and variance 1.

    What the authors' code does before fine-tuning (their BN layer's ``reset_running_stats``
    after the pretrained statistics are copied aside); the pretrained statistics of Eq. 2
    are untouched.
    """
    for layer in mixed_bn_layers(model):
        layer.client_mean.zero_()
        layer.client_var.fill_(1.0)


def start_client_stats(model: nn.Module, how: str, batches_fn) -> None:
    """Where the client's running statistics start before fine-tuning (see the module docstring).

    Args:
        model: a model passed through `convert_bn`.
        how: ``"reset"`` (mean 0 / variance 1, the authors' code) or ``"pass"`` (one pass
            over the client's data, `init_client_stats`).
        batches_fn: ``() -> iterable of input batches`` of the client's train split; only
            called for ``"pass"``.
    """
    if how == "reset":
        reset_client_stats(model)
    elif how == "pass":
        init_client_stats(model, batches_fn())
    else:
        raise ValueError(f"client_stats_init={how!r}: use one of {', '.join(CLIENT_STATS_INIT)}")
