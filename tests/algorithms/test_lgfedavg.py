"""LG-FedAvg: local bodies, a global head averaged by the server."""
from __future__ import annotations

import pytest

from pflkit.algorithms import ALGORITHMS
from pflkit.fl.algorithm import Env
from pflkit.fl.federation import build_federation
from pflkit.fl.engines import nbytes
from pflkit.fl.loop import run_rounds
from pflkit.models import build_model
from tests.helpers_data import digits_dataset

LG = ALGORITHMS["lgfedavg"]
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


def test_lgfedavg_sends_only_the_global_head(fed):
    env, cfg = _env(), _cfg(LG)
    model = _model(env)
    assert LG.needs_pretrained
    state = LG.init(model, fed, cfg, env)
    assert set(state["weights"]) == HEAD
    up, body = LG.client_update(LG.broadcast(state, 2, cfg, env), fed.clients[2], None, cfg, env)
    assert set(up.payload) == HEAD and not HEAD & set(body)
    assert nbytes(up.payload) == sum(p.numel() * 4 for n, p in model.named_parameters() if n in HEAD)
    res = run_rounds(LG, cfg, fed, model, env)
    assert res.status == "ok"


def test_a_split_with_nothing_local_is_refused(fed):
    env = _env()
    with pytest.raises(ValueError, match="empty part"):
        LG.init(_model(env), fed, LG.make_config({"global_layers": ["hidden", "head"]}), env)
