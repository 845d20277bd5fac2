"""pFedHN / pFedHN-PC: the server update against independent computations, what travels, variants."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pflkit.algorithms import ALGORITHMS
from pflkit.algorithms import hypernet as hn
from pflkit.algorithms import pfedhn
from pflkit.config import ConfigError
from pflkit.data.base import Dataset, DatasetMeta
from pflkit.fl.algorithm import Env, Update
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from pflkit.models import build_model
from tests.algorithms.conftest import init_model, mlp_env, pathological_fed
from tests.helpers_data import digits_dataset

PFEDHN, PFEDHN_PC = ALGORITHMS["pfedhn"], ALGORITHMS["pfedhn_pc"]


@pytest.fixture(scope="module")
def fed():
    # 30 clients of about 40 samples: each client's train split (< 64) is one whole batch
    return pathological_fed(30)


def _cfg(algo=PFEDHN, **kw):
    base = {"rounds": 3, "local_steps": 2, "eval_every": 0, "lr": 0.05, "hidden": 12, "depth": 2}
    return algo.make_config({**base, **kw})


def _plain(algo=PFEDHN, **kw):
    """No momentum, decay or clipping anywhere: the update is exactly the surrogate gradient step."""
    return _cfg(algo, momentum=0.0, weight_decay=0.0, max_grad_norm=0.0, server_momentum=0.0,
                server_weight_decay=0.0, server_max_grad_norm=0.0, **kw)


def _net(state):
    net = hn.build(state["spec"])
    net.load_state_dict(state["hnet"])
    return net


def test_surrogate_grads_equal_autograd_of_the_surrogate_loss(fed):
    env = mlp_env()
    state = PFEDHN.init(init_model(env), fed, _cfg(), env)
    gen = torch.Generator().manual_seed(1)
    rows = [3, 7]
    deltas = [{k: 0.1 * torch.randn(s, generator=gen) for k, s in state["spec"]["targets"].items()} for _ in rows]
    # independent: 1/2 ||theta_tilde - h(v; phi)||^2 with theta_tilde = h + delta held fixed
    net = _net(state)
    loss = 0.0
    for r, d in zip(rows, deltas):
        theta = net(r)
        tilde = {k: (theta[k] + d[k]).detach() for k in d}
        loss = loss + 0.5 * sum(((tilde[k] - theta[k]) ** 2).sum() for k in d)
    expected = torch.autograd.grad(loss, list(net.parameters()))
    got = hn.surrogate_grads(hn.materialize(state["spec"], state["hnet"]), rows, deltas)
    for (name, _), e in zip(net.named_parameters(), expected):
        torch.testing.assert_close(got[name], e, rtol=1e-5, atol=1e-6)
    assert got["embeddings"][0].abs().sum() == 0 and got["embeddings"][3].abs().sum() > 0


def test_aggregate_is_one_sgd_step_on_the_surrogate_mean_over_clients(fed):
    env, cfg = mlp_env(), _plain(server_lr=0.3)
    state = PFEDHN.init(init_model(env), fed, cfg, env)
    gen = torch.Generator().manual_seed(2)
    ups = [Update(c, 10, {"delta": {k: 0.05 * torch.randn(s, generator=gen) for k, s in state["spec"]["targets"].items()}})
           for c in (4, 9)]
    new = PFEDHN.aggregate(state, ups, cfg, env)
    per = [hn.surrogate_grads(hn.materialize(state["spec"], state["hnet"]), [u.client_id], [u.payload["delta"]])
           for u in ups]
    for name, p in state["hnet"].items():
        if name == "embeddings":
            # each v_i moves by its own full gradient; other rows stay
            want = p - 0.3 * (per[0][name] + per[1][name])
        else:
            want = p - 0.3 * 0.5 * (per[0][name] + per[1][name])
        torch.testing.assert_close(new["hnet"][name], want, rtol=1e-5, atol=1e-6)
    # the input state is not modified
    torch.testing.assert_close(state["hnet"]["embeddings"], PFEDHN.init(init_model(env), fed, cfg, env)["hnet"]["embeddings"])


def test_one_local_step_gives_the_plain_chain_rule_gradient(fed):
    """K = 1: phi <- phi - alpha * eta * grad_phi L_i(h(v_i; phi)) (sec. 3.2, App. C.2.1)."""
    env, eta, alpha, cid = mlp_env(), 0.05, 0.5, 5
    cfg = _plain(local_steps=1, lr=eta, server_lr=alpha, batch_size=64)
    client = fed.clients[cid]
    assert client.num("train") < 64  # the one batch is the whole train split
    state = PFEDHN.init(init_model(env), fed, cfg, env)  # a fresh Env is in round 0
    upd, _ = PFEDHN.client_update(PFEDHN.broadcast(state, cid, cfg, env), client, None, cfg, env)
    new = PFEDHN.aggregate(state, [upd], cfg, env)
    net, target = _net(state), env.model_fn()
    x, y = client.tensors("train")
    loss = F.cross_entropy(functional_call(target, net(cid), (x,)), y)
    names = [n for n, _ in net.named_parameters()]
    grads = dict(zip(names, torch.autograd.grad(loss, list(net.parameters()))))
    for name in names:
        torch.testing.assert_close(new["hnet"][name], state["hnet"][name] - alpha * eta * grads[name],
                                   rtol=1e-4, atol=1e-6)


def test_pc_never_sends_the_classifier_and_keeps_it_local(fed):
    env, cfg = mlp_env(), _cfg(PFEDHN_PC, rounds=4, fraction=0.1)
    model = init_model(env)
    head = {"head.weight", "head.bias"}
    state = PFEDHN_PC.init(model, fed, cfg, env)
    assert not head & set(state["spec"]["targets"])
    msg = PFEDHN_PC.broadcast(state, 0, cfg, env)
    assert not head & set(msg["theta"])
    upd, kept = PFEDHN_PC.client_update(msg, fed.clients[0], None, cfg, env)
    assert not head & set(upd.payload["delta"]) and set(kept) == head
    assert not torch.equal(kept["head.weight"], model.state_dict()["head.weight"])  # trained locally
    res = run_rounds(PFEDHN_PC, cfg, fed, model, env, test=False)
    body = sum(p.numel() * 4 for n, p in model.named_parameters() if n not in head)
    assert all(r["bytes_up"] == r["clients"] * body and r["bytes_down"] == r["clients"] * body for r in res.history)
    full = run_rounds(PFEDHN, _cfg(rounds=1, fraction=0.1), fed, model, env, test=False)
    assert full.history[0]["bytes_up"] == full.history[0]["clients"] * sum(p.numel() * 4 for p in model.parameters())


def test_resume_gives_the_same_hypernetwork(fed, tmp_path):
    env, cfg = mlp_env(), _cfg(rounds=4)
    a = run_rounds(PFEDHN, cfg, fed, init_model(env), env, test=False)
    ck = tmp_path / "ck.pt"
    run_rounds(PFEDHN, dataclasses.replace(cfg, rounds=2), fed, init_model(mlp_env()), mlp_env(), checkpoint=ck, test=False)
    b = run_rounds(PFEDHN, cfg, fed, init_model(mlp_env()), mlp_env(), checkpoint=ck, resume=True, test=False)
    for k in a.state["hnet"]:
        torch.testing.assert_close(a.state["hnet"][k], b.state["hnet"][k], rtol=0, atol=0)
    assert a.state["opt"]["step"] == 4


def test_fixed_class_proportion_embeddings_stay_fixed(fed):
    env, cfg = mlp_env(), _cfg(embeddings="class_proportions", rounds=3, fraction=0.2)
    res = run_rounds(PFEDHN, cfg, fed, init_model(env), env, test=False)
    p_hat = pfedhn.class_proportions(fed)
    torch.testing.assert_close(pfedhn.embeddings(res.state), p_hat)
    np.testing.assert_allclose(p_hat.sum(0).numpy()[p_hat.sum(0).numpy() > 0], 1.0, rtol=1e-6)


def test_spectral_norm_bounds_every_layer(fed):
    env, cfg = mlp_env(), _cfg(spectral_norm=True, rounds=3)
    res = run_rounds(PFEDHN, cfg, fed, init_model(env), env, test=False)
    net = hn.materialize(res.state["spec"], res.state["hnet"])
    for m in net.modules():
        if isinstance(m, torch.nn.Linear):
            # one power iteration per round: sigma(W / sigma_hat) is 1 up to the estimate's error
            assert 0.9 < float(torch.linalg.matrix_norm(m.weight.detach(), 2)) < 1.1


def test_novel_clients_learn_only_their_embeddings(fed):
    env, cfg = mlp_env(), _cfg(rounds=4)
    train = run_rounds(PFEDHN, cfg, fed, init_model(env), env, test=False)
    algo = pfedhn.novel_client_algorithm(train.state, 2)
    novel_fed = build_federation(digits_dataset(), "pathological", 2, seed=3, classes_per_client=2)
    ncfg = dataclasses.replace(cfg, train_hypernet=False, rounds=3, fraction=1.0)
    res = run_rounds(algo, ncfg, novel_fed, init_model(env), env)
    for k, v in train.state["hnet"].items():
        if k != "embeddings":
            torch.testing.assert_close(res.state["hnet"][k], v, rtol=0, atol=0)
    emb = res.state["hnet"]["embeddings"]
    assert emb.shape[0] == 32 and torch.equal(emb[:30], train.state["hnet"]["embeddings"])
    assert not torch.allclose(emb[30], train.state["hnet"]["embeddings"].mean(0))
    with pytest.raises(ConfigError, match="train_hypernet"):
        run_rounds(algo, cfg, novel_fed, init_model(env), env)


def _images16(n=240, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 255, (n, 1, 16, 16), generator=g, dtype=torch.uint8)
    y = torch.arange(n) % 4
    meta = DatasetMeta("toy16", 4, tuple("abcd"), (1, 16, 16), (0.5,), (0.3,))
    return Dataset(meta, x[:200], y[:200], x[200:], y[200:], {}, {})


def test_budget_groups_receive_their_width_from_one_hypernetwork():
    fed = build_federation(_images16(), "iid", 6, seed=0)
    env = Env(model_fn=lambda: build_model("lenet", num_classes=4, input_shape=(1, 16, 16)), seed=0)
    cfg = _cfg(budget_widths=(2, 4, 8), rounds=3, fraction=0.5, local_steps=1)
    state = PFEDHN.init(init_model(env), fed, cfg, env)
    assert {n.split("/")[0] for n in state["spec"]["targets"]} == {"w2", "w4", "w8"}
    for cid, width in [(0, 2), (1, 2), (2, 4), (5, 8)]:
        msg = PFEDHN.broadcast(state, cid, cfg, env)
        assert msg["width"] == width and msg["theta"]["conv1.weight"].shape[0] == width
    res = run_rounds(PFEDHN, cfg, fed, init_model(env), env)
    assert res.status == "ok" and len(res.per_client) == 6


def test_bad_settings_name_the_key():
    with pytest.raises(ConfigError, match="local_steps"):
        PFEDHN.make_config({"local_steps": 0})
    with pytest.raises(ConfigError, match="embeddings"):
        PFEDHN.make_config({"embeddings": "onehot"})
    with pytest.raises(ConfigError, match="budget_widths"):
        PFEDHN.make_config({"budget_widths": [8, 8]})


@pytest.mark.parametrize("n,k", [(10, 2), (25, 4)])
def test_pathological_split_matches_its_definition(n, k):
    """pFedHN sec. 5.1: k classes per client, a_ic ~ U(.4, .6), share a_ic / sum_j a_jc of class c."""
    from pflkit.data.partition import pathological_shares

    ds = digits_dataset()
    fed = build_federation(ds, "pathological", n, seed=4, split="paired", classes_per_client=k)
    shares = pathological_shares((ds.y_train.numpy(), ds.y_test.numpy()), n, classes_per_client=k, seed=4)
    train = np.stack([np.bincount(c.labels("train").numpy(), minlength=10) + np.bincount(c.labels("val").numpy(), minlength=10)
                      for c in fed.clients])
    test = fed.histograms("test")
    holders = (shares > 0).sum(0)
    assert ((shares > 0).sum(1) == k).all()                      # k classes per client
    assert holders.max() - holders.min() <= 1                    # classes used equally often
    assert ((train > 0) <= (shares > 0)).all() and ((test > 0) <= (shares > 0)).all()
    np.testing.assert_allclose(shares.sum(0)[holders > 0], 1.0)  # every sample of a used class assigned
    n_c = np.bincount(ds.y_train.numpy(), minlength=10)
    assert np.abs(train - shares * n_c).max() <= 1               # train + val = share * n_c, within one sample
    for c in np.flatnonzero(holders):                            # a / sum a with a in [.4, .6]
        m = holders[c]
        s = shares[shares[:, c] > 0, c]
        assert (s >= 0.4 / (0.4 + 0.6 * (m - 1)) - 1e-12).all() and (s <= 0.6 / (0.6 + 0.4 * (m - 1)) + 1e-12).all()


# ---------------------------------------------------------------- novel clients (sec. 5.3)


def _affine_hypernet(seed=0):
    """depth 0: h(v) = W_head (W_trunk v + b_trunk) + b_head, affine in v (the paper's linear case, sec. 4)."""
    torch.manual_seed(seed)
    return hn.build(hn.spec_of(1, {"w": (3, 4), "b": (3,)}, embed_dim=4, hidden=8, depth=0,
                               spectral_norm=False, fixed=False)).eval()


def _flat(theta):
    return torch.cat([theta["w"].reshape(-1), theta["b"]])


@pytest.mark.parametrize("local_steps,weight_decay", [(1, 1e-3), (5, 0.0)])
def test_fit_embedding_reaches_the_closed_form_optimum(local_steps, weight_decay):
    """Frozen affine h(v) = A v + c, convex quadratic client loss 1/2 (theta - t)^T Q (theta - t).

    K = 1 local GD step of size eta answers delta = -eta Q (theta - t), so v descends
    eta * L(h(v)) + wd/2 ||v||^2, whose minimizer solves (eta A^T Q A + wd I) v = eta A^T Q (t - c).
    K = 5 steps on an isotropic Q (no decay): the fixed point is the least-squares v (A^T A) v = A^T (t - c).
    """
    net = _affine_hypernet()
    names = ["w", "b"]
    gen = torch.Generator().manual_seed(1)
    target = torch.randn(15, generator=gen, dtype=torch.float64)
    if local_steps == 1:
        m = torch.randn(15, 15, generator=gen, dtype=torch.float64)
        q = m @ m.T / 15 + 0.5 * torch.eye(15, dtype=torch.float64)
    else:
        q = 0.7 * torch.eye(15, dtype=torch.float64)
    eta = 0.5

    def answer(theta, step):
        th = _flat(theta).double()
        start = th.clone()
        for _ in range(local_steps):
            th = th - eta * q @ (th - target)
        d = (th - start).float()
        return {"w": d[:12].view(3, 4), "b": d[12:]}

    v0 = torch.zeros(4)
    a = torch.autograd.functional.jacobian(lambda v: _flat(net.generate(v, names)), v0).double()
    c = _flat(net.generate(v0, names)).detach().double()
    if local_steps == 1:
        want = torch.linalg.solve(eta * a.T @ q @ a + weight_decay * torch.eye(4, dtype=torch.float64),
                                  eta * a.T @ q @ (target - c))
    else:
        want = torch.linalg.lstsq(a, target - c).solution
    v, info = hn.fit_embedding(net, v0, names, answer, lr=0.05, momentum=0.9, weight_decay=weight_decay,
                               max_grad_norm=50.0, max_steps=20000, tol=1e-9, window=10)
    assert info["converged"] and info["steps"] < 20000
    torch.testing.assert_close(v.double(), want, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(v.double(), torch.zeros(4, dtype=torch.float64), atol=1e-2)  # it did move


def test_fit_embedding_steps_are_torch_sgd_with_decay_momentum_and_clipping():
    net, names = _affine_hypernet(), ["w", "b"]
    delta = {"w": torch.full((3, 4), 2.0), "b": torch.ones(3)}
    v0 = torch.randn(4, generator=torch.Generator().manual_seed(3))
    v_ref = torch.nn.Parameter(v0.clone())
    opt = torch.optim.SGD([v_ref], lr=0.1, momentum=0.9, weight_decay=0.01)
    for _ in range(3):
        opt.zero_grad()
        v_ref.grad = hn.embedding_grad(net, v_ref.detach(), names, delta)
        torch.nn.utils.clip_grad_norm_([v_ref], 0.3)
        opt.step()
    v, info = hn.fit_embedding(net, v0, names, lambda th, s: delta, lr=0.1, momentum=0.9, weight_decay=0.01,
                               max_grad_norm=0.3, max_steps=3)
    torch.testing.assert_close(v, v_ref.detach(), rtol=1e-5, atol=1e-6)
    assert info == {"steps": 3, "converged": False, "drift": float("inf")}


def test_novel_fit_one_step_is_the_chain_rule_gradient_of_the_clients_loss(fed):
    """K = 1, plain SGD, a full-batch client: v_new <- v_new - alpha * eta * grad_v CE(f(x; h(v_new; phi)))."""
    env, eta, alpha = mlp_env(), 0.05, 0.5
    cfg = _plain(local_steps=1, lr=eta, server_lr=alpha, batch_size=64, rounds=2)
    train = run_rounds(PFEDHN, cfg, fed, init_model(env), env, test=False)
    client = fed.clients[7]  # the 30 clients again, as novel ones: rows 30..59
    ncfg = dataclasses.replace(cfg, train_hypernet=False, novel_max_steps=1)
    state = pfedhn.novel_client_algorithm(train.state, 30).init(None, fed, ncfg, env)
    new, _, info = pfedhn.fit_novel_embedding(state, client, None, ncfg, env)
    assert info["steps"] == 1
    net, row = _net(state), state["rows"][7]
    assert row == 37
    x, y = client.tensors("train")
    assert len(y) < 64
    v = state["hnet"]["embeddings"][row].clone().requires_grad_(True)
    loss = F.cross_entropy(functional_call(env.model_fn(), net.generate(v), (x,)), y)
    (g,) = torch.autograd.grad(loss, [v])
    torch.testing.assert_close(new["hnet"]["embeddings"][row], v.detach() - alpha * eta * g, rtol=1e-4, atol=1e-6)
    for k, t in state["hnet"].items():  # phi and every other row stay
        if k != "embeddings":
            assert torch.equal(new["hnet"][k], t)
    keep = torch.ones(len(t := state["hnet"]["embeddings"]), dtype=torch.bool)
    keep[row] = False
    assert torch.equal(new["hnet"]["embeddings"][keep], t[keep])


def test_fit_novel_clients_converges_by_default_and_keeps_the_old_budget_as_an_option(fed):
    env, cfg = mlp_env(), _cfg(rounds=4)
    train = run_rounds(PFEDHN, cfg, fed, init_model(env), env, test=False)
    novel_fed = build_federation(digits_dataset(), "pathological", 2, seed=3, classes_per_client=2)
    assert PFEDHN.make_config({}).novel_fit == "converge"
    conv = pfedhn.fit_novel_clients(train.state, novel_fed, dataclasses.replace(cfg, novel_max_steps=40,
                                                                                novel_window=5), env)
    assert conv.status == "ok" and sorted(conv.per_client) == [0, 1]
    assert [h["client"] for h in conv.history] == [0, 1] and all(1 <= h["steps"] <= 40 for h in conv.history)
    emb = conv.state["hnet"]["embeddings"]
    assert emb.shape[0] == 32 and torch.equal(emb[:30], train.state["hnet"]["embeddings"])
    for k, v in train.state["hnet"].items():
        if k != "embeddings":
            assert torch.equal(conv.state["hnet"][k], v)
    old = pfedhn.fit_novel_clients(train.state, novel_fed, dataclasses.replace(cfg, novel_fit="rounds",
                                                                               novel_rounds=3, fraction=1.0), env)
    assert len(old.history) == 3 and old.history[0]["round"] == 1  # run_rounds' history: Alg. 1 rounds
    mean = train.state["hnet"]["embeddings"].mean(0)
    # the converged fit moves the new embeddings further from their start than 3 rounds do
    assert (emb[30:] - mean).norm() > (old.state["hnet"]["embeddings"][30:] - mean).norm()


@pytest.mark.parametrize("key,value", [("novel_fit", "once"), ("novel_max_steps", 0), ("novel_tol", -1.0),
                                       ("novel_window", 0), ("novel_rounds", -1)])
def test_bad_novel_settings_name_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        PFEDHN.make_config({key: value})
