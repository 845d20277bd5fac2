"""docs/architecture.md's worked example (FedProx in a dozen lines) runs, and means what it says."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.config import ConfigError
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from tests.helpers_data import digits_dataset, digits_env

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def example() -> dict:
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL).group(1)
    space: dict = {}
    exec(compile(code, str(DOC), "exec"), space)  # noqa: S102 - the repository's own documentation
    return space


def train(algo, options, fed):
    cfg = algo.make_config({"rounds": 2, "fraction": 1.0, "lr": 0.05, "batch_size": 16, "local_epochs": 1,
                            **options})
    env = digits_env()
    env.seed_torch("init")
    return run_rounds(algo, cfg, fed, env.model_fn(), env, test=False).state["weights"]


def test_fedprox_example_is_fedavg_at_mu_0_and_pulls_toward_the_global_model_otherwise():
    fedprox = example()["FEDPROX"]
    fed = build_federation(digits_dataset(), "dirichlet", 4, seed=0, alpha=0.5)
    plain = train(ALGORITHMS["fedavg"], {}, fed)
    zero = train(fedprox, {"mu": 0.0}, fed)
    assert all(torch.equal(plain[k], zero[k]) for k in plain)  # mu = 0: FedAvg, bit for bit
    strong = train(fedprox, {"mu": 10.0}, fed)
    assert any(not torch.equal(plain[k], strong[k]) for k in plain)
    env = digits_env()
    env.seed_torch("init")
    start = {n: p.detach() for n, p in env.model_fn().named_parameters()}

    def moved(w):  # how far training took the weights from the initial model
        return sum((w[n] - start[n]).pow(2).sum() for n in start).item()
    assert moved(strong) < moved(plain)  # the proximal pull keeps the local models near the global one


def test_fedprox_example_config_is_checked_up_front():
    with pytest.raises(ConfigError, match="lr"):
        example()["FEDPROX"].make_config({"mu": 0.1, "lr": -1.0})
