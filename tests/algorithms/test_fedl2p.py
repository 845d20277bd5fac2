"""FedL2P as an algorithm bundle (Alg. 1): aggregation, FT equivalences, variants, reports."""
import sys
from dataclasses import replace as dc_replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers_data import digits_dataset, digits_env  # noqa: E402

from pflkit.algorithms.fedl2p import (  # noqa: E402
    FEDL2P, FEDL2P_BNNET, FEDL2P_FOMAML, FEDL2P_LRNET_BETA0, FEDL2P_LRNET_BETA1, L2P, VARIANTS, FedL2PConfig,
    hyperparameter_report,
)
from pflkit.algorithms.finetune import FINETUNE, FineTuneConfig  # noqa: E402
from pflkit.config import ConfigError  # noqa: E402
from pflkit.fl.algorithm import Update  # noqa: E402
from pflkit.fl.federate import build_federation  # noqa: E402
from pflkit.fl.loop import run_rounds  # noqa: E402

SMALL = {"rounds": 1, "fraction": 0.5, "epochs": 1, "meta_iters": 1, "lr": 0.05}


@pytest.fixture(scope="module")
def fed():
    return build_federation(digits_dataset(600), "iid", 4, seed=0)


@pytest.fixture
def env():
    return digits_env(seed=3)


@pytest.fixture
def pretrained(env):
    env.seed_torch("pretrained")
    return env.model_fn()


def test_server_average_of_lambda_matches_a_hand_computation(env):
    a = {"eta_tilde": torch.tensor([1.0, 2.0]), "bnnet.body.4.bias": torch.tensor([0.0])}
    b = {"eta_tilde": torch.tensor([3.0, -2.0]), "bnnet.body.4.bias": torch.tensor([1.0])}
    state = {"weights": {}, "lam": a}
    out = FEDL2P.aggregate(state, [Update(0, 10, a), Update(1, 30, b)], FedL2PConfig(), env)
    # (10 a + 30 b) / 40
    assert out["lam"]["eta_tilde"].tolist() == pytest.approx([2.5, -1.0])
    assert out["lam"]["bnnet.body.4.bias"].tolist() == pytest.approx([0.75])
    assert out["weights"] is state["weights"]


def _constant_lambda(lam: dict, beta: float) -> dict:
    """BNNet outputs beta and LRNet outputs 1 whatever the input: eta = eta_tilde = lr."""
    lam = {k: v.clone() for k, v in lam.items()}
    lam["bnnet.body.4.weight"].zero_()
    lam["bnnet.body.4.bias"].fill_(beta)
    lam["lrnet.body.4.weight"].zero_()
    lam["lrnet.body.4.bias"].fill_(1.0)
    return lam


@pytest.mark.parametrize("bn, beta, stats_init", [("client", 1.0, "reset"), ("global", 0.0, "reset"),
                                                  ("client", 1.0, "pass")])
def test_beta_one_and_zero_with_eta_lr_reproduce_ft_bn_c_and_bn_g(fed, env, pretrained, bn, beta, stats_init):
    cfg = FEDL2P.make_config({**SMALL, "epochs": 2, "client_stats_init": stats_init})
    state = FEDL2P.init(pretrained, fed, cfg, env)
    state["lam"] = _constant_lambda(state["lam"], beta)
    ft_cfg = FineTuneConfig(bn=bn, epochs=2, lr=cfg.lr, batch_size=cfg.batch_size, client_stats_init=stats_init)
    ft_state = FINETUNE.init(pretrained, fed, ft_cfg, env)
    for cid in (0, 2):
        ours = FEDL2P.evaluate(state, fed.clients[cid], None, cfg, env, "test")
        ft = FINETUNE.evaluate(ft_state, fed.clients[cid], None, ft_cfg, env, "test")
        assert ours["correct"] == ft["correct"] and ours["n"] == ft["n"]
        assert ours["loss"] == pytest.approx(ft["loss"], rel=1e-5)
        assert ours["beta_mean"] == beta and ours["sparsity"] == 0.0


def test_client_update_moves_lambda_deterministically(fed, env, pretrained):
    cfg = FEDL2P.make_config(SMALL)
    state = FEDL2P.init(pretrained, fed, cfg, env)
    msg = FEDL2P.broadcast(state, 1, cfg, env)
    upd, cs = FEDL2P.client_update(msg, fed.clients[1], None, cfg, env)
    again, _ = FEDL2P.client_update(msg, fed.clients[1], None, cfg, env)
    assert cs is None and upd.num_samples == fed.clients[1].num("train") + fed.clients[1].num("val")
    assert set(upd.metrics) >= {"loss", "val_loss", "beta_mean", "sparsity"}
    assert all(torch.isfinite(torch.tensor(v)) for v in upd.metrics.values())
    assert upd.payload.keys() == state["lam"].keys()
    assert all(torch.equal(upd.payload[k], again.payload[k]) for k in upd.payload)
    moved = {k.split(".")[0] for k in upd.payload if not torch.equal(upd.payload[k], state["lam"][k])}
    assert moved == {"bnnet", "lrnet", "eta_tilde"}  # every group of lambda gets a hypergradient step
    # one SGD step with clipped gradients: no entry moves by more than zeta * clip
    zeta = dict(zip(("bnnet", "lrnet", "eta_tilde"), cfg.zeta))
    for k in upd.payload:
        step = (upd.payload[k] - state["lam"][k]).abs().max()
        assert float(step) <= zeta[k.split(".")[0]] * cfg.clip * (1 + 1e-6)


