"""The smallest problem the meta-learning tests share: one BN layer between two linear layers."""
import pytest
import torch
from torch import nn

from pflkit.models.mixed_bn import convert_bn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.bn(self.fc1(x))))


def _tiny_bn_net() -> nn.Module:
    torch.manual_seed(0)
    model = Tiny().double()
    with torch.no_grad():  # pretrained statistics that differ from any batch's
        model.bn.running_mean.copy_(torch.tensor([0.3, -0.2, 0.1, 0.5]))
        model.bn.running_var.copy_(torch.tensor([0.8, 1.5, 0.6, 1.2]))
    return convert_bn(model)


@pytest.fixture(scope="session")
def tiny_bn_net():
    """A factory of fresh float64 `Tiny` nets (seed 0), BN converted to the beta-mixed layer (Eq. 2)."""
    return _tiny_bn_net
