"""Plain convolutional nets of pFedVEM and pFedHN's Omniglot experiment.

* `cnn5` (pFedVEM sec. 3.1): "a CNN network with five convolutional layers
  followed by a fully connected layer"; the convolutions are the shared
  representation model, the fully connected layer the personalized linear
  classifier (``head``). The paper gives no sizes; we follow the authors'
  public code: 3x3 convolutions (padding 1) with 32, 64, 128, 256, 100 filters,
  ReLU, a 2x2 stride-2 max-pool with padding 1 after each of the first four and
  a global average pool after the fifth, so the head sees ``channels[-1]``
  features whatever the image size. Without BN by default (as there).
* `omniglot_cnn` (pFedHN sec. 5.1): "a LeNet-based model with four convolution
  and two fully connected layers". The paper gives no sizes either; our reading
  is four blocks conv 3x3 (padding 1) - ReLU - maxpool 2 (the standard Omniglot
  convolution block, here without BN by default like pFedHN's LeNet), then
  FC(flat, hidden) - ReLU and the linear head. On the usual 28x28 resize the
  flattened map is 1x1 per channel.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pflkit.models.introspect import SplitNet

__all__ = ["ConvBlockNet", "cnn5", "omniglot_cnn"]


def _conv_block(c_in: int, c_out: int, bn: bool, pool: nn.Module) -> nn.Sequential:
    # BN (when used) sits between convolution and ReLU, the usual placement.
    layers = [nn.Conv2d(c_in, c_out, 3, padding=1)]
    if bn:
        layers.append(nn.BatchNorm2d(c_out))
    layers += [nn.ReLU(), pool]
    return nn.Sequential(*layers)


def _check_channels(name: str, channels: Sequence[int], n: int) -> tuple[int, ...]:
    channels = tuple(channels)
    if len(channels) != n or not all(isinstance(c, int) and c > 0 for c in channels):
        raise ValueError(f"{name}: channels must be {n} positive ints, got {channels!r}")
    return channels


class ConvBlockNet(SplitNet):
    """A stack of conv blocks, optional hidden FC layers, and a linear ``head``.

    ``blocks`` is an ``nn.Sequential`` of conv blocks; its output is flattened
    (``flat_dim`` values) and passed through ``hidden`` FC-ReLU layers.
    """

    def __init__(self, blocks: nn.Sequential, flat_dim: int, hidden: Sequence[int],
                 num_classes: int):
        super().__init__()
        self.blocks = blocks
        dims = [flat_dim, *hidden]
        self.fc = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(dims[-1], num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.blocks(x), 1)
        for layer in self.fc:
            x = F.relu(layer(x))
        return x


def cnn5(*, num_classes: int, input_shape: tuple[int, int, int],
         channels: Sequence[int] = (32, 64, 128, 256, 100), bn: bool = False) -> ConvBlockNet:
    """pFedVEM's five-conv CNN + linear classifier (see module docstring for the sizes)."""
    channels = _check_channels("cnn5", channels, 5)
    dims = (input_shape[0], *channels)
    blocks = [
        # padding 1 in the pool keeps odd sizes from losing their last row (32->17->9->5->3)
        _conv_block(dims[i], dims[i + 1], bool(bn), nn.MaxPool2d(2, stride=2, padding=1))
        for i in range(4)
    ]
    blocks.append(_conv_block(dims[4], dims[5], bool(bn), nn.AdaptiveAvgPool2d(1)))
    return ConvBlockNet(nn.Sequential(*blocks), channels[-1], (), num_classes)


def omniglot_cnn(*, num_classes: int, input_shape: tuple[int, int, int],
                 channels: Sequence[int] = (32, 32, 64, 64), hidden: int = 128,
                 bn: bool = False) -> ConvBlockNet:
    """pFedHN's Omniglot net: four conv blocks, FC(flat, ``hidden``), linear head.

    Raises:
        ValueError: if the image is smaller than 16x16 (four 2x2 pools).
    """
    channels = _check_channels("omniglot_cnn", channels, 4)
    if not isinstance(hidden, int) or hidden < 1:
        raise ValueError(f"omniglot_cnn: hidden must be a positive int, got {hidden!r}")
    c, h, w = input_shape
    for _ in range(4):  # 'same' 3x3 conv keeps the size, the 2x2 pool floors it by half
        h, w = h // 2, w // 2
    if h < 1 or w < 1:
        raise ValueError(f"omniglot_cnn: input {input_shape[1:]} is too small (needs >= 16x16)")
    dims = (c, *channels)
    blocks = nn.Sequential(
        *(_conv_block(dims[i], dims[i + 1], bool(bn), nn.MaxPool2d(2)) for i in range(4))
    )
    return ConvBlockNet(blocks, channels[-1] * h * w, (hidden,), num_classes)
