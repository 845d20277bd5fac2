"""Client failures on Flower (in-process grid): one-line reasons, full traces in a log, evaluation faults,
"incomplete" stages, nodes that connect late or never. No timing assertions but generous waits."""
from __future__ import annotations

import math
import time

import pytest

from pflkit.flower.client_app import build_client_app
from pflkit.flower.failures import LIMIT, LOG_FILE, one_line
from pflkit.flower.nodes import NodeMap
from pflkit.flower.runtime import settings_for
from pflkit.flower.serve import build_server_app
from pflkit.flower.server_app import PflkitStrategy
from pflkit.flower.simulation import LocalGrid, run_flower, run_inprocess
from pflkit.io import read_json
from tests.flower.helpers_flower import experiment

FEDAVG = {"algorithm": "fedavg", "rounds": 2, "fraction": 1.0, "lr": 0.05, "batch_size": 16, "eval_every": 1,
          "keep_best": False}

# what Flower's Ray simulation sent back for a ClientApp that raised (flwr 1.41, colour codes included)
RAY_REASON = (
    "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor.run()\x1b[39m "
    "(pid=4242, ip=10.0.0.2, actor_id=abc, repr=<flwr.simulation.ray_transport.ray_actor.ClientAppActor object>)\n"
    "  File \"/site-packages/flwr/simulation/ray_transport/ray_actor.py\", line 62, in run\n"
    "    out_message = app(message=message, context=context)\n"
    "pflkit.flower.client_app.ClientFailure: RuntimeError: boom\n\n"
    "The above exception was the direct cause of the following exception:\n\n"
    "\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=4242, ip=10.0.0.2)\n"
    "  File \"/site-packages/flwr/simulation/ray_transport/ray_actor.py\", line 65, in run\n"
    "    raise ClientAppException(str(ex)) from ex\n"
    "flwr.clientapp.client_app.ClientAppException: \x1b[91m\n"
    "Exception ClientAppException occurred. Message: RuntimeError: boom\x1b[0m'>")


@pytest.mark.parametrize("reason, expected", [
    (RAY_REASON, "RuntimeError: boom"),
    ("<class 'flwr.clientapp.client_app.ClientAppException'>:<'\nException ClientAppException occurred. "
     "Message: ValueError: bad shape (3, 4)'>", "ValueError: bad shape (3, 4)"),
    ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    g()\n"
     "torch.OutOfMemoryError: CUDA out of memory.\nTried to allocate 2 GiB", "OutOfMemoryError: CUDA out of memory."),
    ("no reply within 1.5 s", "no reply within 1.5 s"),
    ("<class 'KeyError'>:<'weights'>", "KeyError: weights"),
])
def test_a_failure_reason_becomes_one_line_with_type_and_message(reason, expected):
    assert one_line(reason) == expected


def test_a_long_reason_is_cut_to_the_limit():
    line = one_line("Traceback (most recent call last):\n  File ...\nValueError: " + "x" * 5000)
    assert line.startswith("ValueError: xxx") and line.endswith("...") and len(line) <= LIMIT


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """FedAvg with client 3 raising in training round 1; "FedAvg B" with client 1 raising in every
    validation pass and client 2 in the test pass."""
    cfg = experiment(methods=["FedAvg B"], extra={"FedAvg B": FEDAVG}, pretrain={"label": "FedAvg", **FEDAVG})
    out = tmp_path_factory.mktemp("faulty")
    results = run_flower(cfg, out, backend="inprocess",
                         faults={"FedAvg/3/1": "raise", "FedAvg B/1/val": "raise", "FedAvg B/2/test": "raise"})
    return out, results


def test_a_failed_training_client_is_left_out_and_the_stage_stays_ok(faulty):
    out, results = faulty
    r1, r2 = results["rounds"]["FedAvg"]["seed0"]
    assert r1["failed"] == [3] and r1["completed"] == 3 and r1["clients"] == 4
    assert r1["failures"] == {"3": "RuntimeError: injected failure of client 3 (FedAvg/3/1)"}
    assert r2["failed"] == [] and r2["completed"] == 4
    assert "val_failed" not in r1 and "val_failed" not in r2  # training faults do not touch evaluation
    stage = read_json(out / "seed0" / "fedavg.json")
    assert stage["status"] == "ok" and stage["missing"] == []
    assert all(math.isfinite(c["acc"]) for c in stage["per_client"])


