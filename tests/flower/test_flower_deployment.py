"""pflkit on a real Flower deployment on this machine: a SuperLink, four SuperNodes and ``flwr run`` as
separate processes on 127.0.0.1 (free ports, a temporary Flower home, every process ended by PID, every
wait bounded), started with the README's commands (`tests.flower.deployment`).

One run of ``demo`` at ``smoke`` meets what a deployment meets: a SuperNode is killed (SIGKILL) while it
works on a stage and started again with the same partition and state folder, then the run is stopped
with ``flwr stop`` in the middle of the last stage, and resumed with ``resume=true``. The resumed run ends
with the local run's numbers, stage by stage (the first stages come from the interrupted run, untouched).
Slow: about 4-8 minutes on the loaded 2-core machine, most of it a new ClientApp process (Python, torch,
the dataset) per message.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pflkit.run.experiments import resolve
from pflkit.run.runner import run_experiment
from tests.flower.deployment import SHORT_HEARTBEAT, Deployment, flower_cli_available, wait_until
from tests.flower.helpers_flower import rounded

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not flower_cli_available(), reason="Flower's CLI (flwr, flower-superlink) not found")]

NODES = 4
OVERRIDES = f"data.num_clients={NODES}"
VICTIM = 3  # the partition whose SuperNode dies
UNAVAILABLE = "Error: Node Unavailable"  # the SuperLink's reply for a node whose heartbeats stopped


def numbers(res: dict) -> dict:
    """What a run found (accuracies, per-client metrics, history), floats to 6 significant digits."""
    return rounded({"status": res["status"], "methods": res["methods"], "rounds": res["rounds"]})


def stage(seed_dir: Path, name: str) -> dict:
    return json.loads((seed_dir / f"{name}.json").read_text())


def test_demo_on_a_real_deployment_survives_a_dead_node_and_a_stop_and_resumes_to_the_local_results(tmp_path):
    local = run_experiment(resolve("demo", "smoke", [OVERRIDES]), tmp_path / "local", progress=False,
                           engine="sequential")
    out = tmp_path / "flower-out"
    seed = out / "seed0"
    config = f"experiment='demo' preset='smoke' overrides='{OVERRIDES}' out='{out}' node-wait=120.0"
    with Deployment(tmp_path / "deploy", NODES) as d:
        d.superlink()
        for i in range(NODES):  # the victim with Flower's shortest heartbeat: its death is seen within ~20 s
            d.supernode(i, heartbeat=SHORT_HEARTBEAT if i == VICTIM else None)
        d.start_run(config, "run-a")

        def why() -> str:
            return d.log("run-a")[-3000:] + d.log("superlink")[-2000:]

        # stages: Global, FT (BN C), FT (BN G), FT (BN I), FedL2P. Kill the victim while it works on FT (BN G)
        wait_until(lambda: (seed / "ft-bn-c.json").exists() or d.procs["run-a"].poll() is not None, 900,
                   "FT (BN C) finished")
        assert d.procs["run-a"].poll() is None, why()
        wait_until(lambda: d.busy(VICTIM), 300, f"node {VICTIM} running a ClientApp in FT (BN G)", every=0.05)
        assert not (seed / "ft-bn-g.json").exists()
        d.kill_node(VICTIM)
        d.supernode(VICTIM, heartbeat=SHORT_HEARTBEAT)  # restarted: a new node id, same partition, same state-dir
        # FedL2P's first round checkpointed: stop the run in the middle of that stage
        wait_until(lambda: (seed / "fedl2p.ckpt").exists() or d.procs["run-a"].poll() is not None, 600,
                   "FedL2P's first checkpoint")
        stopped = d.stop_run(d.run_id("run-a"))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        d.finish("run-a", 120)
        assert not (seed / "fedl2p.json").exists() and not (out / "results.json").exists(), why()

        killed = stage(seed, "ft-bn-g")  # the stage the node died in: incomplete, naming its client and why
        assert killed["status"] == "incomplete", killed
        assert [m["client"] for m in killed["missing"]] == [VICTIM]
        assert killed["missing"][0]["reason"].startswith(UNAVAILABLE), killed["missing"]
        acc = killed["per_client"][VICTIM].get("acc")
        assert acc is None or math.isnan(acc)  # JSON has no NaN: null
        after = stage(seed, "ft-bn-i")  # the next stage: the restarted node took partition 3 over
        assert after["status"] == "ok" and after["missing"] == [], after
        assert after["per_client"][VICTIM]["n"] > 0 and 0.0 <= after["per_client"][VICTIM]["acc"] <= 1.0
        for name in ("global", "ft-bn-c"):
            assert stage(seed, name)["status"] == "ok"

        # resumed: the incomplete stage (and those after it) trained again, the rest read back
        resumed = d.flwr_run(config + " resume=true", timeout=600)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + d.log("superlink")[-2000:]
    flower = json.loads((out / "results.json").read_text())
    assert flower["engine"] == "flower" and flower["status"] == "ok"
    assert numbers(flower) == numbers(local)
