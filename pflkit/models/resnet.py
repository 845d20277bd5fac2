"""ResNet-18 in FedL2P's two variants (FedL2P App. D).

* `resnet18_cifar`: the CIFAR-10 / Speech Commands network of FedL2P App. D:
  torchvision's ResNet-18 with the 7x7 stride-2 stem convolution replaced by a
  3x3 stride-1 padding-1 convolution and the max-pool replaced by the identity,
  so 32x32 inputs keep their resolution through the stem.
* `resnet18_imagenet`: torchvision's ResNet-18 unchanged up to its head; with
  ``pretrained=True`` it loads torchvision's IMAGENET1K_V1 weights (the
  Office-Caltech-10 / DomainNet setup of FedL2P App. D). The 1000-way ``fc`` is
  replaced by a new ``num_classes`` head.

Both are the same `ResNet18` wrapper, so their parameter names agree
(``conv1.weight``, ``layer1.0.bn1.weight``, ..., ``head.weight``) and every
BatchNorm layer is an ``nn.BatchNorm2d`` (FedL2P's BNNet mixes their statistics).
"""
from __future__ import annotations

import os
from urllib.parse import urlparse

import torch
from torch import nn
from torchvision.models import ResNet18_Weights
from torchvision.models import resnet18 as _tv_resnet18

from pflkit.models.introspect import SplitNet

__all__ = ["ResNet18", "resnet18_cifar", "resnet18_imagenet", "PRETRAINED_WEIGHTS"]

#: The torchvision weights `resnet18_imagenet(pretrained=True)` loads.
PRETRAINED_WEIGHTS = ResNet18_Weights.IMAGENET1K_V1


class ResNet18(SplitNet):
    """ResNet-18 trunk (stem, four stages, global average pool) + linear ``head``.

    Built from a torchvision ``ResNet`` whose modules it takes over, so it can
    load torchvision checkpoints (with ``fc.*`` renamed to ``head.*``).
    """

    def __init__(self, tv_model: nn.Module, num_classes: int):
        super().__init__()
        self.conv1, self.bn1, self.relu = tv_model.conv1, tv_model.bn1, tv_model.relu
        self.maxpool = tv_model.maxpool
        self.layer1, self.layer2 = tv_model.layer1, tv_model.layer2
        self.layer3, self.layer4 = tv_model.layer3, tv_model.layer4
        self.avgpool = tv_model.avgpool
        self.head = nn.Linear(tv_model.fc.in_features, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)


def resnet18_cifar(*, num_classes: int, input_shape: tuple[int, int, int]) -> ResNet18:
    """ResNet-18 for small images (FedL2P App. D, CIFAR-10 and Speech Commands).

    Stem: Conv2d(C, 64, 3, stride 1, padding 1, no bias) + BN + ReLU, no max-pool.
    Any channel count C works (1 for log-mel spectrograms).
    """
    tv = _tv_resnet18(weights=None)
    # Built after torchvision's own init so the draw order of the RNG stays fixed;
    # kaiming-normal (fan_out) matches what torchvision uses for every other conv.
    stem = nn.Conv2d(input_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(stem.weight, mode="fan_out", nonlinearity="relu")
    tv.conv1, tv.maxpool = stem, nn.Identity()
    return ResNet18(tv, num_classes)


def resnet18_imagenet(
    *, num_classes: int, input_shape: tuple[int, int, int], pretrained: bool = False
) -> ResNet18:
    """torchvision's ResNet-18 with a new ``num_classes`` head (FedL2P App. D).

    Args:
        num_classes: output size of the new head (initialized randomly).
        input_shape: (C, H, W); C must be 3 when ``pretrained``. For C != 3 the
            stem convolution is rebuilt for C channels (random init).
        pretrained: load torchvision's IMAGENET1K_V1 weights into the trunk.

    Raises:
        ValueError: ``pretrained`` with C != 3.
        RuntimeError: ``pretrained`` and the weights are neither cached nor
            downloadable; the message says where to put the file.
    """
    if not isinstance(pretrained, bool):
        raise TypeError(f"resnet18_imagenet: pretrained must be a bool, got {pretrained!r}")
    channels = input_shape[0]
    if pretrained and channels != 3:
        raise ValueError(
            f"resnet18_imagenet: pretrained ImageNet weights need 3 input channels, got {channels}"
        )
    tv = _tv_resnet18(weights=None)
    if pretrained:
        tv.load_state_dict(load_imagenet_state_dict())
    elif channels != 3:
        tv.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        nn.init.kaiming_normal_(tv.conv1.weight, mode="fan_out", nonlinearity="relu")
    return ResNet18(tv, num_classes)


def pretrained_cache_path() -> str:
    """Where torchvision caches the IMAGENET1K_V1 ResNet-18 file (follows TORCH_HOME)."""
    filename = os.path.basename(urlparse(PRETRAINED_WEIGHTS.url).path)
    return os.path.join(torch.hub.get_dir(), "checkpoints", filename)


def load_imagenet_state_dict() -> dict[str, torch.Tensor]:
    """torchvision's IMAGENET1K_V1 ResNet-18 state dict, from the cache or the web.

    Raises:
        RuntimeError: the file is not cached and cannot be downloaded (offline),
            or the cached file is unreadable. The message names the URL, the
            cache path under TORCH_HOME and how to place the file by hand.
    """
    url, path = PRETRAINED_WEIGHTS.url, pretrained_cache_path()
    cached = os.path.exists(path)
    try:
        # torch.hub returns the cached file when present and downloads otherwise.
        return torch.hub.load_state_dict_from_url(url, progress=False, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - re-raised with instructions
        if cached:
            raise RuntimeError(
                f"the cached ResNet-18 ImageNet weights at {path} could not be loaded ({err}); "
                "delete the file and retry, or replace it with a fresh copy of "
                f"{url}"
            ) from err
        raise RuntimeError(
            "could not download torchvision's ResNet-18 IMAGENET1K_V1 weights "
            f"({type(err).__name__}: {err}). torchvision caches downloaded weights in "
            f"$TORCH_HOME/hub/checkpoints (TORCH_HOME={os.environ.get('TORCH_HOME', '~/.cache/torch')!r}; "
            f"cache directory here: {os.path.dirname(path)}). On a machine with internet, download "
            f"{url} and place it at {path} (or set TORCH_HOME to a directory whose "
            "hub/checkpoints/ holds that file); then pretrained=True loads it offline."
        ) from err
