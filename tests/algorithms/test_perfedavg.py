"""Per-FedAvg (FO / HF): the local step against hand computations, Hessian-vector products."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pflkit.algorithms import ALGORITHMS
from pflkit.algorithms import perfedavg
from pflkit.fl.loop import run_rounds
from tests.algorithms.conftest import init_model, mlp_env, pathological_fed

FO, HF = ALGORITHMS["perfedavg"], ALGORITHMS["perfedavg_hf"]


@pytest.fixture(scope="module")
def fed():
    return pathological_fed(30)


def _loss(model, params, x, y):
    return F.cross_entropy(functional_call(model, params, (x,)), y)


def _hand_step(model, w, x, y, alpha, beta, hf):
    p = {k: v.clone().requires_grad_() for k, v in w.items()}
    g1 = torch.autograd.grad(_loss(model, p, x, y), list(p.values()))
    tmp = {k: (v - alpha * g).detach().requires_grad_() for (k, v), g in zip(p.items(), g1)}
    g2 = dict(zip(tmp, torch.autograd.grad(_loss(model, tmp, x, y), list(tmp.values()))))
    if not hf:
        return {k: w[k] - beta * g2[k] for k in w}
    _, hv = torch.func.jvp(lambda q: torch.func.grad(lambda r: _loss(model, r, x, y))(q), (dict(w),), (g2,))
    return {k: w[k] - beta * (g2[k] - alpha * hv[k]) for k in w}


@pytest.mark.parametrize("algo,hvp", [(FO, "finite_difference"), (HF, "finite_difference"), (HF, "exact")])
def test_local_step_matches_hand_computation(fed, algo, hvp):
    env = mlp_env()
    cfg = algo.make_config({"local_steps": 1, "alpha": 0.1, "lr": 0.05, "batch_size": 64, "hvp": hvp})
    client = fed.clients[2]
    assert client.num("train") < 64  # D, D', D'' are all the whole train split
    w = dict(init_model(env).state_dict())
    up, _ = algo.client_update(dict(w), client, None, cfg, env)
    want = _hand_step(env.model_fn(), w, *client.tensors("train"), 0.1, 0.05, algo is HF)
    tol = {"rtol": 1e-4, "atol": 2e-6} if hvp != "finite_difference" or algo is FO else {"rtol": 1e-3, "atol": 2e-5}
    for k in w:
        torch.testing.assert_close(up.payload[k], want[k], **tol)
    if algo is HF:  # the correction term is really there
        fo = _hand_step(env.model_fn(), w, *client.tensors("train"), 0.1, 0.05, False)
        assert max(float((fo[k] - want[k]).abs().max()) for k in w) > 10 * tol["atol"]


def test_evaluation_personalizes_with_one_step_of_alpha(fed):
    env = mlp_env()
    cfg = FO.make_config({"alpha": 0.2, "batch_size": 64, "personalize_steps": 1})
    client = fed.clients[4]
    w = dict(init_model(env).state_dict())
    model = perfedavg.personalized(w, client, cfg, env)
    x, y = client.tensors("train")
    p = {k: v.clone().requires_grad_() for k, v in w.items()}
    g = torch.autograd.grad(_loss(env.model_fn(), p, x, y), list(p.values()))
    for (k, v), gk in zip(w.items(), g):
        torch.testing.assert_close(model.state_dict()[k], v - 0.2 * gk, rtol=1e-4, atol=1e-6)


def test_exports_the_meta_learned_global_model(fed):
    env = mlp_env()
    cfg = HF.make_config({"rounds": 2, "fraction": 0.2, "local_steps": 2, "eval_every": 0})
    res = run_rounds(HF, cfg, fed, init_model(env), env)
    assert HF.exports_global and res.status == "ok"
    assert set(HF.global_model(res.state)) == set(init_model(env).state_dict())
