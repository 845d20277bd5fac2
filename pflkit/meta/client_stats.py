"""The client meta-data the meta-nets read (FedL2P Alg. 1 lines 6-7, Eq. 3-4).

One forward pass of the client's data through the *pretrained* model (evaluation
mode, the pretrained BN statistics, i.e. beta = 0) gives

1. per BN layer b and channel j, the mean and variance of the layer's input,
   mu_{i,b,j} and sigma^2_{i,b,j} (`pflkit.models.mixed_bn.bn_input_stats`); from them
   xi_b (Eq. 3), the symmetric KL divergence between the client's Gaussian
   N(mu_i, sigma_i^2) and the pretrained running Gaussian N(mu_pt, sigma_pt^2),
   averaged over the channels: BNNet's input;
2. per layer m (every convolution, linear and BN layer, `layer_input_modules`), the
   mean E(x_m) and standard deviation SD(x_m) of its whole input tensor over all the
   client's samples: LRNet's input ``(E(x_0), SD(x_0), ..., E(x_{M-1}), SD(x_{M-1}))``.

Reading of "the mean and SD of each input feature per layer": one scalar mean and SD per
layer over all of its input's entries (LRNet then has 2M inputs, as Eq. 4 lists; the
authors' ``layerwise`` mode). Model-agnostic: statistics are collected by forward hooks
and sums are accumulated in float64, so the result is exact for the whole split.

Scale: both inputs enter the meta-nets raw, as in the paper and the authors' code (which
take SD as ``sqrt(var + 1e-5)``; here the plain SD, the paper's). Their differences between
clients set how much beta / eta can differ (`pflkit.meta.metanets`, `input_sensitivity`):
on ``fedl2p_conditioning_digits`` at ``cpu`` (MNIST / MNIST-M / USPS, a LeNet pretrained on
CIFAR-10) the SD of xi between the domain means is 0.33 (0.06 within a domain; MNIST-M, the
natural-image textures, is the closest to the pretraining statistics: xi 0.02 / 0.09 against
MNIST's 0.5 / 1.1), that of the feature statistics 0.54 (0.10 within).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch import nn

from pflkit.models.introspect import bn_modules, layer_input_modules
from pflkit.models.mixed_bn import MixedBatchNorm, init_client_stats, mixed_bn_layers, pretrained_pass

__all__ = ["symmetric_kl", "bn_divergence", "pretrained_bn_stats", "layer_input_stats", "ClientStats",
           "client_stats"]


def symmetric_kl(mu_p: torch.Tensor, var_p: torch.Tensor, mu_q: torch.Tensor, var_q: torch.Tensor) -> torch.Tensor:
    """Elementwise ``(KL(P||Q) + KL(Q||P)) / 2`` for univariate Gaussians P, Q.

    The log terms cancel: ``((var_p + d^2) / var_q + (var_q + d^2) / var_p) / 4 - 1/2``
    with ``d = mu_p - mu_q``.
    """
    d2 = (mu_p - mu_q) ** 2
    return ((var_p + d2) / var_q + (var_q + d2) / var_p) / 4 - 0.5


def pretrained_bn_stats(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The pretrained running mean and variance of every BN layer, in `bn_modules` order."""
    return [(m.running_mean.detach(), m.running_var.detach()) for _, m in bn_modules(model)]


