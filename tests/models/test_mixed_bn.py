"""The BN modes of the fine-tuning baselines against their definitions (FedL2P Eq. 1-2)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pflkit.models.mixed_bn import (
    MixedBatchNorm, bn_input_stats, convert_bn, init_client_stats, pretrained_pass, reset_client_stats, set_bn_mode,
    start_client_stats,
)


def _bn(c=4):
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(c)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.uniform_(-0.5, 0.5)
    return bn


def test_state_dict_keys_unchanged():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), _bn())
    keys = set(model.state_dict())
    convert_bn(model)
    assert isinstance(model[1], MixedBatchNorm)
    assert set(model.state_dict()) == keys


@pytest.mark.parametrize("training", [False, True])
def test_beta_zero_is_the_pretrained_statistics(training):
    bn = _bn()
    x = torch.randn(8, 4, 5, 5) * 3 + 1
    ref = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
    m = MixedBatchNorm(bn)
    set_bn_mode(nn.Sequential(m), "global")
    m.train(training)
    torch.testing.assert_close(m(x), ref, rtol=0, atol=1e-6)


def test_beta_one_trains_on_batch_stats_and_tests_on_client_stats():
    bn = _bn()
    m = MixedBatchNorm(bn)
    set_bn_mode(nn.Sequential(m), "client")
    x = torch.randn(16, 4, 3, 3) * 2 + 0.5
    m.train()
    out = m(x)
    ref = F.batch_norm(x, None, None, bn.weight, bn.bias, True, 0.0, bn.eps)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    m.eval()
    ref_eval = F.batch_norm(x, m.client_mean, m.client_var, bn.weight, bn.bias, False, 0.0, bn.eps)
    torch.testing.assert_close(m(x), ref_eval, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(m.client_mean, bn.running_mean)  # the client's statistics moved


def test_batch_mode_uses_batch_statistics_at_test_time():
    bn = _bn()
    m = MixedBatchNorm(bn)
    set_bn_mode(nn.Sequential(m), "batch")
    m.eval()
    x = torch.randn(10, 4, 2, 2)
    ref = F.batch_norm(x, None, None, bn.weight, bn.bias, True, 0.0, bn.eps)
    torch.testing.assert_close(m(x), ref, rtol=1e-5, atol=1e-5)


def test_half_mix_is_the_average_of_statistics():
    bn = _bn()
    m = MixedBatchNorm(bn)
    m.client_mean.fill_(2.0)
    m.client_var.fill_(3.0)
    set_bn_mode(nn.Sequential(m), "mixed", beta=0.5)
    m.eval()
    x = torch.randn(4, 4, 2, 2)
    mean, var = 0.5 * bn.running_mean + 1.0, 0.5 * bn.running_var + 1.5
    ref = F.batch_norm(x, mean, var, bn.weight, bn.bias, False, 0.0, bn.eps)
    torch.testing.assert_close(m(x), ref, rtol=1e-5, atol=1e-5)


def test_client_stats_are_exact_dataset_moments():
    model = convert_bn(nn.Sequential(_bn(3)))
    data = [torch.randn(7, 3, 4, 4) * 2 + 1 for _ in range(3)]
    stats = init_client_stats(model, data)
    allx = torch.cat(data).transpose(0, 1).reshape(3, -1)
    torch.testing.assert_close(stats[0][0], allx.mean(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats[0][1], allx.var(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[0].client_mean, allx.mean(1), rtol=1e-5, atol=1e-5)


def test_reset_client_stats_then_fine_tuning_tracks_them_from_zero_one():
    """The authors' start (mean 0, variance 1), then one training batch with momentum 0.1."""
    bn = _bn(3)
    model = convert_bn(nn.Sequential(bn))
    data = torch.randn(6, 3, 4, 4) * 2 + 1
    start_client_stats(model, "pass", lambda: [data])
    assert not torch.equal(model[0].client_mean, torch.zeros(3))
    start_client_stats(model, "reset", lambda: pytest.fail("reset must not pass over the data"))
    assert torch.equal(model[0].client_mean, torch.zeros(3)) and torch.equal(model[0].client_var, torch.ones(3))
    assert torch.equal(model[0].running_mean, bn.running_mean)  # the pretrained statistics stay
    set_bn_mode(model, "client")
    model.train()
    model(data)
    flat = data.transpose(0, 1).reshape(3, -1)
    torch.testing.assert_close(model[0].client_mean, 0.1 * flat.mean(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model[0].client_var, 0.9 + 0.1 * flat.var(1), rtol=1e-5, atol=1e-6)
    reset_client_stats(model)
    assert torch.equal(model[0].client_var, torch.ones(3))
    with pytest.raises(ValueError, match="client_stats_init='mean'"):
        start_client_stats(model, "mean", lambda: [data])


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="convert_bn"):
        set_bn_mode(nn.Linear(2, 2), "client")
    model = convert_bn(nn.Sequential(_bn()))
    with pytest.raises(ValueError, match="unknown mode"):
        set_bn_mode(model, "weird")
    with pytest.raises(ValueError, match="betas"):
        set_bn_mode(model, "mixed", beta=[0.1, 0.2])
    with pytest.raises(ValueError, match="no batch"):
        bn_input_stats(model, [])


def test_pretrained_pass_restores_modes_and_removes_its_hooks():
    """Alg. 1 line 6's pass sees beta = 0 in evaluation mode; the model comes back as it was."""
    model = convert_bn(nn.Sequential(nn.Conv2d(2, 4, 1), _bn()))
    set_bn_mode(model, "mixed", beta=0.7)
    model.train()
    seen = []

    def hook_for(k):
        def hook(module, inputs, output):
            seen.append((k, module.training, module.mode, module.beta))
        return hook

    pretrained_pass(model, [torch.randn(5, 2, 3, 3), torch.randn(2, 2, 3, 3)], [model[1]], hook_for)
    assert seen == [(0, False, "mixed", 0.0)] * 2
    assert model.training and model[1].mode == "mixed" and model[1].beta == 0.7
    model(torch.randn(3, 2, 3, 3))
    assert len(seen) == 2  # the hook is gone
    with pytest.raises(ValueError, match="convert_bn"):
        bn_input_stats(nn.Linear(2, 2), [torch.randn(1, 2)])
