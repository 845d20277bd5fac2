"""FedPer: which part travels, which stays, and the server's average."""
from __future__ import annotations

import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.fl.loop import run_rounds
from tests.algorithms.conftest import head_sharing_cfg, init_model, mlp_env, pathological_fed

FEDPER = ALGORITHMS["fedper"]
HEAD = {"head.weight", "head.bias"}


@pytest.fixture(scope="module")
def fed():
    return pathological_fed(8)


def test_fedper_keeps_heads_local_and_averages_bodies(fed):
    env, cfg = mlp_env(), head_sharing_cfg(FEDPER)
    model = init_model(env)
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
    env, cfg = mlp_env(), head_sharing_cfg(FEDPER, rounds=6)
    model = init_model(env)
    res = run_rounds(FEDPER, cfg, fed, model, env)
    body = sum(p.numel() * 4 for n, p in model.named_parameters() if n not in HEAD)
    assert all(r["bytes_up"] == r["clients"] * body for r in res.history)
    assert res.history[0]["bytes_down"] > res.history[0]["clients"] * body  # first downloads carry the head
    assert res.status == "ok" and 0 <= res.summary["acc"] <= 1


def test_a_split_with_an_empty_part_is_refused(fed):
    env = mlp_env()
    with pytest.raises(ValueError, match="empty part"):
        FEDPER.init(init_model(env), fed, FEDPER.make_config({"personal": ["nothing"]}), env)
