"""The vectorized engine gives the sequential engine's numbers, to float rounding, on the CPU.

Every algorithm that declares a vectorizable client update (`Algorithm.vectorizable`) is run
both ways on a small federation whose clients have unequal sizes (so the lockstep meets short
last batches and clients that finish early), with the digits CNN's ReLUs and max-pool made smooth
(`smooth`: rounding must not pick another subgradient), and the server state, client states, per-client
metrics and history are compared with the float32 tolerance of `tests/conftest.py`. The
others must fall back to the sequential engine and give its numbers bitwise. The lockstep
SGD (`pflkit.fl.vectorized`) is also checked on its own against `run_sgd`, setting by setting
(momentum, weight decay, clipping, a trainable subset, the proximal term, BatchNorm buffers).
"""
from __future__ import annotations

import dataclasses
import logging
import math

import pytest
import torch
from torch import nn

from pflkit.algorithms import ALGORITHMS
from pflkit.errors import Diverged
from pflkit.fl import engines
from pflkit.fl.engines import fallback_reason, resolve_engine
from pflkit.fl.loop import run_rounds
from pflkit.fl.train import SGDPlan, get_state, local_sgd, run_sgd
from pflkit.fl.meet import run_together
from pflkit.fl.batchable import signature, why_not
from pflkit.fl.vectorized import Request, run_plans
from tests.conftest import TOL
from tests.fl.test_engines import _config
from tests.fl.conftest import uneven_clients
from tests.helpers_compare import assert_tree
from tests.helpers_data import digits_env

F32 = TOL[torch.float32]
VECTORIZABLE = sorted(n for n, a in ALGORITHMS.items() if a.vectorizable)
OTHERS = sorted(n for n, a in ALGORITHMS.items() if not a.vectorizable)


@pytest.fixture(scope="module")
def fed():
    return uneven_clients()


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def smooth(model_fn):
    """``model_fn`` with every ReLU replaced by SiLU and every max-pool by an average pool (same layout).

    ReLU and max-pool make training piecewise: where a pre-activation sits within rounding of zero, or
    two pooled values within rounding of each other, a rounding-size difference between the engines
    sends a gradient down another path, and over two rounds such a flip grows far past float tolerance.
    Seen on an AVX2 CPU: 3e-5 to 1.3e-3 between the engines for FedAvg, Local, FedPer, LG-FedAvg, FedBABU
    and Ditto, in jumps at single steps (one client, step 9: 6e-8 -> 1.5e-6, step 17: 4e-6 -> 4.5e-5);
    there the sequential engine at 2 intra-op threads differs from itself at 1 by as much for FedAvg
    (1.7e-4) and FedPer (3.2e-4). With smooth layers the engines differ by at most 1.2e-7 on that CPU,
    while 0.05 more momentum moves the states by 3e-3 to 2e-2 (pFedHN's local steps: 3e-5 to 3e-4).
    """
    def build():
        model = model_fn()
        for module in list(model.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, nn.ReLU):
                    setattr(module, name, nn.SiLU())
                elif isinstance(child, nn.MaxPool2d):
                    setattr(module, name, nn.AvgPool2d(child.kernel_size, child.stride))
        return model
    return build


def _run(algo, cfg, fed, engine: str, seed: int = 1, smooth_layers: bool = False):
    env = dataclasses.replace(digits_env(seed=seed), engine=engine)
    if smooth_layers:
        env = dataclasses.replace(env, model_fn=smooth(env.model_fn))
    env.seed_torch("init")
    return run_rounds(algo, cfg, fed, env.model_fn(), env)


def _history(result):
    return [{k: v for k, v in row.items() if k not in ("seconds", "engine")} for row in result.history]


