import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.algorithms.finetune import prepare
from pflkit.config import ConfigError
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from pflkit.fl.train import client_batches
from pflkit.models.mixed_bn import bn_input_stats, mixed_bn_layers
from tests.helpers_data import digits_dataset, digits_env

FT, FEDAVG = ALGORITHMS["finetune"], ALGORITHMS["fedavg"]


@pytest.fixture(scope="module")
def setup():
    fed = build_federation(digits_dataset(), "dirichlet", 6, seed=0, alpha=0.1)
    env = digits_env()
    env.seed_torch("init")
    cfg = FEDAVG.make_config({"rounds": 6, "fraction": 0.5, "lr": 0.05, "momentum": 0.9, "batch_size": 16})
    pre = run_rounds(FEDAVG, cfg, fed, env.model_fn(), env)
    return fed, env, pre


def _ft(setup, **kw):
    fed, env, pre = setup
    model = env.model_fn()
    model.load_state_dict(pre.state["weights"])
    return run_rounds(FT, FT.make_config({"epochs": 3, "lr": 0.01, "batch_size": 16, **kw}), fed, model, env)


def test_zero_epochs_bn_global_equals_the_global_model(setup):
    """FT (BN G) with no fine-tuning is the pretrained model evaluated as it is."""
    fed, env, pre = setup
    res = _ft(setup, bn="global", epochs=0)
    for cid, m in pre.per_client.items():
        assert res.per_client[cid]["correct"] == m["correct"]
        assert res.per_client[cid]["loss"] == pytest.approx(m["loss"], rel=1e-5)


def test_fine_tuning_beats_the_global_model_under_strong_label_shift(setup):
    """FedL2P Table 2, alpha = 0.1: every FT baseline is above the global model."""
    fed, env, pre = setup
    for bn in ("client", "global", "batch"):
        res = _ft(setup, bn=bn)
        assert res.status == "ok"
        assert res.summary["acc"] > pre.summary["acc"], (bn, res.summary, pre.summary)


def test_bad_bn_mode_is_rejected_before_work():
    with pytest.raises(ConfigError, match="bn"):
        FT.make_config({"bn": "clients"})
    with pytest.raises(ConfigError, match="client_stats_init"):
        FT.make_config({"client_stats_init": "zeros"})


@pytest.mark.parametrize("how", ["reset", "pass"])
def test_ft_bn_c_client_statistics_before_fine_tuning(setup, how):
    """Options: mean 0 / variance 1 before the first step (the authors' start for FedL2P's mixed BN, not for
    their FT baselines), or one pass. The default for FT (BN C) is the authors' ``pretrained`` (below); the
    other BN modes, which never read the client's statistics, resolve it to ``reset``."""
    fed, env, pre = setup
    client = fed.clients[1]
    cfg = FT.make_config({"client_stats_init": how})
    assert FT.make_config({"bn": "client"}).client_stats_init == "pretrained"
    assert FT.make_config({"bn": "global"}).client_stats_init == "reset"
    model = prepare(pre.state["weights"], client, "client", env, cfg.client_stats_init)
    layers = mixed_bn_layers(model)
    assert layers
    if how == "reset":
        for layer in layers:
            assert torch.equal(layer.client_mean, torch.zeros_like(layer.client_mean))
            assert torch.equal(layer.client_var, torch.ones_like(layer.client_var))
    else:
        moments = bn_input_stats(model, client_batches(client, "train", device=env.device))
        for layer, (mean, var) in zip(layers, moments):
            torch.testing.assert_close(layer.client_mean, mean, rtol=0, atol=0)
            torch.testing.assert_close(layer.client_var, var, rtol=0, atol=0)


def test_the_start_of_the_statistics_changes_ft_bn_c(setup):
    reset = _ft(setup, bn="client", epochs=1, client_stats_init="reset")
    passed = _ft(setup, bn="client", epochs=1, client_stats_init="pass")
    assert any(reset.per_client[c]["loss"] != passed.per_client[c]["loss"] for c in reset.per_client)


def test_pretrained_statistics_start_where_the_authors_ft_baseline_starts(setup):
    """``client_stats_init="pretrained"`` (royson/fedl2p classification_client.py: the whole pretrained state
    dict, BN buffers included, then momentum updates in train mode): the client's statistics start at the
    pretrained running statistics, and FT (BN C) then gives other numbers than with the reset."""
    fed, env, pre = setup
    model = prepare(pre.state["weights"], fed.clients[1], "client", env, "pretrained")
    layers = mixed_bn_layers(model)
    assert layers and any(float(layer.running_mean.abs().sum()) > 0 for layer in layers)
    for layer in layers:
        assert torch.equal(layer.client_mean, layer.running_mean) and torch.equal(layer.client_var, layer.running_var)
    reset = _ft(setup, bn="client", epochs=1, client_stats_init="reset")
    kept = _ft(setup, bn="client", epochs=1, client_stats_init="pretrained")
    assert any(reset.per_client[c]["loss"] != kept.per_client[c]["loss"] for c in reset.per_client)
    assert _ft(setup, bn="client", epochs=1).per_client == kept.per_client  # FT (BN C)'s default
    # FT (BN G) never reads the client's statistics: the option leaves it as it is
    g, g_kept = _ft(setup, bn="global", epochs=1), _ft(setup, bn="global", epochs=1, client_stats_init="pretrained")
    assert g.per_client == g_kept.per_client


def test_personalization_on_the_whole_training_partition(setup):
    """``personalize_on="train_val"`` fine-tunes on the train and validation splits together (the authors'
    whole training partition); the default is the train split, and stays out of the fingerprint."""
    from pflkit.algorithms.finetune import personalization_client
    from pflkit.config import to_dict

    fed, env, pre = setup
    client = fed.clients[2]
    whole = personalization_client(client, "train_val")
    assert whole.num("train") == client.num("train") + client.num("val") and whole.num("test") == client.num("test")
    assert personalization_client(client, "train") is client
    train, both = _ft(setup, bn="global"), _ft(setup, bn="global", personalize_on="train_val")
    assert any(train.per_client[c]["loss"] != both.per_client[c]["loss"] for c in train.per_client)
    assert "personalize_on" not in to_dict(FT.make_config({}))  # results made before the option keep their digest
    assert to_dict(FT.make_config({"personalize_on": "train_val"}))["personalize_on"] == "train_val"
    with pytest.raises(ConfigError, match="personalize_on"):
        FT.make_config({"personalize_on": "all"})
    with pytest.raises(ConfigError, match="client_stats_init"):
        FT.make_config({"client_stats_init": "pretrain"})
