import pytest

from pflkit.algorithms import ALGORITHMS
from pflkit.config import ConfigError
from pflkit.fl.federation import build_federation
from pflkit.fl.loop import run_rounds
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
