"""Client statistics (Alg. 1 lines 6-7): Eq. 3's xi and LRNet's layer features."""
import pytest
import torch
from torch import nn
from torch.distributions import Normal, kl_divergence

from pflkit.meta.client_stats import bn_divergence, client_stats, layer_input_stats, symmetric_kl
from pflkit.models.mixed_bn import convert_bn

D = torch.float64


def test_symmetric_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    mu_p, mu_q = torch.randn(6, generator=g, dtype=D), torch.randn(6, generator=g, dtype=D)
    var_p, var_q = torch.rand(6, generator=g, dtype=D) + 0.2, torch.rand(6, generator=g, dtype=D) + 0.2
    p, q = Normal(mu_p, var_p.sqrt()), Normal(mu_q, var_q.sqrt())
    expected = 0.5 * (kl_divergence(p, q) + kl_divergence(q, p))
    torch.testing.assert_close(symmetric_kl(mu_p, var_p, mu_q, var_q), expected)


def test_bn_divergence_is_the_channel_mean_of_eq_3():
    client = [(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 2.0])), (torch.tensor([0.5]), torch.tensor([0.5]))]
    pretrained = [(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0])), (torch.tensor([0.5]), torch.tensor([0.5]))]
    xi = bn_divergence(client, pretrained, eps=0.0)
    # layer 0: channel 0 identical (0); channel 1: ((2 + 1) / 1 + (1 + 1) / 2) / 4 - 1/2 = 0.5
    assert xi.tolist() == pytest.approx([0.25, 0.0])
    assert bn_divergence(client, pretrained, eps=[1e-5, 1e-5])[1] == 0.0
    with pytest.raises(ValueError, match="layers"):
        bn_divergence(client, pretrained[:1])


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Linear(12, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def _net():
    torch.manual_seed(0)
    net = _Net().double()
    with torch.no_grad():
        net.bn.running_mean.copy_(torch.tensor([0.2, -0.1, 0.3]))
        net.bn.running_var.copy_(torch.tensor([0.5, 2.0, 1.0]))
    return convert_bn(net)


def test_layer_features_are_mean_and_sd_of_each_layer_input_over_all_samples():
    net = _net()
    x = torch.randn(10, 2, 4, 4, dtype=D) * 2 + 1
    feats = layer_input_stats(net, [x[:3], x[3:7], x[7:]])  # batching must not matter
    net.eval()
    with torch.no_grad():  # the inputs of conv, bn and fc, by hand, with the pretrained BN statistics
        a = net.conv(x)
        bn_out = (a - net.bn.running_mean.view(1, 3, 1, 1)) / torch.sqrt(net.bn.running_var.view(1, 3, 1, 1) + 1e-5)
        bn_out = bn_out * net.bn.weight.view(1, 3, 1, 1) + net.bn.bias.view(1, 3, 1, 1)
        c = torch.relu(bn_out).flatten(1)
    expected = torch.tensor([v for t in (x, a, c) for v in (float(t.mean()), float(t.std()))])
    torch.testing.assert_close(feats, expected.float(), atol=1e-5, rtol=1e-5)


def test_client_stats_sets_client_statistics_and_returns_the_meta_net_inputs():
    net = _net()
    x = torch.randn(12, 2, 4, 4, dtype=D)
    stats = client_stats(net, lambda: [x[:5], x[5:]])
    assert stats.xi.shape == (1,) and stats.features.shape == (6,)
    with torch.no_grad():
        a = net.conv(x)
    mean, var = a.mean((0, 2, 3)), a.transpose(0, 1).reshape(3, -1).var(dim=1)
    torch.testing.assert_close(net.bn.client_mean, mean)
    torch.testing.assert_close(net.bn.client_var, var)
    expected = symmetric_kl(mean, var + 1e-5, net.bn.running_mean, net.bn.running_var + 1e-5).mean()
    assert float(stats.xi[0]) == pytest.approx(float(expected), rel=1e-6)


def test_client_stats_needs_converted_bn_layers():
    with pytest.raises(TypeError, match="convert_bn"):
        client_stats(_Net(), lambda: [torch.randn(2, 2, 4, 4)])


def test_client_stats_without_bn_layers():
    net = nn.Sequential(nn.Flatten(), nn.Linear(8, 3))
    stats = client_stats(net, lambda: [torch.randn(4, 2, 2, 2)])
    assert stats.xi.numel() == 0 and stats.features.shape == (2,)