@pytest.mark.parametrize("name", VECTORIZABLE)
def test_vectorized_gives_the_sequential_numbers(fed, name, monkeypatch):
    algo = ALGORITHMS[name]
    # momentum buffers in the stacks too, except for GradLTN's masks (FedSelect): its top-k choice of
    # personal entries turns rounding into other masks once momentum amplifies it; there the sequential
    # engine at 2 intra-op threads differs from itself at 1 by as much (1.3e-3) as this engine does
    cfg = dataclasses.replace(_config(name), momentum=0.0 if name.startswith("fedselect") else 0.5)
    alone = []  # every local-SGD call must be batched, none run on its own
    monkeypatch.setattr(engines, "_noter", lambda algo: alone.append)
    seq, vec = (_run(algo, cfg, fed, engine, smooth_layers=True) for engine in ("sequential", "vectorized"))
    assert alone == []
    assert seq.status == vec.status == "ok", (seq.error, vec.error)
    assert (seq.engine, vec.engine) == ("sequential", "vectorized")
    assert_tree(vec.state, seq.state, "state", tol=F32)
    assert_tree(vec.client_states, seq.client_states, "client_states", tol=F32)
    assert_tree(vec.per_client, seq.per_client, "per_client", tol=F32)
    assert_tree(_history(vec), _history(seq), "history", tol=F32)
    assert seq.best_round == vec.best_round


@pytest.mark.parametrize("engine", ["sequential", "vectorized"])
def test_a_stage_without_rounds_records_the_engine_of_its_test_pass(fed, engine):
    """FT trains no rounds (``rounds = 0``): its fine-tune-and-test pass names the engine that ran it."""
    cfg = dataclasses.replace(_config("finetune"), rounds=0)
    res = _run(ALGORITHMS["finetune"], cfg, fed, engine)
    assert res.status == "ok" and res.history == [] and res.engine == engine


@pytest.mark.parametrize("name", [n for n in OTHERS if n not in ("fedl2p_fomaml", "fedl2p_bnnet",
                                                                   "fedl2p_lrnet_beta1", "fedl2p_lrnet_beta0")])
def test_algorithms_that_do_not_declare_it_run_sequentially_and_say_why(fed, name, caplog):
    algo, cfg = ALGORITHMS[name], _config(name)
    with caplog.at_level(logging.INFO, logger="pflkit.fl.loop"):
        vec = _run(algo, cfg, fed, "vectorized")
    assert vec.engine == "sequential"
    assert "does not declare a vectorizable client update" in caplog.text
    seq = _run(algo, cfg, fed, "sequential")
    assert_tree(vec.state, seq.state, "state", tol=F32)
    assert vec.summary == seq.summary or math.isnan(seq.summary["acc"])


def test_engine_choice():
    cpu, cuda = {"device_type": "cpu"}, {"device_type": "cuda"}
    assert resolve_engine("auto", cpus=16, clients=10, vectorizable=True, **cpu) == "threads"  # never on the CPU
    assert resolve_engine("auto", cpus=1, clients=10, vectorizable=True, **cpu) == "sequential"
    assert resolve_engine("auto", cpus=16, clients=10, vectorizable=True, **cuda) == "vectorized"
    assert resolve_engine("auto", cpus=16, clients=10, vectorizable=False, **cuda) == "sequential"
    assert resolve_engine("auto", cpus=16, clients=1, vectorizable=True, **cuda) == "sequential"
    assert resolve_engine("vectorized", cpus=1, clients=3, vectorizable=True, **cpu) == "vectorized"
    assert resolve_engine("vectorized", cpus=8, clients=3, vectorizable=False, **cpu) == "sequential"
    assert resolve_engine("vectorized", cpus=8, clients=3, vectorizable=True, thread_unsafe="x", **cuda) == "sequential"
    assert "does not declare" in fallback_reason("vectorized", device_type="cuda")
    assert fallback_reason("vectorized", device_type="cuda", vectorizable=True) == ""


# ----------------------------------------------------------------------------- the lockstep itself

