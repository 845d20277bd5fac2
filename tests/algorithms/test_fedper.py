"""FedPer: which part travels, which stays, and the server's average."""
from __future__ import annotations

import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.fl.algorithm import Env
from pflkit.fl.federation import build_federation
from pflkit.fl.loop import run_rounds
from pflkit.models import build_model
from tests.helpers_data import digits_dataset

FEDPER = ALGORITHMS["fedper"]
HEAD = {"head.weight", "head.bias"}


def _env():
    return Env(model_fn=lambda: build_model("mlp", num_classes=10, input_shape=(1, 8, 8), hidden=(16,)), seed=0)


def _model(env):
    env.seed_torch("init")
    return env.model_fn()


@pytest.fixture(scope="module")
def fed():
    return build_federation(digits_dataset(), "pathological", 8, seed=0, classes_per_client=2)


def _cfg(algo, **kw):
    return algo.make_config({"rounds": 4, "fraction": 0.5, "lr": 0.05, "local_steps": 3, "eval_every": 2, **kw})


def test_fedper_keeps_heads_local_and_averages_bodies(fed):
    env, cfg = _env(), _cfg(FEDPER)
    model = _model(env)
    state = FEDPER.init(model, fed, cfg, env)
    first = FEDPER.broadcast(state, 0, cfg, env)
    assert not HEAD & set(first["shared"]) and set(first["personal"]) == HEAD
    up0, head0 = FEDPER.client_update(first, fed.clients[0], None, cfg, env)
    up1, head1 = FEDPER.client_update(FEDPER.broadcast(state, 1, cfg, env), fed.clients[1], None, cfg, env)
    assert not HEAD & set(up0.payload) and set(head0) == HEAD
    assert not torch.allclose(head0["head.weight"], head1["head.weight"])
    new = FEDPER.aggregate(state, [up0, up1], cfg, env)
    w = torch.tensor([up0.num_samples, up1.num_samples], dtype=torch.float64)
    w = w / w.sum()
    for k in up0.payload:
        torch.testing.assert_close(new["weights"][k], (w[0] * up0.payload[k].double() + w[1] * up1.payload[k].double()).float())
    assert FEDPER.broadcast(new, 0, cfg, env)["personal"] is None  # served once, the head never travels again


def test_fedper_traffic_is_the_body_after_first_contact(fed):
    env, cfg = _env(), _cfg(FEDPER, rounds=6)
    model = _model(env)
    res = run_rounds(FEDPER, cfg, fed, model, env)
    body = sum(p.numel() * 4 for n, p in model.named_parameters() if n not in HEAD)
    assert all(r["bytes_up"] == r["clients"] * body for r in res.history)
    assert res.history[0]["bytes_down"] > res.history[0]["clients"] * body  # first downloads carry the head
    assert res.status == "ok" and 0 <= res.summary["acc"] <= 1


def test_a_split_with_an_empty_part_is_refused(fed):
    env = _env()
    with pytest.raises(ValueError, match="empty part"):
        FEDPER.init(_model(env), fed, FEDPER.make_config({"personal": ["nothing"]}), env)
