"""Resume retries a stage left incomplete (e.g. a Flower node died), and the stages after it."""
from __future__ import annotations

import dataclasses
import json
import math

from pflkit.run.experiments import resolve
from pflkit.run.runner import run_experiment
from pflkit.run.trainer import Trainer, train_locally


def _sequential(train) -> Trainer:
    return Trainer(train=train, engine="sequential")


def _dropping_client(label: str, client: int):
    """An engine that loses ``client``'s test reply in stage ``label`` (what a dead node leaves)."""
    def train(algo, cfg, fed, model, env, **kwargs):
        result = train_locally(algo, cfg, fed, model, env, **kwargs)
        if kwargs.get("label") != label:
            return result
        per_client = {**result.per_client, client: {**result.per_client[client], "acc": math.nan}}
        return dataclasses.replace(result, status="incomplete", per_client=per_client,
                                   missing=[{"client": client, "reason": "node unavailable"}])
    return train


def _recording(calls: list):
    def train(algo, cfg, fed, model, env, **kwargs):
        calls.append(kwargs.get("label"))
        return train_locally(algo, cfg, fed, model, env, **kwargs)
    return train


def _numbers(res: dict) -> dict:
    return {label: {k: m[k] for k in ("status", "acc_mean", "per_client", "best_round")}
            for label, m in res["methods"].items()}


def test_resume_retries_an_incomplete_stage_and_the_stages_after_it(tmp_path):
    cfg = resolve("demo", "smoke", ["pretrain.rounds=1", "methods.FedL2P.rounds=1"])
    clean = run_experiment(cfg, tmp_path / "clean", progress=False, engine="sequential")
    out = tmp_path / "cut"
    first = run_experiment(cfg, out, progress=False, trainer=_sequential(_dropping_client("FT (BN C)", 3)))
    ft = first["methods"]["FT (BN C)"]
    assert first["status"] == "incomplete" and ft["status"] == "incomplete" and ft["acc_mean"] is None
    assert ft["per_client"][0][3] is None and ft["missing"] == [{"seed": 0, "client": 3, "reason": "node unavailable"}]
    calls: list = []
    resumed = run_experiment(cfg, out, progress=False, resume=True, trainer=_sequential(_recording(calls)))
    # Global finished ok and is kept; FT (BN C) is retried and every later stage trained again
    assert calls == ["FT (BN C)", "FT (BN G)", "FT (BN I)", "FedL2P"]
    assert resumed["status"] == "ok" and _numbers(resumed) == _numbers(clean)
    on_disk = json.loads((out / "results.json").read_text())
    assert _numbers(on_disk) == _numbers(json.loads((tmp_path / "clean" / "results.json").read_text()))


def test_a_resumed_incomplete_stage_reads_back_without_arithmetic_on_null(tmp_path):
    """A run resumed with the same lost reply: the stage stays incomplete, results.json is written
    (before: 100.0 * None on the null read back from the stage record)."""
    cfg = resolve("demo", "smoke", ["pretrain.rounds=1", "methods.FedL2P.rounds=1"])
    lose = _dropping_client("Global", 2)
    run_experiment(cfg, tmp_path, progress=False, trainer=_sequential(lose))
    again = run_experiment(cfg, tmp_path, progress=False, resume=True, trainer=_sequential(lose))
    glob = again["methods"]["Global"]
    assert glob["status"] == "incomplete" and glob["per_client"][0][2] is None
    assert all(isinstance(a, float) for i, a in enumerate(glob["per_client"][0]) if i != 2)
    assert (tmp_path / "results.json").exists()


class _Stop(Exception):
    pass


def _stopping_at(label: str, calls: list):
    """An engine that records its stages and stops the run (as a kill would) when it reaches ``label``."""
    def train(algo, cfg, fed, model, env, **kwargs):
        calls.append(kwargs.get("label"))
        if kwargs.get("label") == label:
            raise _Stop(label)
        return train_locally(algo, cfg, fed, model, env, **kwargs)
    return train


def test_a_retry_stopped_midway_leaves_no_old_record_to_read_back(tmp_path):
    """Global left incomplete; its retry is stopped at FT (BN I): the next resume must train FT (BN I) and
    FedL2P (whose old records came from the old Global's weights), not read them back as finished."""
    cfg = resolve("demo", "smoke", ["pretrain.rounds=1", "methods.FedL2P.rounds=1"])
    clean = run_experiment(cfg, tmp_path / "clean", progress=False, engine="sequential")
    out = tmp_path / "cut"
    run_experiment(cfg, out, progress=False, trainer=_sequential(_dropping_client("Global", 2)))
    assert (out / "seed0" / "fedl2p.json").exists()  # every later stage finished on the incomplete Global
    calls: list = []
    try:
        run_experiment(cfg, out, progress=False, resume=True,
                       trainer=_sequential(_stopping_at("FT (BN I)", calls)))
    except _Stop:
        pass
    assert calls == ["Global", "FT (BN C)", "FT (BN G)", "FT (BN I)"]
    assert not (out / "seed0" / "fedl2p.json").exists()  # the old record is gone, not left to be read back
    calls.clear()
    resumed = run_experiment(cfg, out, progress=False, resume=True, trainer=_sequential(_recording(calls)))
    assert calls == ["FT (BN I)", "FedL2P"]
    assert resumed["status"] == "ok" and _numbers(resumed) == _numbers(clean)
