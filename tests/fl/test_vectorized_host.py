"""The vectorized engine's host-side machinery: batch positions drawn up front, padded steps, the
memory budget's chunks, client threads kept across rounds (`pflkit.fl.vectorized`)."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from pflkit.algorithms import ALGORITHMS
from pflkit.fl import meet, vectorized
from pflkit.fl.train import SGDPlan, get_state, run_sgd, sgd_batches
from pflkit.fl.lockstep_batches import Source, pooled_steps, positions
from pflkit.fl.meet import run_together
from pflkit.fl.batchable import MemoryProbe, memory_budget, paddable
from pflkit.fl.vectorized import Request, run_plans
from tests.conftest import TOL
from tests.fl.test_engines import _config
from tests.fl.test_vectorized import _run
from tests.fl.conftest import uneven_clients
from tests.helpers_compare import assert_tree

F32 = TOL[torch.float32]


@pytest.fixture(scope="module")
def fed():
    return uneven_clients()


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.mark.parametrize("mode", [{"epochs": 2}, {"steps": 5}], ids=["epochs", "steps"])
def test_positions_are_the_streams_batches(fed, mode):
    """Drawn up front, the positions give the batches the stream draws lazily, and leave the
    generator where the stream leaves it."""
    client = fed.clients[1]
    lazy = sgd_batches(client, "train", 16, torch.Generator().manual_seed(4), **mode)
    want = list(lazy)
    g = torch.Generator().manual_seed(4)
    stream = sgd_batches(client, "train", 16, g, **mode)
    pos = positions(stream)
    assert pos is not None and len(pos) == len(want) and list(stream) == []  # the stream is spent
    for p, (x, y) in zip(pos, want):
        xt, yt = client.take(p)
        assert torch.equal(xt, x) and torch.equal(yt, y)
    assert torch.equal(g.get_state(), lazy.generator.get_state())


def test_positions_refuse_what_they_cannot_say(fed):
    client = fed.clients[0]
    started = sgd_batches(client, "train", 16, torch.Generator().manual_seed(0))
    next(started)
    assert positions(started) is None
    augmented = dataclasses.replace(client, augment="flip")
    assert positions(sgd_batches(augmented, "train", 16, torch.Generator())) is None
    assert positions(iter([])) is None


@pytest.mark.parametrize("prefetch", [Source.prefetch, 1], ids=["one-block", "a-block-a-step"])
@pytest.mark.parametrize("pad", [True, False], ids=["padded", "by-size"])
def test_a_steps_gathered_batches_are_each_clients_own(fed, pad, prefetch, monkeypatch):
    """`pooled_steps` from the up-front index table and the prefetched blocks (by default from the clients' samples
    converted once; with a prefetch of 1 byte, converted block by block): at every step each live
    client's rows are the batch its stream would give (padded with copies of its first sample), clients
    whose stream ended left out."""
    monkeypatch.setattr(Source, "prefetch", prefetch)
    streams = [sgd_batches(fed.clients[i], "train", 40, torch.Generator().manual_seed(i), epochs=2) for i in range(4)]
    want = [list(sgd_batches(fed.clients[i], "train", 40, torch.Generator().manual_seed(i), epochs=2))
            for i in range(4)]
    src = Source([Request(None, s) for s in streams])
    assert src.pooled
    live, step = [0, 1, 2, 3], 0
    while live:
        live, work = pooled_steps(src, live, step, pad)
        assert live == [i for i in range(4) if step < len(want[i])]
        seen = []
        for idx, (x, y), counts in work:
            for row, i in enumerate(idx):
                wx, wy = want[i][step]
                n = len(wy)
                assert (counts[row] if counts else y.shape[1]) == n
                assert torch.equal(x[row, :n], wx) and torch.equal(y[row, :n], wy)
                assert all(torch.equal(x[row, k], wx[0]) for k in range(n, x.shape[1]))  # padding: its first
                seen.append(i)
        assert sorted(seen) == live
        step += 1
    assert step == max(len(w) for w in want) + 1


class PerSample(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.SiLU())
        self.head = nn.Linear(12, 10)

    def forward(self, x):
        return self.head(self.body(x))


def test_paddable_models():
    assert paddable(PerSample())
    assert not paddable(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))  # batch statistics
    assert not paddable(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, track_running_stats=False)))


@pytest.mark.parametrize("settings", [{"lr": 0.1}, {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3,
                                                   "max_grad_norm": 1.0}], ids=["plain", "momentum-clip"])
def test_padded_steps_equal_the_loop(fed, settings, monkeypatch):
    """A per-sample model over clients of unequal sizes: every step is one padded stack of all the
    clients still training (their short last batches masked), and each client ends where the loop does."""
    def plans():
        torch.manual_seed(0)
        return [SGDPlan(m, list(m.parameters()), **settings) for m in (PerSample() for _ in fed.clients)]

    def streams():
        return [sgd_batches(c, "train", 16, torch.Generator().manual_seed(c.id), epochs=2) for c in fed.clients]

    ref = plans()
    want = [run_sgd(p, s) for p, s in zip(ref, streams())]
    calls = []
    real = vectorized._Group.step
    monkeypatch.setattr(vectorized._Group, "step", lambda self, idx, x, y, counts=None: calls.append(
        (len(idx), counts is not None and min(counts) < x.shape[1])) or real(self, idx, x, y, counts))
    reqs = [Request(p, s) for p, s in zip(plans(), streams())]
    run_plans(reqs, note=pytest.fail)
    steps = max(w["steps"] for w in want)
    assert len(calls) == steps and any(padded for _, padded in calls)  # one call a step, some padded
    for r, w, p in zip(reqs, want, ref):
        assert r.error is None and (r.stats["steps"], r.stats["samples"]) == (w["steps"], w["samples"])
        assert math.isclose(r.stats["loss"], w["loss"], rel_tol=F32["rtol"], abs_tol=F32["atol"])
        assert_tree(get_state(r.plan.model), get_state(p.model), "state", tol=F32)


def test_a_memory_budget_runs_the_round_in_chunks(fed, monkeypatch):
    """A budget below what the round's 4 clients measure on their first step: they run in chunks that
    fit, with the same numbers as all at once."""
    cfg = _config("fedavg")
    whole = _run(ALGORITHMS["fedavg"], cfg, fed, "vectorized", smooth_layers=True)
    measured, notes = [], []
    real = MemoryProbe.check
    monkeypatch.setattr(MemoryProbe, "check", lambda self, b, n: measured.append((b, n)) or real(self, b, n))
    monkeypatch.setenv("PFLKIT_VECTOR_MEMORY", str(10**15))  # measured, never over
    probe = _run(ALGORITHMS["fedavg"], dataclasses.replace(cfg, rounds=1), fed, "vectorized", smooth_layers=True)
    assert probe.status == "ok" and measured
    per_client = max(b // n for b, n in measured)  # then a budget for 2 clients and a half
    monkeypatch.setenv("PFLKIT_VECTOR_MEMORY", str(int(per_client * 2.5)))
    monkeypatch.setattr("pflkit.fl.engines._noter", lambda algo: notes.append)
    chunked = _run(ALGORITHMS["fedavg"], cfg, fed, "vectorized", smooth_layers=True)
    assert notes and all("over the budget" in n and "chunks of 2" in n for n in notes), notes
    assert_tree(chunked.state, whole.state, "state", tol=F32)
    assert_tree(chunked.per_client, whole.per_client, "per_client", tol=F32)


def test_memory_budget_setting(monkeypatch):
    assert memory_budget(torch.device("cpu")) is None
    monkeypatch.setenv("PFLKIT_VECTOR_MEMORY", "1000")
    assert memory_budget(torch.device("cpu")) == 1000
    monkeypatch.setenv("PFLKIT_VECTOR_MEMORY", "2GB")
    with pytest.raises(ValueError, match=r"^PFLKIT_VECTOR_MEMORY='2GB': expected a positive number of bytes$"):
        memory_budget(torch.device("cpu"))


def test_memory_probe_counts_saved_activations():
    w = torch.randn(8, 100, 50, requires_grad=True)
    x = torch.randn(8, 64, 50)
    with MemoryProbe.saved() as saved:
        torch.relu(torch.bmm(x, w.transpose(1, 2))).sum()
    # bmm saves x (w's gradient needs it; w is not saved: x needs no gradient), relu its output
    assert saved.bytes == (x.numel() + 8 * 64 * 100) * 4


def test_client_threads_are_kept_across_rounds():
    before = meet._WORKERS._started
    for _ in range(3):
        got = run_together([lambda i=i: i * i for i in range(5)], note=pytest.fail)
        assert got == [(i * i, None) for i in range(5)]
    assert meet._WORKERS._started - before <= 5
