"""pFedHN's LeNet-based target network (pFedHN sec. 5.1, App. B "Computational Budget").

conv(C, w, 5) - ReLU - maxpool 2 - conv(w, 2w, 5) - ReLU - maxpool 2 -
FC(2w * h * w', 120) - ReLU - FC(120, 84) - ReLU - head(84, classes).

The width ``w`` is the number of first-convolution filters: 8 / 16 / 32 for the
S / M / L computational budgets of pFedHN sec. 5.2; the second convolution has
twice as many ("the second layer has twice the number of filters"). With
``w = 16`` on 3x32x32 images this is the authors' target network (FC 800 -> 120,
see papers/reference-implementations.md); the later pFedVEM code uses the same
body for CIFAR-10. Layer names (conv1, conv2, fc1, fc2, head) match the
names a pFedHN hypernetwork emits weights for.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pflkit.models.introspect import SplitNet

__all__ = ["LeNet", "lenet"]


def _lenet_spatial(size: int) -> int:
    # valid 5x5 conv (-4), 2x2 pool (//2), twice
    return ((size - 4) // 2 - 4) // 2


class LeNet(SplitNet):
    """Two 5x5 convolutions and three fully connected layers (the last is ``head``)."""

    def __init__(self, in_channels: int, height: int, width_px: int, num_classes: int,
                 width: int = 16, bn: bool = False):
        super().__init__()
        h, w = _lenet_spatial(height), _lenet_spatial(width_px)
        if h < 1 or w < 1:
            raise ValueError(
                f"lenet: input {height}x{width_px} is too small for two 5x5 convs and pools "
                "(needs at least 16x16)"
            )
        self.conv1 = nn.Conv2d(in_channels, width, 5)
        self.bn1 = nn.BatchNorm2d(width) if bn else nn.Identity()
        self.conv2 = nn.Conv2d(width, 2 * width, 5)
        self.bn2 = nn.BatchNorm2d(2 * width) if bn else nn.Identity()
        self.fc1 = nn.Linear(2 * width * h * w, 120)
        self.fc2 = nn.Linear(120, 84)
        self.head = nn.Linear(84, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.relu(self.fc2(x))


def lenet(*, num_classes: int, input_shape: tuple[int, int, int], width: int = 16,
          bn: bool = False) -> LeNet:
    """pFedHN's LeNet target; ``width`` 8/16/32 = budget S/M/L; ``bn`` adds BN after each conv.

    Without BN by default, as in pFedHN.
    """
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"lenet: width must be a positive int, got {width!r}")
    c, h, w = input_shape
    return LeNet(c, h, w, num_classes, width=width, bn=bool(bn))
