"""pFedMe: one local round against the closed form, the prox pull, the server's beta mixing."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pflkit.algorithms import ALGORITHMS
from pflkit.fl.algorithm import Update
from pflkit.fl.loop import run_rounds
from tests.algorithms.conftest import init_model, mlp_env, pathological_fed

PFEDME = ALGORITHMS["pfedme"]


@pytest.fixture(scope="module")
def fed():
    return pathological_fed(30)


def _grad(model, weights, x, y):
    params = {k: v.clone().requires_grad_() for k, v in weights.items()}
    loss = F.cross_entropy(functional_call(model, params, (x,)), y)
    return dict(zip(params, torch.autograd.grad(loss, list(params.values()))))


def test_one_round_one_inner_step_matches_the_closed_form(fed):
    """R = K = 1 from w: theta = w - plr grad f(w) (the prox term vanishes at theta = w),
    then w_i = w - lr lam (w - theta) = w - lr lam plr grad f(w)."""
    env = mlp_env()
    cfg = PFEDME.make_config({"local_steps": 1, "inner_steps": 1, "lam": 15.0, "personal_lr": 0.05, "lr": 0.01,
                              "batch_size": 64})
    client = fed.clients[3]
    assert client.num("train") < 64
    w = init_model(env).state_dict()
    up, _ = PFEDME.client_update({k: v.clone() for k, v in w.items()}, client, None, cfg, env)
    g = _grad(env.model_fn(), w, *client.tensors("train"))
    for k in w:
        torch.testing.assert_close(up.payload[k], w[k] - 0.01 * 15.0 * 0.05 * g[k], rtol=1e-4, atol=1e-6)


def test_strong_prox_keeps_the_personal_model_near_the_local_model(fed):
    env = mlp_env()
    w = init_model(env).state_dict()
    dist = {}
    for lam in (0.1, 50.0):
        cfg = PFEDME.make_config({"local_steps": 3, "inner_steps": 5, "lam": lam, "personal_lr": 0.01,
                                  "eval_mode": "last"})
        up, theta = PFEDME.client_update(dict(w), fed.clients[0], None, cfg, env)
        dist[lam] = sum(float(((theta[k] - up.payload[k]) ** 2).sum()) for k in w)
    assert dist[50.0] < 0.1 * dist[0.1]


def test_server_mixes_with_beta(fed):
    env = mlp_env()
    cfg = PFEDME.make_config({"beta": 2.0})
    state = PFEDME.init(init_model(env), fed, cfg, env)
    a = {k: torch.randn_like(v) for k, v in state["weights"].items()}
    b = {k: torch.randn_like(v) for k, v in state["weights"].items()}
    new = PFEDME.aggregate(state, [Update(0, 1, a), Update(1, 3, b)], cfg, env)
    for k, old in state["weights"].items():
        torch.testing.assert_close(new["weights"][k], -1.0 * old + 2.0 * (0.25 * a[k] + 0.75 * b[k]), rtol=1e-5, atol=1e-5)


def test_runs_and_personalizes(fed):
    env = mlp_env()
    cfg = PFEDME.make_config({"rounds": 3, "fraction": 0.2, "local_steps": 2, "eval_every": 0})
    res = run_rounds(PFEDME, cfg, fed, init_model(env), env)
    assert res.status == "ok" and len(res.per_client) == 30
