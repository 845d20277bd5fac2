"""Small nets for the offline data: sklearn digits, spoken-digit log-mels, and an MLP.

These are the models of the ``smoke`` and ``cpu`` presets, sized to train in
seconds on two CPU cores. They have BatchNorm so that the FedL2P machinery
(BN statistics, BNNet) has something to act on at small scale.

* `digits_cnn`: 1x8x8 sklearn digits. conv3x3(16)-BN-ReLU, conv3x3(32)-BN-ReLU,
  maxpool 2, conv3x3(32)-BN-ReLU, global average pool -> 32 features -> head.
  About 14.5k parameters with 10 classes.
* `audio_cnn`: 1 x n_mels x frames log-mel features (the FSDD stand-in for
  Speech Commands). Three conv3x3-BN-ReLU-maxpool2 blocks (16, 32, 64) and a
  global average pool, so any spectrogram of at least 8x8 works.
* `mlp`: flatten, ``hidden`` Linear-ReLU layers, head. With ``hidden=()`` it
  is multinomial logistic regression (features = the flattened input).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pflkit.models.introspect import SplitNet

__all__ = ["SmallCNN", "MLP", "digits_cnn", "audio_cnn", "mlp"]


def _cbr(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]


def _positive_ints(name: str, values: Sequence[int], n: int | None = None) -> tuple[int, ...]:
    values = tuple(values)
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)
    if not ok or (n is not None and len(values) != n):
        want = f"{n} positive ints" if n is not None else "positive ints"
        raise ValueError(f"{name}: expected {want}, got {values!r}")
    return values


class SmallCNN(SplitNet):
    """Conv body (ending in a global average pool) + linear ``head``."""

    def __init__(self, body: nn.Sequential, feature_dim: int, num_classes: int):
        super().__init__()
        self.body = body
        self.head = nn.Linear(feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.body(x), 1)


def digits_cnn(*, num_classes: int, input_shape: tuple[int, int, int],
               channels: Sequence[int] = (16, 32, 32)) -> SmallCNN:
    """Small BN conv net for 8x8 digits (works for any image of at least 2x2).

    Conv biases are dropped because the BN shift that follows makes them redundant.
    """
    c1, c2, c3 = _positive_ints("digits_cnn: channels", channels, 3)
    _, h, w = input_shape
    if h < 2 or w < 2:
        raise ValueError(f"digits_cnn: input {input_shape[1:]} is too small (needs >= 2x2)")
    body = nn.Sequential(
        *_cbr(input_shape[0], c1), *_cbr(c1, c2), nn.MaxPool2d(2),
        *_cbr(c2, c3), nn.AdaptiveAvgPool2d(1),
    )
    return SmallCNN(body, c3, num_classes)


def audio_cnn(*, num_classes: int, input_shape: tuple[int, int, int],
              channels: Sequence[int] = (16, 32, 64)) -> SmallCNN:
    """Small BN conv net for log-mel spectrograms (1 x n_mels x frames)."""
    channels = _positive_ints("audio_cnn: channels", channels)
    if not channels:
        raise ValueError("audio_cnn: channels must not be empty")
    _, h, w = input_shape
    need = 2 ** len(channels)
    if h < need or w < need:
        raise ValueError(
            f"audio_cnn: input {input_shape[1:]} is too small for {len(channels)} 2x2 pools "
            f"(needs >= {need}x{need})"
        )
    layers: list[nn.Module] = []
    c_in = input_shape[0]
    for c_out in channels:
        layers += [*_cbr(c_in, c_out), nn.MaxPool2d(2)]
        c_in = c_out
    layers.append(nn.AdaptiveAvgPool2d(1))
    return SmallCNN(nn.Sequential(*layers), c_in, num_classes)


class MLP(SplitNet):
    """Flatten, hidden Linear-ReLU layers, linear ``head``."""

    def __init__(self, in_dim: int, hidden: Sequence[int], num_classes: int):
        super().__init__()
        dims = [in_dim, *hidden]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(dims[-1], num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)
        for layer in self.hidden:
            x = F.relu(layer(x))
        return x


def mlp(*, num_classes: int, input_shape: tuple[int, int, int],
        hidden: Sequence[int] = (64,)) -> MLP:
    """Multilayer perceptron on the flattened input; ``hidden=()`` gives logistic regression."""
    if isinstance(hidden, int):
        hidden = (hidden,)
    hidden = _positive_ints("mlp: hidden", hidden)
    return MLP(math.prod(input_shape), hidden, num_classes)