def test_a_failed_test_evaluation_makes_the_stage_incomplete_naming_the_client(faulty):
    out, results = faulty
    reason = "RuntimeError: injected failure of client 2 (FedAvg B/2/test)"
    stage = read_json(out / "seed0" / "fedavg-b.json")
    assert stage["status"] == "incomplete"
    assert stage["missing"] == [{"client": 2, "reason": reason}]
    accs = [c["acc"] for c in stage["per_client"]]
    assert accs[2] is None and stage["per_client"][2]["failed"] == reason  # NaN in memory, null in JSON
    assert all(isinstance(a, float) and 0 <= a <= 1 for i, a in enumerate(accs) if i != 2)
    method = results["methods"]["FedAvg B"]
    assert method["status"] == "incomplete" and method["acc_mean"] is None
    # validation: client 1 fails every pass, the others are averaged; training is untouched
    for row in results["rounds"]["FedAvg B"]["seed0"]:
        assert row["failed"] == [] and row["val_failed"] == [1]
        assert row["val_failures"] == {"1": "RuntimeError: injected failure of client 1 (FedAvg B/1/val)"}
        assert math.isfinite(row["val_acc"])


def test_the_full_trace_goes_to_the_failure_log_not_the_results(faulty):
    out, results = faulty
    text = (out / LOG_FILE).read_text()
    assert text.count("=== ") == 1 + 2 + 1  # one training, two validation, one test failure
    assert "FedAvg B (seed 0) test: client 2: RuntimeError: injected failure of client 2" in text
    assert "Traceback (most recent call last)" in text and "in _inject" in text  # the client's frames
    for row in results["rounds"]["FedAvg B"]["seed0"] + results["rounds"]["FedAvg"]["seed0"]:
        for reason in list(row["failures"].values()) + list(row.get("val_failures", {}).values()):
            assert "\n" not in reason and "\x1b" not in reason and len(reason) <= LIMIT


