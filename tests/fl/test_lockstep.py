"""A vectorized round without client threads (`pflkit.fl.lockstep`): FedAvg's plain local SGD planned,
trained and answered in the calling thread gives each client the `Update` and state of the sequential
``client_update``; what it cannot batch runs there as the sequential engine runs it."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from pflkit.algorithms import ALGORITHMS, FEDAVG
from pflkit.fl import engines
from pflkit.fl.lockstep import plain_sgd
from tests.conftest import TOL
from tests.fl.test_engines import _config
from tests.fl.test_vectorized import smooth
from tests.fl.conftest import uneven_clients
from tests.helpers_compare import assert_tree
from tests.helpers_data import digits_env

F32 = TOL[torch.float32]


@pytest.fixture(scope="module")
def fed():
    return uneven_clients()


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.fixture
def no_client_threads(monkeypatch):
    def refuse(calls, note):
        raise AssertionError("a plain-SGD round started client threads")
    monkeypatch.setattr(engines, "run_together", refuse)


def _round(engine: str, fed, model_fn, cfg, round_: int = 1):
    """(each client's (update, state, bytes), the client states) of one round of FedAvg from a seeded start."""
    env = dataclasses.replace(digits_env(seed=2), model_fn=model_fn, engine=engine).at_round(round_)
    env.seed_torch("init")
    state = FEDAVG.init(env.model_fn(), fed, cfg, env)
    states: dict = {}
    ids = [2, 0, 3, 1]
    out = engines.RUNNERS[engine](FEDAVG, state, ids, fed, states, cfg, env)
    return out, states, torch.random.get_rng_state()


def test_plain_rounds_give_the_sequential_updates(fed, no_client_threads):
    cfg = dataclasses.replace(_config("fedavg"), momentum=0.5, weight_decay=1e-3)
    model_fn = smooth(digits_env().model_fn)
    seq, seq_states, seq_rng = _round("sequential", fed, model_fn, cfg)
    vec, vec_states, vec_rng = _round("vectorized", fed, model_fn, cfg)
    assert [u.client_id for u, _, _ in vec] == [2, 0, 3, 1]
    for (v, vs, vb), (s, ss, sb) in zip(vec, seq):
        assert (v.client_id, v.num_samples, vb, vs) == (s.client_id, s.num_samples, sb, ss)
        assert list(v.metrics) == list(s.metrics) == ["loss"]
        assert v.metrics["loss"] == pytest.approx(s.metrics["loss"], rel=1e-5)
        assert_tree(v.payload, s.payload, "payload", tol=F32)  # keys in the state dict's order, dtypes, no grad
    assert vec_states == seq_states == {2: None, 0: None, 3: None, 1: None}
    assert torch.equal(vec_rng, seq_rng)  # the global generator as the sequential engine leaves it


def _start():
    env = dataclasses.replace(digits_env(seed=2), model_fn=smooth(digits_env().model_fn))
    env.seed_torch("init")
    return env.model_fn()


def test_the_trained_weights_move_and_differ_per_client(fed, no_client_threads):
    """The payloads are each client's own (not one client's written over all, not the start)."""
    cfg = _config("fedavg")
    vec, _, _ = _round("vectorized", fed, smooth(digits_env().model_fn), cfg)
    start = FEDAVG.init(_start(), fed, cfg, None)["weights"]
    for key in start:
        if start[key].is_floating_point():
            w = [u.payload[key] for u, _, _ in vec]
            assert all(not torch.equal(a, start[key]) for a in w), key
            assert all(not torch.equal(a, b) for i, a in enumerate(w) for b in w[i + 1:]), key


def test_what_counts_as_plain_sgd():
    cfg = _config("fedavg")
    assert plain_sgd(FEDAVG, cfg)
    # variants made with replace(FEDAVG, client_update=...) inherit the field but not the update
    for name in ("fedbabu", "pfedme", "perfedavg"):
        assert ALGORITHMS[name].plain_sgd is FEDAVG.client_update
        assert not plain_sgd(ALGORITHMS[name], _config(name))
    assert not plain_sgd(FEDAVG, FEDAVG.make_config({"participation": "broadcast", "fraction": 1.0}))
    assert all(a.vectorizable for a in ALGORITHMS.values() if a.plain_sgd is a.client_update)


def test_what_cannot_be_batched_runs_here_as_sequentially(fed, no_client_threads, caplog):
    """Dropout draws from torch's global generator: each client then trains here, the generator seeded per
    client as the sequential engine seeds it, so the numbers are the sequential ones bitwise."""
    def with_dropout():
        model = digits_env().model_fn()
        return nn.Sequential(model, nn.Dropout(0.3))
    cfg = _config("fedavg")
    engines._NOTED.clear()
    seq, _, _ = _round("sequential", fed, with_dropout, cfg)
    with caplog.at_level("INFO", logger="pflkit.fl.engines"):
        vec, _, _ = _round("vectorized", fed, with_dropout, cfg)
    assert "dropout" in caplog.text
    for (v, _, _), (s, _, _) in zip(vec, seq):
        assert v.metrics == s.metrics
        assert_tree(v.payload, s.payload, "payload")
