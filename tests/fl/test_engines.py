"""The client-update engines beneath `run_rounds`: threads gives the sequential engine's numbers.

Equality is bitwise (`torch.equal`): each worker thread runs one intra-op thread, and the
sequential runs here are made with one intra-op thread too, so both do the same float
operations in the same order. (With several intra-op threads torch's CPU kernels split some
reductions differently: a sequential run at 2 threads differs from one at 1 thread by float
rounding, about 1e-7 here; that is the thread count, not the engine.)
"""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from pflkit.algorithms import ALGORITHMS, replace
from pflkit.config import ConfigError
from pflkit.fl import engines
from pflkit.fl.engines import check_engine, fallback_reason, resolve_engine, thread_workers
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from pflkit.fl.train import Diverged
from tests.helpers_compare import assert_tree
from tests.helpers_data import digits_dataset, digits_env

# small settings per algorithm, so that two rounds of four clients take a moment
L2P = {"epochs": 1, "meta_iters": 1, "neumann_steps": 1, "lr": 0.05}
SETTINGS = {
    **{name: L2P for name in ("fedl2p", "l2p", "fedl2p_fomaml", "fedl2p_bnnet", "fedl2p_lrnet_beta1",
                              "fedl2p_lrnet_beta0")},
    "finetune": {"epochs": 1},
    "fedbabu": {"finetune_epochs": 1},
    "pfedme": {"local_steps": 4},
    "perfedavg_hf": {"local_steps": 3},
    "pfedhn": {"local_steps": 2},
    "pfedhn_pc": {"local_steps": 2},
    "fedselect": {"ltn_iterations": 1, "ltn_epochs": 1},
    "fedselect_v2": {"ltn_iterations": 1, "ltn_epochs": 1},
    "pfedvem": {"head_steps": 2},
    "pfedmap": {"head_steps": 2},
}