def test_l2p_learns_lambda_locally_and_never_averages(fed, env, pretrained):
    cfg = L2P.make_config(SMALL)
    state = L2P.init(pretrained, fed, cfg, env)
    msg = L2P.broadcast(state, 0, cfg, env)
    upd, lam0 = L2P.client_update(msg, fed.clients[0], None, cfg, env)
    assert upd.payload is None and isinstance(lam0, dict)
    _, lam0_second = L2P.client_update(msg, fed.clients[0], lam0, cfg, env)  # continues from its own lambda
    assert not torch.equal(lam0_second["eta_tilde"], lam0["eta_tilde"])
    assert L2P.aggregate(state, [upd], cfg, env) is state
    rows = hyperparameter_report(state, fed, cfg, env, client_states={0: lam0_second}, clients=[0, 1])
    server = hyperparameter_report(state, fed, cfg, env, clients=[0])
    assert rows[0]["eta"] != server[0]["eta"]  # client 0 personalizes with its own lambda


def test_variants_are_config_switches(fed, env, pretrained):
    assert [a.label for a in VARIANTS] == ["FedL2P", "L2P", "FedL2P (FOMAML+)", "FedL2P (BNNet)",
                                           "FedL2P (LRNet) beta=1", "FedL2P (LRNet) beta=0"]
    assert len({a.name for a in VARIANTS}) == len(VARIANTS) and all(a.needs_pretrained for a in VARIANTS)
    assert FEDL2P_FOMAML.make_config().meta_grad == "fomaml"
    bn_only = FEDL2P_BNNET.init(pretrained, fed, FEDL2P_BNNET.make_config(), env)["lam"]
    assert all(k.startswith("bnnet.") for k in bn_only)
    for algo, beta in ((FEDL2P_LRNET_BETA1, 1.0), (FEDL2P_LRNET_BETA0, 0.0)):
        cfg = algo.make_config(SMALL)
        state = algo.init(pretrained, fed, cfg, env)
        assert not any(k.startswith("bnnet.") for k in state["lam"])
        row = hyperparameter_report(state, fed, cfg, env, clients=[3])[0]
        assert set(row["beta"].values()) == {beta}


@pytest.mark.parametrize("algo", [FEDL2P, FEDL2P_FOMAML])
def test_a_round_through_the_loop(fed, env, pretrained, algo):
    cfg = algo.make_config({**SMALL, "eval_every": 0})
    result = run_rounds(algo, cfg, fed, pretrained, env)
    assert result.status == "ok" and result.best_round == 1  # selected by the clients' validation loss
    assert len(result.per_client) == fed.num_clients
    assert result.history[0]["client_val_loss"] > 0


def test_report_sparsity_counts_parameters_with_zero_learning_rate(fed, env, pretrained):
    cfg = FEDL2P.make_config(SMALL)
    state = FEDL2P.init(pretrained, fed, cfg, env)
    names = [n for n, _ in pretrained.named_parameters()]
    sizes = [p.numel() for _, p in pretrained.named_parameters()]
    state["lam"]["eta_tilde"][:2] = 0.0
    row = hyperparameter_report(state, fed, cfg, env, clients=[0])[0]
    assert list(row["eta"]) == names and row["eta"][names[0]] == 0.0 and row["eta"][names[2]] > 0
    assert row["sparsity"] == pytest.approx(sum(sizes[:2]) / sum(sizes))
    assert row["tensor_sparsity"] == pytest.approx(2 / len(names))
    assert len(row["xi"]) == len(row["beta"]) and len(row["features"]) % 2 == 0


@pytest.mark.parametrize("values, key", [
    ({"zeta": (1e-3, 1e-3)}, "zeta"),
    ({"momentum": 0.9}, "momentum"),
    ({"meta_grad": "maml"}, "meta_grad"),
    ({"use_bnnet": False, "use_lrnet": False}, "use_bnnet"),
    ({"meta_iters": 0}, "meta_iters"),
    ({"psi": 0.0}, "psi"),
    ({"lt_mode": "extra_step"}, "lt_mode"),
    ({"meta_schedule": "epochs"}, "meta_schedule"),
    ({"client_stats_init": "zeros"}, "client_stats_init"),
    ({"second_order": True}, "second_order"),
    ({"val_batch_size": -1}, "val_batch_size"),
])
def test_bad_config_values_name_the_key(values, key):
    with pytest.raises(ConfigError, match=key):
        FEDL2P.make_config(values)


def test_paper_defaults():
    cfg = FedL2PConfig()
    assert (cfg.neumann_steps, cfg.psi, cfg.zeta, cfg.clip, cfg.batch_size, cfg.lr) == \
        (3, 0.1, (1e-3, 1e-3, 1e-4), 1.0, 32, 1e-3)
    assert cfg.select == "update_val_loss" and cfg.meta_grad == "ift" and cfg.epochs == 15
    # the authors' code: 3 passes over the validation split in batches of 32, L_T through the last
    # fine-tuning step in evaluation mode, client BN statistics reset to 0 / 1
    assert (cfg.meta_iters, cfg.meta_schedule, cfg.val_batch_size) == (3, "passes", 32)
    assert (cfg.lt_mode, cfg.client_stats_init, cfg.second_order) == ("last_step", "reset", False)
    assert FEDL2P.make_config({"lt_mode": "lookahead", "second_order": True}).second_order
    assert dc_replace(cfg, epochs=5).epochs == 5
