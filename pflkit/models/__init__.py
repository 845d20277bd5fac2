"""The model zoo: every network the four papers and the small presets use.

`build_model(name, num_classes=..., input_shape=..., **options)` builds any of
them by name; `MODELS` lists the names. Every model follows one contract
(`SplitNet`): ``forward(x) == model.head(model.features(x))`` with ``head`` the
final ``nn.Linear``. Initialization is torch's default (or torchvision's for
ResNet), so the same ``torch.manual_seed`` gives the same weights.

=================== ======================================== =========================
name                what                                     options
=================== ======================================== =========================
resnet18_cifar      ResNet-18, 3x3 stem, no max-pool         (none)
                    (FedL2P App. D, CIFAR-10 / audio)
resnet18_imagenet   torchvision ResNet-18, new head          pretrained=False
                    (FedL2P App. D, Office-Caltech/DomainNet)
lenet               pFedHN target LeNet (S/M/L = width 8/16/32) width=16, bn=False
omniglot_cnn        pFedHN Omniglot: 4 conv + 2 FC           channels, hidden, bn=False
cnn5                pFedVEM: 5 conv + linear classifier      channels, bn=False
digits_cnn          small BN CNN for 1x8x8 sklearn digits    channels
audio_cnn           small BN CNN for 1 x n_mels x frames     channels
mlp                 flatten + hidden Linear-ReLU + head      hidden=(64,)
=================== ======================================== =========================
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from torch import nn

from pflkit.config import reject_unknown_options
from pflkit.models.cnn import cnn5, omniglot_cnn
from pflkit.models.introspect import (
    SplitNet,
    body_param_names,
    bn_modules,
    count_params,
    head_param_names,
    layer_input_modules,
    layer_param_names,
    state_nbytes,
)
from pflkit.models.lenet import lenet
from pflkit.models.resnet import resnet18_cifar, resnet18_imagenet
from pflkit.models.small import audio_cnn, digits_cnn, mlp

# the package's public names: the zoo, and the introspection helpers of introspect.py (listed here only)
__all__ = [
    "MODELS",
    "build_model",
    "model_options",
    "SplitNet",
    "bn_modules",
    "head_param_names",
    "body_param_names",
    "layer_param_names",
    "layer_input_modules",
    "count_params",
    "state_nbytes",
]

#: Every model by name; each builder takes ``num_classes``, ``input_shape`` and its options.
MODELS: dict[str, Callable[..., nn.Module]] = {
    "resnet18_cifar": resnet18_cifar,
    "resnet18_imagenet": resnet18_imagenet,
    "lenet": lenet,
    "omniglot_cnn": omniglot_cnn,
    "cnn5": cnn5,
    "digits_cnn": digits_cnn,
    "audio_cnn": audio_cnn,
    "mlp": mlp,
}

_REQUIRED = ("num_classes", "input_shape")


def model_options(name: str) -> dict[str, Any]:
    """The options model ``name`` accepts, with their defaults."""
    builder = _builder(name)
    return {
        p.name: p.default
        for p in inspect.signature(builder).parameters.values()
        if p.name not in _REQUIRED
    }


def _builder(name: str) -> Callable[..., nn.Module]:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def _check_shape(input_shape: Any) -> tuple[int, int, int]:
    shape = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else None
    if (
        shape is None
        or len(shape) != 3
        or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape)
    ):
        raise ValueError(
            f"input_shape must be (C, H, W) of one sample as three positive ints, got {input_shape!r}"
        )
    return shape


def build_model(name: str, *, num_classes: int, input_shape: tuple[int, int, int],
                **options: Any) -> nn.Module:
    """Build model ``name`` for ``num_classes`` classes and samples of shape (C, H, W).

    Args:
        name: a key of `MODELS`.
        num_classes: output size of ``model.head``.
        input_shape: (C, H, W) of one sample (e.g. (3, 32, 32) for CIFAR,
            (1, 8, 8) for sklearn digits, (1, n_mels, frames) for log-mels).
        **options: model-specific options (see `model_options`).

    Raises:
        ValueError: unknown ``name`` (the message lists the names), bad
            ``num_classes`` / ``input_shape``, or a bad option value.
        TypeError: an option the model does not take (named in the message).
    """
    builder = _builder(name)
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    shape = _check_shape(input_shape)
    reject_unknown_options(f"model {name!r}", options, model_options(name))
    return builder(num_classes=num_classes, input_shape=shape, **options)