@pytest.fixture(scope="module")
def fed():
    return build_federation(digits_dataset(600), "dirichlet", 4, seed=0, alpha=0.5)


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """Every test at one intra-op thread: the threads engine's setting, so the sequential runs
    do the same float operations (and a shared 2-core machine is not oversubscribed)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _config(name: str):
    base = {"rounds": 2, "fraction": 1.0, "batch_size": 16, "local_epochs": 1, "eval_every": 2}
    return ALGORITHMS[name].make_config({**base, **SETTINGS.get(name, {})})


def _run(algo, cfg, fed, engine: str, seed: int = 1, test: bool = True):
    env = dataclasses.replace(digits_env(seed=seed), engine=engine)
    env.seed_torch("init")
    return run_rounds(algo, cfg, fed, env.model_fn(), env, test=test)


def _without_seconds(history):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in history]


# FedL2P's variants share its client update (only meta-net switches differ): one of them in the
# default suite, the others with the `slow` marker, to keep the suite's time
SLOW_VARIANTS = {"fedl2p_fomaml", "fedl2p_bnnet", "fedl2p_lrnet_beta1", "fedl2p_lrnet_beta0"}


def _names(names):
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_VARIANTS else n for n in sorted(names)]


@pytest.mark.parametrize("name", _names(ALGORITHMS))
def test_threads_give_the_sequential_numbers_bitwise(fed, name):
    algo, cfg = ALGORITHMS[name], _config(name)
    seq = _run(algo, cfg, fed, "sequential")
    thr = _run(algo, cfg, fed, "threads")
    assert seq.status == thr.status == "ok", (seq.error, thr.error)
    assert seq.engine == "sequential"
    assert thr.engine == ("sequential" if algo.thread_unsafe else "threads")
    assert_tree(seq.state, thr.state, "state")
    assert_tree(seq.client_states, thr.client_states, "client_states")
    assert_tree(seq.per_client, thr.per_client, "per_client")
    assert_tree(_without_seconds(seq.history), _without_seconds(thr.history), "history")
    assert seq.best_round == thr.best_round
    assert torch.get_num_threads() == 1  # the pool's setting was restored


@pytest.mark.parametrize("name", _names(n for n, a in ALGORITHMS.items() if not a.thread_unsafe))
def test_thread_safe_client_updates_do_not_depend_on_torchs_global_rng(fed, name):
    """The deterministic check behind ``thread_unsafe == ""``: reseeding the global RNG before each
    client update changes nothing (a race in the pool could only show by chance)."""
    algo, cfg = ALGORITHMS[name], _config(name)

    def scrambled(msg, client, client_state, cfg, env):
        torch.manual_seed(12345 + client.id)
        return algo.client_update(msg, client, client_state, cfg, env)

    cfg = dataclasses.replace(cfg, rounds=1, eval_every=0, keep_best=False)
    plain = _run(algo, cfg, fed, "sequential", test=False)
    other = _run(replace(algo, client_update=scrambled), cfg, fed, "sequential", test=False)
    assert_tree(plain.client_states, other.client_states, "client_states")
    assert_tree(plain.state, other.state, "state")


def test_an_unsafe_algorithm_runs_sequentially_and_says_why(fed, caplog):
    algo = replace(ALGORITHMS["fedavg"], thread_unsafe="draws dropout masks from the global RNG")
    with caplog.at_level(logging.INFO, logger="pflkit.fl.loop"):
        res = _run(algo, _config("fedavg"), fed, "threads")
    assert res.status == "ok" and res.engine == "sequential"
    lines = [r.getMessage() for r in caplog.records if "sequentially" in r.getMessage()]
    assert lines == ["fedavg: engine threads runs its clients sequentially: its client update is not thread-safe: "
                     "draws dropout masks from the global RNG"]


def test_a_bad_engine_is_one_line_naming_it_before_any_work(fed):
    algo = ALGORITHMS["fedavg"]
    env = dataclasses.replace(digits_env(), engine="vmap")
    calls = []
    spy = replace(algo, init=lambda *a: calls.append(1) or algo.init(*a))
    with pytest.raises(ConfigError) as err:
        run_rounds(spy, _config("fedavg"), fed, env.model_fn(), env)
    assert str(err.value) == "engine='vmap': expected one of auto, sequential, threads, vectorized"
    assert calls == []
    with pytest.raises(ConfigError, match="engine='gpu'"):
        check_engine("gpu")


@pytest.mark.parametrize("failing", [0, 2])
def test_a_failing_client_surfaces_as_in_the_sequential_engine(fed, failing):
    """The first failure in the sampled order is raised; the states are those the sequential loop leaves."""
    algo = ALGORITHMS["fedavg"]

    def update(msg, client, client_state, cfg, env):
        if client.id in (failing, 3):
            raise Diverged(f"non-finite loss in client {client.id}")
        return algo.client_update(msg, client, client_state, cfg, env)

    spy, cfg = replace(algo, client_update=update), _config("fedavg")
    seq, thr = _run(spy, cfg, fed, "sequential"), _run(spy, cfg, fed, "threads")
    assert seq.status == thr.status == "diverged"
    assert seq.error == thr.error == f"non-finite loss in client {failing}"
    assert sorted(seq.client_states) == sorted(thr.client_states) == list(range(failing))
    assert_tree(seq.client_states, thr.client_states)


def test_other_exceptions_propagate_unchanged(fed):
    algo = ALGORITHMS["fedavg"]

    def update(msg, client, client_state, cfg, env):
        raise KeyError(f"client {client.id}")

    with pytest.raises(KeyError, match="client 0"):
        _run(replace(algo, client_update=update), _config("fedavg"), fed, "threads")


def test_at_most_one_update_per_worker_is_in_flight(fed, monkeypatch):
    import threading

    algo, lock, now, peak = ALGORITHMS["fedavg"], threading.Lock(), [0], [0]

    def update(*args):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        try:
            return algo.client_update(*args)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(engines, "available_cpus", lambda: 2)
    monkeypatch.setattr("pflkit.fl.transport.available_cpus", lambda: 2)
    res = _run(replace(algo, client_update=update), _config("fedavg"), fed, "threads")
    assert res.engine == "threads" and 1 <= peak[0] <= 2


def test_workers_run_in_a_copy_of_the_callers_context(fed):
    import contextvars

    var = contextvars.ContextVar("pflkit_test_var", default="unset")
    algo, seen = ALGORITHMS["fedavg"], []

    def update(*args):
        seen.append(var.get())
        return algo.client_update(*args)

    token = var.set("caller")
    try:
        _run(replace(algo, client_update=update), _config("fedavg"), fed, "threads")
    finally:
        var.reset(token)
    assert seen == ["caller"] * 8


def test_auto_resolution_rules():
    cpu = {"device_type": "cpu"}
    assert resolve_engine("auto", cpus=2, clients=10, **cpu) == "threads"
    assert resolve_engine("auto", cpus=1, clients=10, **cpu) == "sequential"
    assert resolve_engine("auto", cpus=16, clients=1, **cpu) == "sequential"
    assert resolve_engine("auto", cpus=2, clients=10, device_type="cuda") == "sequential"
    assert resolve_engine("auto", cpus=2, clients=10, thread_unsafe="dropout", **cpu) == "sequential"
    assert resolve_engine("sequential", cpus=8, clients=10, **cpu) == "sequential"
    assert resolve_engine("threads", cpus=1, clients=3, **cpu) == "threads"
    assert resolve_engine("threads", cpus=8, clients=1, **cpu) == "sequential"
    assert resolve_engine("threads", cpus=8, clients=4, device_type="cuda") == "sequential"
    assert resolve_engine("threads", cpus=8, clients=4, thread_unsafe="x", **cpu) == "sequential"
    with pytest.raises(ConfigError, match="engine='vmap'"):
        resolve_engine("vmap", cpus=2, clients=2, **cpu)


def test_fallback_reasons_and_worker_counts():
    assert fallback_reason("threads", device_type="cpu") == ""
    assert fallback_reason("sequential", device_type="cpu", thread_unsafe="x") == ""
    assert "not thread-safe: x" in fallback_reason("auto", device_type="cpu", thread_unsafe="x")
    assert "CPU only" in fallback_reason("threads", device_type="cuda")
    assert fallback_reason("auto", device_type="cuda") == ""
    assert thread_workers(2, 10) == 2 and thread_workers(16, 3) == 3 and thread_workers(4, 0) == 1


@pytest.mark.parametrize("cpus, used", [(1, "sequential"), (2, "threads")])
def test_auto_in_the_loop_follows_the_cores(fed, monkeypatch, cpus, used):
    monkeypatch.setattr("pflkit.fl.transport.available_cpus", lambda: cpus)
    cfg = dataclasses.replace(_config("fedavg"), eval_every=0, keep_best=False)
    assert _run(ALGORITHMS["fedavg"], cfg, fed, "auto", test=False).engine == used
    one = dataclasses.replace(cfg, fraction=0.25)  # one client per round: nothing to overlap
    assert _run(ALGORITHMS["fedavg"], one, fed, "auto", test=False).engine == "sequential"


def test_worker_views_have_their_own_caches_and_follow_the_env():
    env = dataclasses.replace(digits_env(), engine="threads", round=3)
    views = engines.worker_envs(env, 2)
    assert [v.round for v in views] == [3, 3] and views[0]._scratch is not views[1]._scratch
    assert views[0].scratch_model() is not views[1].scratch_model() is not env.scratch_model()
    again = engines.worker_envs(env.at_round(4), 3)  # the next round: the same caches, the new round
    assert all(a._scratch is b._scratch for a, b in zip(again, views)) and [v.round for v in again] == [4, 4, 4]
    assert engines.worker_envs(env, 1)[0]._scratch is views[0]._scratch
    with pytest.raises(dataclasses.FrozenInstanceError):  # no phase can move the round under another
        env.round = 5


def test_a_batch_worker_gets_its_share_of_the_cores(monkeypatch):
    """`pflkit reproduce --jobs N` gives each worker PFLKIT_CPUS = cores / N: auto then sizes its pool by that."""
    monkeypatch.setenv("PFLKIT_CPUS", "1")
    assert engines.available_cpus() == 1
    assert engines.resolve_engine("auto", device_type="cpu", cpus=engines.available_cpus(), clients=10) == "sequential"
    monkeypatch.setenv("PFLKIT_CPUS", "not a number")
    assert engines.available_cpus() >= 1