class Net(nn.Module):
    """Conv-BN-ReLU-Linear: parameters, BatchNorm buffers, a head to train alone."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).flatten(1))


def _batches(seed: int, sizes: list[int]):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)) for n in sizes]


def _plans(n: int, **settings):
    torch.manual_seed(0)
    models = [Net() for _ in range(n)]
    for i, m in enumerate(models):  # different starting points per client
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.01 * i)
    subset = settings.pop("head_only", False)
    prox = settings.pop("prox", None)
    masked = settings.pop("masked", False)
    g = torch.Generator().manual_seed(5)
    plans = []
    for m in models:
        params = list(m.head.parameters()) if subset else list(m.parameters())
        # FedSelect-style: a random half of the conv weight's entries frozen, the other tensors free
        masks = [(torch.rand(p.shape, generator=g) < 0.5).float() if p is m.conv.weight else None for p in params]
        plans.append(SGDPlan(m, params, prox=prox and (prox, {k: v + 0.1 for k, v in get_state(m).items()}),
                             grad_masks=masks if masked else None, **settings))
    return plans


# client sizes: a short last batch for some, an early end for others, one client with no batch at all
SIZES = [[8, 8, 3], [8, 8, 8, 8], [8, 5], [], [8]]


@pytest.mark.parametrize("settings", [
    {"lr": 0.1},
    {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3},
    {"lr": 0.5, "max_grad_norm": 0.5},
    {"lr": 0.1, "momentum": 0.5, "head_only": True},
    {"lr": 0.1, "prox": 0.7},
    {"lr": 0.1, "momentum": 0.5, "loss_decay": 1e-2, "max_grad_norm": 1.0, "masked": True},
], ids=["plain", "momentum-decay", "clipping", "head-only", "proximal", "masked-decay"])
def test_lockstep_sgd_equals_the_loop_per_client(settings):
    ref, vec = _plans(len(SIZES), **dict(settings)), _plans(len(SIZES), **dict(settings))
    expected = [run_sgd(p, iter(_batches(i, s))) for i, (p, s) in enumerate(zip(ref, SIZES))]
    for p in vec:
        p.model.train()
    reqs = [Request(p, iter(_batches(i, s))) for i, (p, s) in enumerate(zip(vec, SIZES))]
    run_plans(reqs, note=pytest.fail)
    for r, want, p_ref in zip(reqs, expected, ref):
        assert r.error is None and r.stats["steps"] == want["steps"] and r.stats["samples"] == want["samples"]
        assert math.isclose(r.stats["loss"], want["loss"], rel_tol=F32["rtol"], abs_tol=F32["atol"])
        assert_tree(get_state(r.plan.model), get_state(p_ref.model), "state", tol=F32)  # BN running stats included
    assert not torch.equal(vec[0].model.conv.weight, vec[1].model.conv.weight)
    for p_ref in ref:  # a masked entry never moved
        for p, mask in zip(p_ref.params, p_ref.grad_masks or ()):
            if mask is not None:
                start = _plans(len(SIZES), **dict(settings))[ref.index(p_ref)].model.conv.weight
                assert torch.equal(p.detach()[mask == 0], start.detach()[mask == 0])


def test_a_diverging_client_fails_alone():
    plans = _plans(2, lr=0.1)
    bad = _batches(0, [8])
    bad[0][0][0, 0, 0, 0] = float("nan")
    reqs = [Request(plans[0], iter(bad)), Request(plans[1], iter(_batches(1, [8])))]
    run_plans(reqs, note=pytest.fail)
    assert isinstance(reqs[0].error, Diverged) and reqs[1].error is None and reqs[1].stats["steps"] == 1


def test_what_cannot_be_batched_says_why():
    (plan,) = _plans(1, lr=0.1)
    assert why_not(plan) == ""
    assert "criterion" in why_not(dataclasses.replace(plan, criterion=lambda m, x, y: m(x).sum()))
    assert "extra loss" in why_not(dataclasses.replace(plan, extra_loss=lambda m: 0))
    assert "no trainable" in why_not(dataclasses.replace(plan, params=[]))
    assert "outside its model" in why_not(dataclasses.replace(plan, params=[nn.Parameter(torch.zeros(1))]))
    h = plan.model.head.weight.register_hook(lambda g: g)
    assert "gradient hooks" in why_not(plan)
    h.remove()
    dropout = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(64, 10)).train()
    assert "dropout" in why_not(SGDPlan(dropout, list(dropout.parameters()), lr=0.1))
    plan.model.bn.beta = torch.zeros(4)
    assert "tensor attribute 'beta'" in why_not(plan)


def test_groups_follow_the_signature():
    a, b = _plans(2, lr=0.1)
    assert signature(a) == signature(b)
    assert signature(a) != signature(dataclasses.replace(b, lr=0.2))
    assert signature(a) != signature(dataclasses.replace(b, params=list(b.model.head.parameters())))
    b.model.eval()
    assert signature(a) != signature(b)


def test_threads_meet_and_unbatchable_calls_run_where_they_are(fed):
    """Two local-SGD calls per client (one batchable, one with a free-form loss), run together:
    the same models as the calls made one after another."""
    env = digits_env(seed=3)

    def update(cid, model):
        g1, g2 = env.generator("a", cid), env.generator("b", cid)
        first = local_sgd(model, fed.clients[cid], lr=0.1, batch_size=16, generator=g1)
        second = local_sgd(model, fed.clients[cid], lr=0.1, batch_size=16, generator=g2,
                           extra_loss=lambda m: 0.01 * m.head.weight.pow(2).sum())
        return first["loss"], second["loss"], get_state(model)

    def fresh():
        env.seed_torch("init")
        return [env.model_fn() for _ in range(3)]

    expected = [update(c, m) for c, m in enumerate(fresh())]
    notes = []
    got = run_together([lambda c=c, m=m: update(c, m) for c, m in enumerate(fresh())], note=notes.append)
    assert all(err is None for _, err in got)
    assert notes and all("extra loss" in n for n in notes)
    for (res, _), want in zip(got, expected):
        assert_tree(res, want, tol=F32)


def test_a_failing_client_raises_in_order_and_the_others_finish():
    def ok():
        return 1

    def boom():
        raise ValueError("client 1 broke")

    got = run_together([ok, boom, ok], note=print)
    assert [r for r, _ in got] == [1, None, 1] and isinstance(got[1][1], ValueError)
    with pytest.raises(ValueError, match="client 1 broke"):
        engines._in_order(got)


def test_rounds_of_many_clients_run_in_chunks(fed, monkeypatch):
    """With at most 3 clients at once, a round of 4 runs as 3 + 1: the same numbers."""
    cfg = _config("fedavg")
    # smooth layers (`smooth`): a batched convolution's backward rounds differently for 3 clients than
    # for 4, and a ReLU at rounding distance of zero would turn that into another subgradient
    whole = _run(ALGORITHMS["fedavg"], cfg, fed, "vectorized", smooth_layers=True)
    sizes, trained = [], []
    real, plain = engines.run_together, engines.run_plain
    monkeypatch.setattr(engines, "run_together", lambda calls, note: sizes.append(len(calls)) or real(calls, note))
    monkeypatch.setattr(engines, "run_plain", lambda algo, msgs, *a: trained.append(len(msgs)) or plain(algo, msgs, *a))
    monkeypatch.setenv("PFLKIT_VECTOR_CLIENTS", "3")
    chunked = _run(ALGORITHMS["fedavg"], cfg, fed, "vectorized", smooth_layers=True)
    assert sizes and set(sizes) == {3, 1}  # the evaluation passes, in client threads
    assert trained and set(trained) == {3, 1}  # FedAvg's rounds, without (`pflkit.fl.lockstep`)
    assert_tree(chunked.state, whole.state, "state", tol=F32)
    assert_tree(chunked.per_client, whole.per_client, "per_client", tol=F32)


def test_a_group_out_of_memory_runs_in_halves(monkeypatch):
    """More than 2 clients at once 'run out of memory': 5 plans run as 2 + (1 + 2), same numbers."""
    from pflkit.fl import vectorized

    real = vectorized._Group.step
    sizes = []

    def step(self, idx, x, y, counts=None):
        if len(self.plans) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        sizes.append(len(self.plans))
        return real(self, idx, x, y, counts)

    monkeypatch.setattr(vectorized._Group, "step", step)
    settings = {"lr": 0.1, "momentum": 0.5}
    ref, vec = _plans(len(SIZES), **settings), _plans(len(SIZES), **settings)
    expected = [run_sgd(p, iter(_batches(i, s))) for i, (p, s) in enumerate(zip(ref, SIZES))]
    reqs = [Request(p, iter(_batches(i, s))) for i, (p, s) in enumerate(zip(vec, SIZES))]
    notes = []
    run_plans(reqs, note=notes.append)
    assert set(sizes) <= {1, 2} and notes and all("in halves" in n for n in notes)
    for r, want, p_ref in zip(reqs, expected, ref):
        assert r.error is None and r.stats["steps"] == want["steps"]
        assert_tree(get_state(r.plan.model), get_state(p_ref.model), "state", tol=F32)
