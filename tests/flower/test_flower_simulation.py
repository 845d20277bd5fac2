"""A real Flower simulation (run_simulation, Ray actors, random node ids) against pflkit's own loop.

One Ray start for the whole file (about 20-40 s on a busy 2-core machine): 4 virtual clients,
FedAvg for 2 rounds, FedL2P for 2 rounds from it, pFedHN for 1 round, and a FedAvg stage in
which client 2 raises in training, and one in which client 1 raises in the test pass.
"""
from __future__ import annotations

import importlib.util
import math

import pytest

from pflkit.flower.simulation import run_flower
from pflkit.run.runner import run_experiment
from tests.flower.helpers_flower import assert_same_run, experiment

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Flower's simulation needs ray")

FAULTY = {"FedAvg (faulty)": {"algorithm": "fedavg", "rounds": 1, "fraction": 1.0, "lr": 0.05, "batch_size": 16,
                              "eval_every": 0},
          "FedAvg (test fault)": {"algorithm": "fedavg", "rounds": 1, "fraction": 0.25, "lr": 0.05, "batch_size": 16,
                                  "eval_every": 0}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cfg = experiment(methods=["FedL2P", "pFedHN"], extra=FAULTY)
    loop = run_experiment(cfg, tmp_path_factory.mktemp("loop"), progress=False)
    flower = run_flower(cfg, tmp_path_factory.mktemp("ray"), backend="ray", num_cpus=2, client_cpus=1,
                        faults={"FedAvg (faulty)/2/1": "raise", "FedAvg (test fault)/1/test": "raise"})
    return loop, flower


@pytest.mark.parametrize("label", ["FedAvg", "FedL2P", "pFedHN"])
def test_flower_simulation_gives_the_loops_numbers(runs, label):
    assert_same_run(*runs, label)


def test_a_raising_client_is_left_out_and_recorded(runs):
    _, flower = runs
    (row,) = flower["rounds"]["FedAvg (faulty)"]["seed0"]
    assert row["failed"] == [2] and row["completed"] == 3 and row["clients"] == 4
    assert "injected failure of client 2" in row["failures"]["2"]
    assert flower["methods"]["FedAvg (faulty)"]["status"] == "ok"
    # Ray's 2 KB coloured traceback is reduced to the exception's type and message
    assert row["failures"]["2"] == "RuntimeError: injected failure of client 2 (FedAvg (faulty)/2/1)"


def test_a_failed_test_evaluation_under_ray_makes_the_stage_incomplete(runs):
    _, flower = runs
    method = flower["methods"]["FedAvg (test fault)"]
    assert method["status"] == "incomplete" and method["acc_mean"] is None
    assert method["missing"] == [{"seed": 0, "client": 1,
                                  "reason": "RuntimeError: injected failure of client 1 (FedAvg (test fault)/1/test)"}]
    per_client = method["per_client"][0]  # NaN in memory (null in results.json) for the missing client
    assert per_client[1] is None or math.isnan(per_client[1])
    assert all(0 <= a <= 100 for i, a in enumerate(per_client) if i != 1)
