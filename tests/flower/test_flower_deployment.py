"""pflkit on a real Flower deployment on this machine: a SuperLink, four SuperNodes and ``flwr run`` as
separate processes on 127.0.0.1 (free ports, a temporary Flower home, every process ended by PID), started
with the README's commands (`tests.flower.deployment`). Slow: about 8 minutes on a loaded 2-core machine,
most of it a new ClientApp process (torch import, data) per message."""
from __future__ import annotations

import json

import pytest

from pflkit.experiments import resolve
from pflkit.runner import run_experiment
from tests.flower.deployment import Deployment, flower_cli_available

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not flower_cli_available(), reason="Flower's CLI (flwr, flower-superlink) not found")]

NODES = 4
OVERRIDES = f"data.num_clients={NODES}"


def numbers(res: dict) -> dict:
    """What a run found (accuracies, per-client metrics, history), floats to 6 significant digits."""
    def walk(x):
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items() if k != "seconds"}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return float(f"{x:.6g}") if isinstance(x, float) else x

    return walk({"status": res["status"], "methods": res["methods"], "rounds": res["rounds"]})


def test_demo_on_a_real_deployment_gives_the_local_runs_results(tmp_path):
    local = run_experiment(resolve("demo", "smoke", [OVERRIDES]), tmp_path / "local", progress=False,
                           engine="sequential")
    out = tmp_path / "flower-out"
    with Deployment(tmp_path / "deploy", NODES) as d:
        d.superlink()
        for i in range(NODES):
            d.supernode(i)
        run = d.flwr_run(f"experiment='demo' preset='smoke' overrides='{OVERRIDES}' out='{out}' node-wait=120.0",
                         timeout=1200)
        assert run.returncode == 0, run.stdout[-3000:] + d.log("superlink")[-3000:]
    flower = json.loads((out / "results.json").read_text())
    assert flower["engine"] == "flower" and flower["status"] == "ok"
    assert numbers(flower) == numbers(local)
