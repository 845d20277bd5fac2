"""LG-FedAvg: local bodies, a global head averaged by the server."""
from __future__ import annotations

import pytest

from pflkit.algorithms import ALGORITHMS
from pflkit.fl.engines import nbytes
from pflkit.fl.loop import run_rounds
from tests.algorithms.conftest import head_sharing_cfg, init_model, mlp_env, pathological_fed

LG = ALGORITHMS["lgfedavg"]
HEAD = {"head.weight", "head.bias"}


@pytest.fixture(scope="module")
def fed():
    return pathological_fed(8)


def test_lgfedavg_sends_only_the_global_head(fed):
    env, cfg = mlp_env(), head_sharing_cfg(LG)
    model = init_model(env)
    assert LG.needs_pretrained
    state = LG.init(model, fed, cfg, env)
    assert set(state["weights"]) == HEAD
    up, body = LG.client_update(LG.broadcast(state, 2, cfg, env), fed.clients[2], None, cfg, env)
    assert set(up.payload) == HEAD and not HEAD & set(body)
    assert nbytes(up.payload) == sum(p.numel() * 4 for n, p in model.named_parameters() if n in HEAD)
    res = run_rounds(LG, cfg, fed, model, env)
    assert res.status == "ok"


def test_a_split_with_nothing_local_is_refused(fed):
    env = mlp_env()
    with pytest.raises(ValueError, match="empty part"):
        LG.init(init_model(env), fed, LG.make_config({"global_layers": ["hidden", "head"]}), env)
