"""The participation protocol wraps every algorithm's phases: a variant built from FedAvg's runs under both modes.

docs/architecture.md's FedProx example replaces FedAvg's ``client_update`` and knows nothing of
``participation``; `pflkit.fl.algorithm.Algorithm.send` / ``respond`` hand it the plain message either way.
"""
from __future__ import annotations

import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from tests.helpers_data import digits_dataset, digits_env
from tests.test_architecture_doc import example

R = 0.5  # reporting probability: two of four clients on average
MODES = {
    "sampled": {"participation": "sampled", "sampling": "bernoulli", "fraction": R},
    "broadcast": {"participation": "broadcast", "sampling": "fraction", "fraction": 1.0, "report_fraction": R},
}


@pytest.fixture(scope="module")
def fed():
    return build_federation(digits_dataset(), "dirichlet", 4, seed=0, alpha=0.5)


def _run(algo, options, fed):
    cfg = algo.make_config({"rounds": 2, "lr": 0.05, "batch_size": 16, "local_epochs": 1, "eval_every": 0,
                            "keep_best": False, **options})
    env = digits_env()
    env.seed_torch("init")
    return run_rounds(algo, cfg, fed, env.model_fn(), env, test=False)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_documented_fedprox_at_mu_0_is_fedavg_under_each_participation_mode(fed, mode):
    fedprox = example()["FEDPROX"]
    plain = _run(ALGORITHMS["fedavg"], MODES[mode], fed)
    zero = _run(fedprox, {"mu": 0.0, **MODES[mode]}, fed)
    assert _same(plain.state["weights"], zero.state["weights"])  # bit for bit
    assert [r["train_loss"] for r in plain.history] == [r["train_loss"] for r in zero.history]


def test_documented_fedprox_under_broadcast_averages_only_the_reporters(fed):
    """Every client gets the broadcast, a proper subset reports, and the state is the one the same clients
    give when they are the round's sample: nobody else entered the aggregate."""
    fedprox = example()["FEDPROX"]
    broadcast = _run(fedprox, {"mu": 1.0, **MODES["broadcast"]}, fed)
    sampled = _run(fedprox, {"mu": 1.0, **MODES["sampled"]}, fed)
    for row in broadcast.history:
        assert row["clients"] == 4 and 0 < row["client_reported"] < 1
        assert row["bytes_up"] < row["bytes_down"]  # the non-reporters send nothing
    assert [r["train_loss"] for r in broadcast.history] == [r["train_loss"] for r in sampled.history]
    assert _same(broadcast.state["weights"], sampled.state["weights"])
    env = digits_env()
    env.seed_torch("init")
    start = {k: v.detach() for k, v in env.model_fn().state_dict().items()}
    assert not _same(broadcast.state["weights"], start)  # it trained
