"""The feature/head split every pflkit model follows, and questions asked of a model.

Every model of the zoo is a `SplitNet`: ``forward(x) = head(features(x))`` where
``head`` is the final ``nn.Linear``. The split is what the personalized baselines
need: FedPer and pFedHN-PC keep ``head`` local, LG-FedAvg keeps the body local,
FedBABU freezes ``head`` during federated training, and pFedVEM puts its Gaussian
posterior on ``head``.

The helpers below answer the questions the algorithms ask about a model:

* `bn_modules`: the BatchNorm layers (FedL2P's B BN layers, whose statistics
  BNNet mixes, Eq. 2);
* `head_param_names` / `body_param_names`: the split above, as parameter names;
* `layer_param_names`: every weight and bias tensor in order, one learning rate
  each (FedL2P's eta_1 .. eta_2M, Eq. 4);
* `layer_input_modules`: the layers whose inputs x_0 .. x_{M-1} LRNet summarizes
  by their mean and SD (FedL2P Eq. 4);
* `count_params` and `state_nbytes`: model size and communication cost.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class SplitNet(nn.Module):
    """Base class: a feature extractor followed by a linear ``head``.

    Subclasses set ``self.head`` (an ``nn.Linear``) and implement `features`.
    ``feature_dim`` is ``head.in_features``: the size of what `features` returns.
    """

    head: nn.Linear

    def features(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """Penultimate features of ``x``: what ``head`` consumes."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    @property
    def feature_dim(self) -> int:
        return self.head.in_features


def _is_bn(module: nn.Module) -> bool:
    # FedL2P's MixedBatchNorm (pflkit.models.mixed_bn) replaces BatchNorm layers
    # without subclassing _BatchNorm; it still is "a BN layer" for every question
    # asked here. Imported lazily: mixed_bn depends on the kernels package.
    if isinstance(module, _BatchNorm):
        return True
    from pflkit.models.mixed_bn import MixedBatchNorm

    return isinstance(module, MixedBatchNorm)


def bn_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every BatchNorm layer of ``model`` with its qualified name, in definition order.

    Counts ``torch.nn`` BatchNorm1d/2d/3d (any ``_BatchNorm``) and FedL2P's
    ``MixedBatchNorm``. For every zoo model definition order is forward order.
    """
    return [(name, m) for name, m in model.named_modules() if _is_bn(m)]


def _head_module(model: nn.Module) -> nn.Module:
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        raise TypeError(
            f"{type(model).__name__} has no `head` module; pflkit models expose their final "
            "nn.Linear as `model.head`"
        )
    return head


def head_param_names(model: nn.Module) -> list[str]:
    """Names (as in ``model.named_parameters()``) of the parameters of ``model.head``."""
    head_ids = {id(p) for p in _head_module(model).parameters()}
    return [n for n, p in model.named_parameters() if id(p) in head_ids]


def body_param_names(model: nn.Module) -> list[str]:
    """Names of every parameter not in ``model.head``, in ``named_parameters`` order."""
    head_ids = {id(p) for p in _head_module(model).parameters()}
    return [n for n, p in model.named_parameters() if id(p) not in head_ids]


def layer_param_names(model: nn.Module) -> list[str]:
    """Every weight and bias tensor, in order: one learning rate each (FedL2P Eq. 4).

    FedL2P learns "layer-wise learning rates eta for all learnable weights and
    biases", eta_1 .. eta_2M for M layers with a weight and a bias each. Layers
    without a bias (ResNet convolutions) contribute one entry, so the list has
    at most 2M entries; BN affine parameters count as a layer's weight and bias.
    """
    return [n for n, _ in model.named_parameters()]


_LAYER_TYPES = (nn.modules.conv._ConvNd, nn.Linear)


def layer_input_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The layers whose inputs FedL2P's LRNet summarizes, in forward order.

    FedL2P (Eq. 4) feeds LRNet the mean and SD of x_{m-1}, "the input feature to
    the m-th layer", for each of the M layers that own learnable weights. We read
    "layer" as every convolution, linear and BatchNorm module (activations,
    pooling and identity shortcuts have no parameters and so no learning rate).
    Register forward hooks on these modules to collect their inputs.

    The order is definition order, which for every zoo model (including the
    ResNet blocks, whose downsample branch runs after ``bn2``) is the order in
    which the modules run; the test suite checks this with forward hooks.
    """
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, _LAYER_TYPES) or _is_bn(m)
    ]


def count_params(model: nn.Module, names: Iterable[str] | None = None) -> int:
    """Number of scalar parameters of ``model`` (only ``names`` if given).

    Raises:
        ValueError: if a name in ``names`` is not a parameter of ``model``.
    """
    params = dict(model.named_parameters())
    if names is None:
        return sum(p.numel() for p in params.values())
    names = list(names)
    unknown = [n for n in names if n not in params]
    if unknown:
        raise ValueError(f"count_params: {unknown} are not parameters of {type(model).__name__}")
    return sum(params[n].numel() for n in names)


def state_nbytes(state_dict: Mapping[str, object]) -> int:
    """Bytes needed to send the tensors of ``state_dict`` (e.g. one FL message).

    Non-tensor entries (metadata) are ignored.
    """
    return sum(
        t.numel() * t.element_size() for t in state_dict.values() if isinstance(t, torch.Tensor)
    )
