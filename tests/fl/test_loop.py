import math

import pytest
import torch

from pflkit.algorithms import ALGORITHMS, replace
from pflkit.fl.algorithm import Update
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from pflkit.fl.sampling import SamplingRule, eval_clients, sample_clients
from pflkit.io import load_torch
from tests.helpers_data import digits_dataset, digits_env

FEDAVG = ALGORITHMS["fedavg"]


@pytest.fixture(scope="module")
def fed():
    return build_federation(digits_dataset(), "dirichlet", 8, seed=0, alpha=0.5)


def _cfg(**kw):
    base = {"rounds": 4, "fraction": 0.5, "lr": 0.05, "batch_size": 16, "eval_every": 2}
    return FEDAVG.make_config({**base, **kw})


def _model(env):
    env.seed_torch("init")
    return env.model_fn()


def test_sampling_counts_and_determinism():
    env = digits_env()
    cfg = _cfg(fraction=0.3)
    a = sample_clients(20, SamplingRule.of(cfg), env, 5)
    assert len(a) == 6 and len(set(a)) == 6
    assert a == sample_clients(20, SamplingRule.of(cfg), env, 5)
    assert a != sample_clients(20, SamplingRule.of(cfg), env, 6)
    bern = SamplingRule("bernoulli", 0.1)
    sizes = [len(sample_clients(200, bern, env, t)) for t in range(30)]
    assert 12 < sum(sizes) / len(sizes) < 28  # Binomial(200, 0.1): mean 20
    assert eval_clients(20, _cfg(eval_clients=5), env) == eval_clients(20, _cfg(eval_clients=5), env)


def test_one_round_is_the_weighted_average_of_client_models(fed):
    """Aggregation through the loop equals averaging independently trained client copies."""
    env = digits_env()
    cfg = _cfg(rounds=1, keep_best=False, eval_every=0)
    start = _model(env)
    res = run_rounds(FEDAVG, cfg, fed, start, env, test=False)
    ids = sample_clients(fed.num_clients, SamplingRule.of(cfg), env, 0)
    w0 = {k: v.clone() for k, v in start.state_dict().items()}
    states, sizes = [], []
    for cid in ids:
        env.seed_torch("client", cid, 0)
        upd, _ = FEDAVG.client_update(w0, fed.clients[cid], None, cfg, env)
        states.append(upd.payload)
        sizes.append(fed.clients[cid].num("train"))
    for k, v in res.state["weights"].items():
        if v.is_floating_point():
            hand = sum(s[k].double() * n for s, n in zip(states, sizes)) / sum(sizes)
            torch.testing.assert_close(v.double(), hand, atol=1e-6, rtol=1e-6)


def test_fedavg_learns_on_real_digits(fed):
    env = digits_env()
    res = run_rounds(FEDAVG, _cfg(rounds=8, momentum=0.9), fed, _model(env), env)
    assert res.status == "ok"
    assert res.summary["acc"] > 0.6, res.summary  # chance is 0.1
    assert res.history[-1]["bytes_up"] > 0 and res.history[-1]["bytes_down"] == res.history[-1]["bytes_up"]


@pytest.mark.parametrize("every", [1, 2])
def test_resume_gives_the_numbers_of_an_uninterrupted_run(fed, tmp_path, every):
    env = digits_env()
    cfg = _cfg(rounds=5, checkpoint_every=every)
    full = run_rounds(FEDAVG, cfg, fed, _model(env), env, checkpoint=tmp_path / "a.ckpt")

    calls = {"n": 0}

    def dying_aggregate(state, updates, c, e):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt  # the run is killed during round 4
        return FEDAVG.aggregate(state, updates, c, e)

    dying = replace(FEDAVG, aggregate=dying_aggregate)
    env2 = digits_env()
    with pytest.raises(KeyboardInterrupt):
        run_rounds(dying, cfg, fed, _model(env2), env2, checkpoint=tmp_path / "b.ckpt")
    # every round: rounds 1-3 are on disk; every second round: round 2, so round 3 is repeated
    assert load_torch(tmp_path / "b.ckpt")["round"] == (3 if every == 1 else 2)
    env3 = digits_env()
    resumed = run_rounds(FEDAVG, cfg, fed, _model(env3), env3, checkpoint=tmp_path / "b.ckpt", resume=True)
    for k in full.state["weights"]:
        assert torch.equal(full.state["weights"][k], resumed.state["weights"][k]), k
    assert full.per_client == resumed.per_client
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds"} for r in h]  # noqa: E731
    assert strip(full.history) == strip(resumed.history)
    assert full.best_round == resumed.best_round


def test_non_finite_loss_marks_the_run_diverged(fed):
    def nan_update(msg, client, cs, cfg, env):
        return Update(client.id, client.num("train"), msg, {"loss": math.nan}), cs

    bad = replace(FEDAVG, client_update=nan_update)
    env = digits_env()
    res = run_rounds(bad, _cfg(rounds=3), fed, _model(env), env)
    assert res.status == "diverged" and "non-finite" in res.error
    assert res.per_client == {}


def test_keep_best_restores_the_best_validation_state(fed):
    env = digits_env()
    res = run_rounds(FEDAVG, _cfg(rounds=4, eval_every=1, keep_best=True), fed, _model(env), env)
    vals = [h["val_acc"] for h in res.history]
    assert res.best_round == 1 + max(range(len(vals)), key=lambda i: (vals[i], -i))


@pytest.mark.parametrize("engine", ["sequential", "threads"])
def test_each_stage_runs_under_its_envs_kernel_backend_and_leaves_the_callers_alone(fed, engine):
    """The backend is the run's (Env.kernels), seen by client updates in worker threads too; it never leaks."""
    import dataclasses

    from pflkit import kernels

    seen = []

    def spy(msg, client, client_state, cfg, env):
        seen.append((kernels.get_backend(), env.round))
        return FEDAVG.client_update(msg, client, client_state, cfg, env)

    algo = replace(FEDAVG, client_update=spy)
    env = dataclasses.replace(digits_env(), kernels="reference", engine=engine)
    with kernels.use_backend("auto"):
        run_rounds(algo, _cfg(rounds=2, eval_every=0), fed, _model(env), env, test=False)
        assert kernels.get_backend() == "auto"
        assert {b for b, _ in seen} == {"reference"} and sorted({t for _, t in seen}) == [0, 1]
        assert env.round == 0  # the caller's context is not moved by the loop
        seen.clear()
        run_rounds(algo, _cfg(rounds=1, eval_every=0), fed, _model(env),
                   dataclasses.replace(env, kernels=None), test=False)
        assert {b for b, _ in seen} == {"auto"}  # no backend of its own: the caller's


def test_the_kept_round_rule_weighted_or_as_the_authors_unweighted():
    """``select="update_val_loss"`` weighs the clients' validation losses by their sample counts;
    ``"update_val_loss_mean"`` takes their plain mean, as royson/fedl2p's fedl2p_classification_app.py does."""
    from types import SimpleNamespace

    from pflkit.fl.algorithm import Update
    from pflkit.fl.loop import _score

    updates = [Update(0, 30, None, {"val_loss": 1.0}), Update(1, 10, None, {"val_loss": 3.0})]
    assert _score(SimpleNamespace(select="update_val_loss"), None, updates) == pytest.approx(-1.5)
    assert _score(SimpleNamespace(select="update_val_loss_mean"), None, updates) == pytest.approx(-2.0)