def bn_divergence(client: Sequence[tuple[torch.Tensor, torch.Tensor]],
                  pretrained: Sequence[tuple[torch.Tensor, torch.Tensor]],
                  eps: float | Sequence[float] = 1e-5) -> torch.Tensor:
    """xi_b of Eq. 3 for every BN layer: channel mean of the symmetric KL divergence.

    Both variances get ``eps`` (the BN epsilon) added, as the BN layer itself does, so
    that channels with zero variance (dead ReLUs) give a finite distance.

    Args:
        client: per layer, the client's per-channel (mean, variance) of the layer input.
        pretrained: per layer, the pretrained running (mean, variance).
        eps: added to both variances; one value, or one per layer.

    Returns:
        A float32 tensor (B,).
    """
    if len(client) != len(pretrained):
        raise ValueError(f"bn_divergence: {len(client)} client layers vs {len(pretrained)} pretrained layers")
    eps = [float(eps)] * len(client) if isinstance(eps, (int, float)) else [float(e) for e in eps]
    if len(eps) != len(client):
        raise ValueError(f"bn_divergence: {len(eps)} eps values for {len(client)} layers")
    out = []
    for (mu_c, var_c), (mu_g, var_g), e in zip(client, pretrained, eps):
        kl = symmetric_kl(mu_c.double(), var_c.double() + e, mu_g.double(), var_g.double() + e)
        out.append(kl.mean())
    return torch.stack(out).float() if out else torch.zeros(0)


@torch.no_grad()
def layer_input_stats(model: nn.Module, batches: Iterable[torch.Tensor]) -> torch.Tensor:
    """LRNet's input (Eq. 4): ``[E(x_0), SD(x_0), ..., E(x_{M-1}), SD(x_{M-1})]``.

    One pass of ``batches`` (inputs only) through the model in evaluation mode with the
    pretrained BN statistics; x_m is the input of the m-th module of
    `layer_input_modules`. SD is the unbiased standard deviation over all entries.

    Returns:
        A float32 tensor (2M,).
    """
    layers = [m for _, m in layer_input_modules(model)]
    sums = [[0.0, 0.0, 0] for _ in layers]

    def hook_for(k):
        def hook(module, inputs, output):
            # float64 sums kept on the input's device: no host round trip per layer and batch
            x = inputs[0].detach().double()
            sums[k][0] = sums[k][0] + x.sum()
            sums[k][1] = sums[k][1] + (x * x).sum()
            sums[k][2] += x.numel()
        return hook

    pretrained_pass(model, batches, layers, hook_for)
    out = []
    for k, (s, ss, n) in enumerate(sums):
        if n == 0:
            raise ValueError(f"layer_input_stats: layer {k} ({type(layers[k]).__name__}) saw no input")
        mean = s / n
        var = (ss - n * mean * mean).clamp_min(0.0) / max(n - 1, 1)
        out += [mean, var.sqrt()]
    return torch.stack(out).float() if out else torch.zeros(0, device=_device_of(model))


def _device_of(model: nn.Module) -> torch.device:
    """Where the model's tensors live (the CPU for a model without any)."""
    return next(model.parameters(), torch.empty(0, device="cpu")).device


@dataclass
class ClientStats:
    """A client's meta-data: BNNet's input ``xi`` (B,), LRNet's input ``features`` (2M,),
    and the per-layer (mean, var) of each BN input that seeded the client statistics."""

    xi: torch.Tensor
    features: torch.Tensor
    bn_stats: list[tuple[torch.Tensor, torch.Tensor]]


def client_stats(model: nn.Module, batches_fn) -> ClientStats:
    """Alg. 1 lines 6-7 on a model converted with `convert_bn` (or without BN layers).

    Sets every `MixedBatchNorm` layer's client statistics from the pass (as the FT
    baselines do) and returns the meta-nets' inputs.

    Args:
        model: the pretrained model (BN layers converted to `MixedBatchNorm`, if any).
        batches_fn: ``() -> iterable of input batches`` over the client's data; called
            once per pass.
    """
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise TypeError("client_stats: convert the model's BatchNorm layers with convert_bn first")
    if any(isinstance(m, MixedBatchNorm) for m in model.modules()):
        stats = init_client_stats(model, batches_fn())
        xi = bn_divergence(stats, pretrained_bn_stats(model), eps=[m.eps for m in mixed_bn_layers(model)])
    else:
        stats, xi = [], torch.zeros(0, device=_device_of(model))
    return ClientStats(xi=xi, features=layer_input_stats(model, batches_fn()), bn_stats=stats)
