"""pflkit on Flower's message path (in-process grid, no Ray): same numbers as the loop, faults, bytes, nodes."""
from __future__ import annotations

import json
import shutil
import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.data.datasets import load_dataset
from pflkit.fl.algorithm import Env
from pflkit.fl.federate import federation_for
from pflkit.fl.sampling import SamplingRule, sample_clients
from pflkit.flower.client_app import build_client_app
from pflkit.flower.runtime import runtime, settings_for
from pflkit.flower.nodes import NodeMap
from pflkit.flower.serve import build_server_app
from pflkit.flower.server_app import PflkitStrategy
from pflkit.flower.simulation import LocalGrid, run_flower
from pflkit.io import load_torch
from pflkit.models.introspect import count_params
from pflkit.run.environment import initial_model, make_env
from pflkit.run.runner import run_experiment
from tests.flower.helpers_flower import assert_same_run, experiment, rounded


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    cfg = experiment()
    loop = run_experiment(cfg, tmp_path_factory.mktemp("loop"), progress=False)
    flower = run_flower(cfg, tmp_path_factory.mktemp("flower"), backend="inprocess", node_seed=11)
    return cfg, loop, flower


@pytest.mark.parametrize("label", ["FedAvg", "FedL2P", "pFedHN", "FedSelect", "pFedVEM", "FT"])
def test_every_algorithm_gives_the_loops_numbers(both, label):
    _, loop, flower = both
    assert_same_run(loop, flower, label)


def test_bytes_are_what_travels(both):
    cfg, loop, flower = both
    rounds = {k: (loop["rounds"][k]["seed0"], flower["rounds"][k]["seed0"]) for k in loop["rounds"]}
    for label in ("FedAvg", "pFedHN", "FedSelect", "pFedVEM"):  # no cached parts: the loop's count
        for ra, rb in zip(*rounds[label]):
            assert (rb["bytes_down"], rb["bytes_up"]) == (ra["bytes_down"], ra["bytes_up"]), label
    fed = federation_for(cfg.data, load_dataset("digits"), 0)
    target = count_params(make_env(cfg, fed, 0).model_fn()) * 4
    rb = rounds["pFedHN"][1][0]
    assert rb["bytes_down"] == rb["clients"] * target  # pFedHN: the target network, not the hypernetwork
    full = rounds["FedAvg"][0][0]["bytes_down"] // rounds["FedAvg"][0][0]["clients"]
    assert all(r["bytes_up"] < r["clients"] * full for r in rounds["FedSelect"][1])  # shared part only
    # FedL2P: theta_g is cached on a node after its first message; then only lambda travels
    (l1, l2), (f1, f2) = rounds["FedL2P"]
    k = l1["clients"]
    lam = l1["bytes_up"] // k
    weights = l1["bytes_down"] // k - lam
    env = Env(model_fn=lambda: None, seed=cfg.seed)
    stage = next(m for m in cfg.methods if m.label == "FedL2P").config
    first, second = (sample_clients(fed.seen_ids, SamplingRule.of(stage), env, t) for t in (0, 1))
    assert f1["bytes_down"] == l1["bytes_down"]
    assert f2["bytes_down"] == k * lam + weights * len(set(second) - set(first)) < l2["bytes_down"]


def test_failing_and_slow_clients_are_left_out_and_the_rounds_complete(tmp_path):
    """Round 1: client 1 raises, client 2 answers too late; the state is FedAvg over clients 0 and 3."""
    pre = {"label": "FedAvg", "algorithm": "fedavg", "rounds": 2, "fraction": 1.0, "lr": 0.05, "batch_size": 16,
           "eval_every": 0, "keep_best": False}
    cfg = experiment(methods=[], pretrain=pre)
    s = settings_for(cfg)
    runtime(s["experiment-json"], s["preset"], "", 0)  # warm the clients' cache: only the sleeper is slow
    out = run_flower(cfg, tmp_path, backend="inprocess", timeout=1.5,
                     faults={"FedAvg/1/1": "raise", "FedAvg/2/1": "sleep:3"})
    h = out["rounds"]["FedAvg"]["seed0"]
    assert h[0]["failed"] == [1, 2] and h[0]["completed"] == 2 and h[0]["clients"] == 4
    assert "injected failure" in h[0]["failures"]["1"] and "no reply" in h[0]["failures"]["2"]
    assert h[1]["failed"] == [] and h[1]["completed"] == 4
    # the same two rounds by hand with pflkit's phases
    algo, stage = ALGORITHMS["fedavg"], cfg.pretrain.config
    fed = federation_for(cfg.data, load_dataset("digits"), 0)
    env = make_env(cfg, fed, 0)
    state = algo.init(initial_model(env), fed, stage, env)
    for t, ids in enumerate([[0, 3], [0, 1, 2, 3]]):
        now, updates = env.at_round(t), []
        for cid in ids:
            now.seed_torch("client", cid, t)
            updates.append(algo.client_update(algo.broadcast(state, cid, stage, now), fed.clients[cid], None,
                                              stage, now)[0])
        state = algo.aggregate(state, updates, stage, now)
    got = load_torch(tmp_path / "seed0" / "fedavg.weights.pt")
    for k, v in state["weights"].items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=1e-6)