class LateGrid(LocalGrid):
    """Partition ``late`` connects ``delay`` s after start and answers its first query ``slow`` s late;
    ``never``: partitions whose node never connects."""

    def __init__(self, *args, late=None, delay=0.0, slow=0.0, never=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.t0, self.delay, self.slow = time.monotonic(), delay, slow
        pid = {c.node_config["partition-id"]: n for n, c in self.contexts.items()}
        self.late = pid.get(late)
        self.never = {pid[p] for p in never}
        self.first_query_done = False

    def get_node_ids(self):
        up = time.monotonic() - self.t0 >= self.delay
        return [n for n in self.contexts if n not in self.never and (up or n != self.late)]

    def _deliver(self, msg):
        if msg.metadata.dst_node_id == self.late and msg.metadata.message_type == "query" and not self.first_query_done:
            self.first_query_done = True
            time.sleep(self.slow)  # a node still starting up: healthy, but slower than a round's timeout
        return super()._deliver(msg)


def test_a_node_that_connects_late_and_answers_slowly_is_still_mapped():
    grid = LateGrid(build_client_app(), 4, seed=3, late=3, delay=0.5, slow=1.0)
    nodes = NodeMap(4)
    t = time.monotonic()
    nodes.refresh(grid, timeout=0.2, wait=60)
    assert sorted(nodes.node_of) == [0, 1, 2, 3] and nodes.node_of[3] == grid.late
    assert time.monotonic() - t < 30  # it stopped waiting once every partition had a node


def test_a_node_that_never_connects_is_reported_after_the_wait(tmp_path):
    cfg = experiment(methods=[], pretrain={"label": "FedAvg", **FEDAVG, "rounds": 1, "eval_every": 0})
    sink = {}
    settings = settings_for(cfg, out=str(tmp_path), **{"node-wait": 0.5})
    client = build_client_app()
    grid = LateGrid(client, 4, seed=1, never=[1])
    t = time.monotonic()
    run_inprocess(build_server_app(settings, sink), client, 4, grid=grid)
    assert time.monotonic() - t >= 0.5
    reason = "no node with partition-id 1 connected within 0.5 s"
    (row,) = sink["results"]["rounds"]["FedAvg"]["seed0"]
    assert row["failed"] == [1] and row["failures"] == {"1": reason} and row["completed"] == 3
    stage = read_json(tmp_path / "seed0" / "fedavg.json")
    assert stage["status"] == "incomplete" and stage["missing"] == [{"client": 1, "reason": reason}]


def test_a_node_that_dies_is_named_with_flowers_reason_and_its_restart_takes_the_partition_over(tmp_path,
                                                                                                  monkeypatch):
    """Partition 3's node dies before FedAvg's second round and starts again (a new node id) before
    FedAvg B's second round: the SuperLink's node-unavailable replies (sent by node 1, not by the dead
    node) are the recorded reason, FedAvg is incomplete naming client 3, FedAvg B uses the new node
    from the round after the restart on and finishes ok."""
    cfg = experiment(methods=["FedAvg B"], extra={"FedAvg B": FEDAVG}, pretrain={"label": "FedAvg", **FEDAVG})
    real = PflkitStrategy.train

    def train(self, state, ids, env):
        if self.header["stage"] == "FedAvg" and env.round == 1:
            self.grid.kill(3)
        if self.header["stage"] == "FedAvg B" and env.round == 1:
            self.grid.restart(3)
        return real(self, state, ids, env)

    monkeypatch.setattr(PflkitStrategy, "train", train)
    results = run_flower(cfg, tmp_path, backend="inprocess")
    r1, r2 = results["rounds"]["FedAvg"]["seed0"]
    assert r1["failed"] == [] and r2["failed"] == [3] and r2["completed"] == 3
    assert r2["failures"]["3"].startswith("Error: Node Unavailable") and r2["val_failed"] == [3]
    stage = read_json(tmp_path / "seed0" / "fedavg.json")
    assert stage["status"] == "incomplete"
    assert [m["client"] for m in stage["missing"]] == [3] and "Node Unavailable" in stage["missing"][0]["reason"]
    b1, b2 = results["rounds"]["FedAvg B"]["seed0"]
    assert b1["failed"] == [3] and "Node Unavailable" in b1["failures"]["3"]
    assert b2["failed"] == [] and b2["completed"] == 4 and b2.get("val_failed", []) == []
    assert results["methods"]["FedAvg B"]["status"] == "ok"


def fedselect_with_a_restart(tmp_path, monkeypatch, node_config: dict) -> dict:
    """FedSelect (each client keeps its mask: a client state), every client in every round, on in-process
    nodes with ``node_config``; partition 3's node dies and a new one (new node id, the same node config,
    an empty context: a new process) starts between rounds 1 and 2, so no message is lost, only memory."""
    select = {"algorithm": "fedselect", "rounds": 2, "fraction": 1.0, "local_epochs": 1, "ltn_iterations": 1,
              "ltn_epochs": 1, "batch_size": 16}
    cfg = experiment(methods=["FedSelect"], extra={"FedSelect": select})
    real, swaps = PflkitStrategy.train, []

    def train(self, state, ids, env):
        if self.header["stage"] == "FedSelect" and env.round == 1:
            swaps.append((self.grid.kill(3), self.grid.restart(3)))
        return real(self, state, ids, env)

    client, sink = build_client_app(), {}
    grid = LocalGrid(client, 4, seed=5, node_config=node_config)
    # "client-state-dir": "": as on a deployment, only the node's own state-dir keeps states on disk
    settings = settings_for(cfg, out=str(tmp_path / "flower"), **{"client-state-dir": ""})
    with monkeypatch.context() as m:
        m.setattr(PflkitStrategy, "train", train)
        run_inprocess(build_server_app(settings, sink), client, 4, grid=grid)
    (old, new), = swaps
    assert new != old and grid.node_of(3) == new
    return cfg, sink["results"]


def test_a_restarted_node_reads_its_clients_state_back_from_its_state_folder(tmp_path, monkeypatch):
    """With a node state folder the restarted node finds client 3's FedSelect mask there: the run has the
    local loop's numbers (no failure); without one, client 3 fails for the lost state (not a fresh start)."""
    from pflkit.run.runner import run_experiment
    from tests.flower.helpers_flower import assert_same_run

    cfg, results = fedselect_with_a_restart(tmp_path / "kept", monkeypatch, {"state-dir": str(tmp_path / "states")})
    assert any((tmp_path / "states").rglob("client3/cs@*.pt"))  # the folder the new node read
    loop = run_experiment(cfg, tmp_path / "loop", progress=False)
    assert_same_run(loop, results, "FedSelect")

    _, lost = fedselect_with_a_restart(tmp_path / "lost", monkeypatch, {})
    r1, r2 = lost["rounds"]["FedSelect"]["seed0"]
    assert r1["failed"] == [] and r2["failed"] == [3]
    assert "has no state of stage 'FedSelect'" in r2["failures"]["3"]
