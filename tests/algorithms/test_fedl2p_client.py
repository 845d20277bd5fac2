"""One FedL2P client (pflkit.algorithms.fedl2p_client): the client's BN statistics before
fine-tuning, the batches a meta step draws, and the meta schedule (Alg. 1 lines 6-11)."""
import sys
from dataclasses import replace as dc_replace
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers_data import digits_dataset, digits_env  # noqa: E402

from pflkit.algorithms import fedl2p_client  # noqa: E402
from pflkit.algorithms.fedl2p import FEDL2P  # noqa: E402
from pflkit.fl.federation import Client  # noqa: E402
from pflkit.fl.train import get_state  # noqa: E402
from pflkit.models.mixed_bn import mixed_bn_layers  # noqa: E402



SMALL = {"rounds": 1, "fraction": 0.5, "epochs": 1, "meta_iters": 1, "lr": 0.05}


def _client(n_train=100, n_val=70):
    ds = digits_dataset(400)
    splits = {"train": np.arange(n_train), "val": np.arange(n_train, n_train + n_val),
              "test": np.arange(300, 330)}
    return Client(0, ds.x_train, ds.y_train, splits, ds.meta)


@pytest.fixture
def env():
    return digits_env(seed=3)


@pytest.fixture
def weights(env):
    env.seed_torch("pretrained")
    return get_state(env.model_fn())


@pytest.mark.parametrize("how", ["reset", "pass"])
def test_client_statistics_before_fine_tuning(env, weights, how):
    cfg = FEDL2P.make_config({**SMALL, "client_stats_init": how})
    ctx = fedl2p_client.prepare_client(weights, _client(), cfg, env)
    layers = mixed_bn_layers(ctx.model)
    names = {id(m): n for n, m in ctx.model.named_modules()}
    assert layers and len(ctx.stats.bn_stats) == len(layers)
    for layer, (mean, var) in zip(layers, ctx.stats.bn_stats):
        pre = names[id(layer)]
        got_mean, got_var = ctx.buffers[f"{pre}.client_mean"], ctx.buffers[f"{pre}.client_var"]
        if how == "reset":  # the authors' code: mean 0, variance 1, exactly
            assert torch.equal(got_mean, torch.zeros_like(got_mean)) and torch.equal(got_var, torch.ones_like(got_var))
            assert torch.equal(layer.client_mean, got_mean) and torch.equal(layer.client_var, got_var)
        else:  # the earlier reading: the moments of the pass over the train split
            assert torch.equal(got_mean, mean) and torch.equal(got_var, var)
            assert not torch.equal(got_mean, torch.zeros_like(got_mean))
        assert torch.equal(ctx.buffers[f"{pre}.running_mean"], weights[f"{pre}.running_mean"])


def test_bnnet_input_comes_from_the_pass_in_both_modes(env, weights):
    xi = [fedl2p_client.prepare_client(weights, _client(), FEDL2P.make_config({**SMALL, "client_stats_init": h}), env)
          .stats.xi for h in ("reset", "pass")]
    assert torch.equal(xi[0], xi[1]) and (xi[0] > 0).all()


@pytest.mark.parametrize("lt_mode, extra", [("last_step", 1), ("lookahead", 2)])
def test_batches_drawn_by_a_meta_step(env, weights, lt_mode, extra):
    """The default L_T takes no extra step: beyond the e epochs only its loss batch is drawn."""
    cfg = FEDL2P.make_config({**SMALL, "epochs": 2, "lt_mode": lt_mode})
    client = dc_replace(_client())
    calls = {"epochs": 0, "random": []}
    batches, random_batch = client.batches, client.random_batch

    def count_batches(split, *a, **k):
        calls["epochs"] += split == "train"
        return batches(split, *a, **k)

    def count_random(split, *a, **k):
        calls["random"].append(split)
        return random_batch(split, *a, **k)

    client.batches, client.random_batch = count_batches, count_random
    ctx = fedl2p_client.prepare_client(weights, client, cfg, env)
    lam = FEDL2P.init(env.model_fn(), None, cfg, env)["lam"]
    val_b = client.tensors("val")
    calls["epochs"] = 0  # (the statistics passes of prepare_client)
    new, row = fedl2p_client.meta_step(ctx, lam, cfg, torch.Generator().manual_seed(0), val_batch=val_b)
    assert calls["epochs"] == 2 and calls["random"] == ["train"] * extra
    assert any(not torch.equal(new[k], lam[k]) for k in lam) and np.isfinite(row["val_loss"])


def test_meta_schedule_passes_over_the_validation_split(env, weights, monkeypatch):
    """|V| = 70, 3 passes in batches of 32: 3 * ceil(70 / 32) = 9 meta steps of 32, 32, 6 samples."""
    client = _client(n_val=70)
    cfg = FEDL2P.make_config({**SMALL, "meta_iters": 3})
    assert (cfg.meta_schedule, cfg.val_batch_size) == ("passes", 32)
    sizes, seen = [], []
    for xb, yb in fedl2p_client.val_schedule(client, cfg, torch.Generator().manual_seed(0), None):
        sizes.append(len(yb))
        seen.append(xb.reshape(len(yb), -1))
    assert sizes == [32, 32, 6] * 3 and fedl2p_client.num_meta_steps(client, cfg) == 9
    full = client.tensors("val")[0].reshape(70, -1)
    for k in range(3):  # every pass is a permutation of the validation split
        rows = torch.cat(seen[3 * k:3 * k + 3])
        assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, full.tolist()))
    assert not torch.equal(torch.cat(seen[:3]), full)  # shuffled

    got = []

    def fake_step(ctx, lam, cfg, gen, where="FedL2P", val_batch=None):
        got.append(None if val_batch is None else len(val_batch[1]))
        return lam, {"loss": 0.0, "val_loss": 0.0}

    monkeypatch.setattr(fedl2p_client, "meta_step", fake_step)
    ctx = fedl2p_client.prepare_client(weights, client, cfg, env)
    lam = FEDL2P.init(env.model_fn(), None, cfg, env)["lam"]
    fedl2p_client.meta_learn(ctx, lam, cfg, env)
    assert got == [32, 32, 6] * 3
    got.clear()
    steps = FEDL2P.make_config({**SMALL, "meta_iters": 3, "meta_schedule": "steps", "val_batch_size": 0})
    fedl2p_client.meta_learn(ctx, lam, steps, env)
    assert got == [None] * 3 and fedl2p_client.num_meta_steps(client, steps) == 3
    whole = FEDL2P.make_config({**SMALL, "meta_iters": 2, "val_batch_size": 0})
    got.clear()
    fedl2p_client.meta_learn(ctx, lam, whole, env)
    assert got == [70, 70]