def test_nodes_are_matched_to_partitions_whatever_their_ids():
    grid = LocalGrid(build_client_app(), 5, seed=4)
    nodes = NodeMap(5)
    nodes.refresh(grid)
    assert sorted(nodes.node_of) == list(range(5))
    for pid, node in nodes.node_of.items():
        assert grid.contexts[node].node_config["partition-id"] == pid
    # a SuperNode restarted after a crash: a new node id, the same partition; the newest claim wins
    old = grid.kill(2)
    new = grid.restart(2)
    nodes.refresh(grid)
    assert nodes.node_of[2] == new != old and nodes.cid_of[old] == -1 and nodes.cid_of[new] == 2
    assert sorted(nodes.node_of) == list(range(5))


class Stop(Exception):
    """Stands for the server process being killed in the middle of a stage."""


def stop_fedselect_at_round_1(monkeypatch, cfg, out, **kw):
    """A Flower run of ``cfg`` into ``out`` whose server stops before FedSelect's second round."""
    real = PflkitStrategy.train

    def killed(self, state, ids, env):
        if self.header["stage"] == "FedSelect" and env.round == 1:
            raise Stop
        return real(self, state, ids, env)

    with monkeypatch.context() as m:
        m.setattr(PflkitStrategy, "train", killed)
        with pytest.raises(Stop):
            run_flower(cfg, out, backend="inprocess", **kw)


def comparable(results: dict):
    """results.json content less what differs between two runs of the same thing (times, versions, the
    machine, which engine ran), floats to 6 significant digits."""
    return rounded({k: v for k, v in results.items() if k not in ("timing", "version", "environment", "engine")})


def test_flower_writes_the_local_runs_results_and_a_stopped_flower_run_resumes_to_them(tmp_path, monkeypatch):
    """FedSelect keeps a mask per client (a client state) and keep-best: a stop after its first round,
    then ``resume``, gives the results.json of an uninterrupted run, which is the local loop's."""
    cfg = experiment(methods=["FedSelect"])
    run_experiment(cfg, tmp_path / "local", progress=False)
    run_flower(cfg, tmp_path / "whole", backend="inprocess", node_seed=3)
    local, whole = (json.loads((tmp_path / run / "results.json").read_text()) for run in ("local", "whole"))
    assert comparable(whole) == comparable(local)
    assert [r["round"] for r in whole["rounds"]["FedSelect"]["seed0"]] == [1, 2]
    stop_fedselect_at_round_1(monkeypatch, cfg, tmp_path / "stopped", node_seed=3)
    assert (tmp_path / "stopped" / "client-states").is_dir()  # the clients' masks as of round 1
    run_flower(cfg, tmp_path / "stopped", backend="inprocess", node_seed=3, resume=True)
    assert comparable(json.loads((tmp_path / "stopped" / "results.json").read_text())) == comparable(whole)


def test_a_resumed_client_without_its_state_fails_instead_of_starting_afresh(tmp_path, monkeypatch):
    cfg = experiment(methods=["FedSelect"])
    stop_fedselect_at_round_1(monkeypatch, cfg, tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "client-states")  # nodes restarted without their state folder
    resumed = run_flower(cfg, tmp_path / "run", backend="inprocess", resume=True)
    (row,) = resumed["rounds"]["FedSelect"]["seed0"][1:]
    lost = "has no state of stage 'FedSelect'"
    assert row["val_failed"] and all(lost in r for r in row["val_failures"].values())
    method = resumed["methods"]["FedSelect"]
    assert method["status"] == "incomplete" and method["missing"] and all(lost in m["reason"] for m in method["missing"])


class ReversedGrid(LocalGrid):
    """Replies arrive in the reverse of the order the messages went out (as they may on a real federation)."""

    def send_and_receive(self, messages, *, timeout=None):
        return list(reversed(list(super().send_and_receive(messages, timeout=timeout))))


def test_replies_are_combined_in_client_order_not_arrival_order(monkeypatch, tmp_path):
    """Every evaluation pass hands the loop its clients' metrics in the loop's client order (a float mean
    summed in arrival order differs in its last digits from run to run), and training updates too."""
    from pflkit.flower.simulation import run_inprocess

    seen: list = []
    real_eval, real_train = PflkitStrategy.evaluate, PflkitStrategy.train

    def evaluate(self, state, ids, split, env, at_best=False):
        ev = real_eval(self, state, ids, split, env, at_best)
        seen.append((list(ids), list(ev.per_client)))
        return ev

    def train(self, state, ids, env):
        work = real_train(self, state, ids, env)
        seen.append((list(ids), [u.client_id for u in work.updates]))
        return work

    monkeypatch.setattr(PflkitStrategy, "evaluate", evaluate)
    monkeypatch.setattr(PflkitStrategy, "train", train)
    cfg = experiment(methods=["FedL2P"])
    sink: dict = {}
    server = build_server_app(settings_for(cfg, None, out=str(tmp_path)), sink)
    client = build_client_app()
    run_inprocess(server, client, cfg.data.num_clients, grid=ReversedGrid(client, cfg.data.num_clients, seed=3))
    assert sink["results"]["status"] == "ok"
    assert len(seen) > 4 and any(len(ids) > 1 for ids, _ in seen)
    for ids, order in seen:
        assert order == ids
