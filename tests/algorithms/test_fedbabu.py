"""FedBABU: the head stays at its initialization during federated training; fine-tuning personalizes."""
import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.algorithms.fedbabu import FEDBABU, aggregate
from pflkit.config import ConfigError
from pflkit.fl.algorithm import Update
from pflkit.fl.loop import run_rounds
from pflkit.fl.train import evaluate_model, get_state, set_state
from tests.algorithms.conftest import SGD_ROUNDS, init_model, shards_fed
from tests.helpers_data import digits_env

@pytest.fixture(scope="module")
def fed():
    return shards_fed(4)


def _run(fed, **kw):
    env = digits_env()
    model = init_model(env)
    init = get_state(model)
    return run_rounds(FEDBABU, FEDBABU.make_config({**SGD_ROUNDS, **kw}), fed, model, env), init, env


def test_head_is_frozen_body_learns_and_only_the_body_travels(fed):
    res, init, env = _run(fed, finetune_epochs=2)
    w = FEDBABU.global_model(res.state)
    assert FEDBABU.exports_global and ALGORITHMS["fedbabu"] is FEDBABU
    assert torch.equal(w["head.weight"], init["head.weight"]) and torch.equal(w["head.bias"], init["head.bias"])
    assert not torch.equal(w["body.0.weight"], init["body.0.weight"])
    head_bytes = (init["head.weight"].numel() + init["head.bias"].numel()) * 4
    total = sum(v.numel() * v.element_size() for v in init.values())
    assert res.history[-1]["bytes_up"] == fed.num_clients * (total - head_bytes)
    # fine-tuning (the personalization step) beats the global model under two-class shards
    glob = [evaluate_model(set_state(env.model_fn(), w), c, "test")["acc"] for c in fed.clients]
    assert res.summary["acc"] > sum(glob) / len(glob)


def test_zero_finetune_epochs_is_the_global_model(fed):
    res, _, env = _run(fed, finetune_epochs=0, rounds=1)
    for cid, m in res.per_client.items():
        ref = evaluate_model(set_state(env.model_fn(), res.state["weights"]), fed.clients[cid], "test")
        assert m["correct"] == ref["correct"]


def test_server_averages_the_bodies_by_sample_count():
    state = {"weights": {"body.w": torch.zeros(2), "head.weight": torch.ones(1)}}
    ups = [Update(0, 1, {"body.w": torch.tensor([1.0, 2.0])}), Update(1, 3, {"body.w": torch.tensor([5.0, 6.0])})]
    out = aggregate(state, ups, None, None)["weights"]
    assert torch.allclose(out["body.w"], torch.tensor([4.0, 5.0])) and torch.equal(out["head.weight"], torch.ones(1))


@pytest.mark.parametrize("key, value", [("finetune_part", "body"), ("finetune_epochs", -1), ("finetune_lr", -0.1)])
def test_bad_settings(key, value):
    with pytest.raises(ConfigError, match=key):
        FEDBABU.make_config({key: value})
