"""Run an experiment end to end and write its ``results.json``.

For each seed: build the federation (saved beside the results), optionally train
the pretraining stage (its global model is then tested on every client: the
tables' "Global" column, and the start of every method that fine-tunes it), then
train and test every method. Each finished stage is written to disk at once, so
``resume=True`` skips finished stages and continues the unfinished one from its
last round checkpoint: a resumed run ends with the numbers of an uninterrupted one.
"""
from __future__ import annotations

import logging
import math
import platform
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

import pflkit
from pflkit.algorithms import get_algorithm
from pflkit.algorithms.base import Env
from pflkit.data.datasets import load_dataset
from pflkit.experiments import ExperimentConfig, StageConfig
from pflkit.fl.federation import Federation, build_federation
from pflkit.fl.loop import StageResult, run_rounds
from pflkit.fl.train import set_state
from pflkit.io import load_torch, read_json, save_torch, write_json
from pflkit.models import build_model

log = logging.getLogger(__name__)


def slug(label: str) -> str:
    """A file-name-safe form of a method label: 'FT (BN C)' -> 'ft-bn-c'."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "method"


def version_info() -> dict:
    """pflkit version and git commit (if run from a clone), torch and Python versions."""
    commit = None
    try:
        root = Path(pflkit.__file__).resolve().parent.parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"pflkit": pflkit.__version__, "git": commit, "torch": torch.__version__, "python": platform.python_version()}


def make_env(cfg: ExperimentConfig, fed: Federation, seed: int) -> Env:
    """The run context: a factory for the experiment's model on its device."""
    if cfg.kernels != "auto":
        from pflkit import kernels

        if hasattr(kernels, "set_backend"):
            kernels.set_backend(cfg.kernels)
    device = torch.device(cfg.device)

    def model_fn():
        return build_model(cfg.model.name, num_classes=fed.num_classes, input_shape=tuple(fed.x.shape[1:]),
                           **cfg.model.options)

    return Env(model_fn=model_fn, device=device, seed=seed, kernels=cfg.kernels)


def initial_model(env: Env) -> torch.nn.Module:
    """The run's seeded initial model (every method trained from scratch starts here)."""
    env.seed_torch("init")
    return env.model_fn().to(env.device)


def _stage_record(result: StageResult) -> dict:
    per_client = {int(k): v for k, v in result.per_client.items()}
    return {"status": result.status, "error": result.error, "best_round": result.best_round,
            "seconds": result.seconds, "summary": result.summary,
            "per_client": [per_client[k] for k in sorted(per_client)], "history": result.history}


def train_locally(algo, cfg, fed, model, env, *, checkpoint=None, resume=False, desc=None, label=None) -> StageResult:
    """The default engine: pflkit's own round loop."""
    return run_rounds(algo, cfg, fed, model, env, checkpoint=checkpoint, resume=resume, desc=desc)


def _run_stage(stage: StageConfig, fed, env, start_model, seed_dir: Path, resume: bool, progress: bool,
               train=train_locally) -> dict:
    """Train and test one stage with ``train`` (an engine), or read it back if a previous run finished it."""
    done = seed_dir / f"{slug(stage.label)}.json"
    if resume and done.exists():
        log.info("stage %s already finished: %s", stage.label, done)
        return read_json(done)
    algo = get_algorithm(stage.algorithm)
    result = train(algo, stage.config, fed, start_model, env, checkpoint=seed_dir / f"{slug(stage.label)}.ckpt",
                   resume=resume, desc=f"{stage.label} (seed {env.seed})" if progress else None, label=stage.label)
    record = _stage_record(result)
    if algo.report is not None and result.status == "ok" and result.client_states is not None:
        write_json(seed_dir / f"{slug(stage.label)}.report.json",
                   algo.report(result.state, fed, stage.config, env, result.client_states))
    if algo.exports_global and result.status == "ok":
        save_torch(seed_dir / f"{slug(stage.label)}.weights.pt", algo.global_model(result.state))
    write_json(done, record)
    (seed_dir / f"{slug(stage.label)}.ckpt").unlink(missing_ok=True)
    return record


def build_seed_federation(cfg: ExperimentConfig, dataset, seed: int) -> Federation:
    """The federation of one seed, exactly as every engine builds it."""
    d = cfg.data
    return build_federation(dataset, d.scheme, d.num_clients, seed=seed, split=d.split,
                            test_fraction=d.test_fraction, val_fraction=d.val_fraction, task=d.task,
                            augment=d.augment, unseen_clients=d.unseen_clients, **d.partition)


def run_seed(cfg: ExperimentConfig, dataset, seed: int, out: Path, resume: bool, progress: bool,
             train=train_locally):
    """All stages of one seed; returns ({label: stage record}, {"seen": ids, "unseen": ids})."""
    seed_dir = out / f"seed{seed}"
    seed_dir.mkdir(parents=True, exist_ok=True)
    fed = build_seed_federation(cfg, dataset, seed)
    fed.save(seed_dir / "federation.npz")
    env = make_env(cfg, fed, seed)
    records: dict[str, dict] = {}
    pretrained = None
    if cfg.pretrain is not None:
        records[cfg.pretrain.label] = rec = _run_stage(cfg.pretrain, fed, env, initial_model(env), seed_dir, resume,
                                                       progress, train)
        weights = seed_dir / f"{slug(cfg.pretrain.label)}.weights.pt"
        if rec["status"] == "ok" and weights.exists():
            pretrained = load_torch(weights)
    for stage in cfg.methods:
        algo = get_algorithm(stage.algorithm)
        if algo.needs_pretrained:
            if pretrained is None:
                records[stage.label] = {"status": "diverged", "error": "pretraining diverged", "per_client": [],
                                        "summary": {"acc": math.nan}, "history": [], "seconds": 0.0}
                continue
            start = set_state(initial_model(env), pretrained)
        else:
            start = initial_model(env)
        records[stage.label] = _run_stage(stage, fed, env, start, seed_dir, resume, progress, train)
    return records, {"seen": fed.seen_ids, "unseen": fed.unseen_ids}


def _pool_acc(record: dict, ids: list[int]) -> float:
    return 100.0 * float(np.mean([record["per_client"][i]["acc"] for i in ids]))


def _method_entry(label: str, algorithm: str, per_seed_records: list[dict], published,
                  pools: list[dict[str, list[int]]]) -> dict:
    """Summary of one method over seeds; with an unseen pool, acc_* are over seen clients."""
    ok = [(r, p) for r, p in zip(per_seed_records, pools) if r["status"] == "ok"]
    accs = [_pool_acc(r, p["seen"]) for r, p in ok]
    unseen = [_pool_acc(r, p["unseen"]) for r, p in ok if p["unseen"]]
    status = "ok" if len(ok) == len(per_seed_records) else "diverged"
    rounds = [r["history"] for r in per_seed_records]
    bytes_round = [np.mean([h["bytes_down"] + h["bytes_up"] for h in hist]) for hist in rounds if hist]
    return {
        "algorithm": algorithm, "status": status,
        "acc_mean": float(np.mean(accs)) if accs and status == "ok" else None,
        "acc_std": float(np.std(accs)) if accs and status == "ok" else None,
        "per_seed": [_pool_acc(r, p["seen"]) if r["status"] == "ok" else None
                     for r, p in zip(per_seed_records, pools)],
        "unseen": None if not unseen or status != "ok" else {"acc_mean": float(np.mean(unseen)),
                                                             "acc_std": float(np.std(unseen)), "per_seed": unseen},
        "per_client": [[100.0 * c["acc"] for c in r["per_client"]] for r in per_seed_records],
        "best_round": [r.get("best_round") for r in per_seed_records],
        "bytes_per_round": float(np.mean(bytes_round)) if bytes_round else 0.0,
        "published": published,
    }


def run_experiment(cfg: ExperimentConfig, out: str | Path, *, data_root=None, resume: bool = False,
                   progress: bool = True, train=train_locally, engine: str = "pflkit") -> dict:
    """Run every seed of ``cfg`` into ``out`` and write ``out/results.json`` (atomically).

    ``train`` is the engine that trains one stage (`train_locally`: pflkit's loop; the Flower
    server passes its own). Returns the results dict (keys: config, engine, status, methods,
    rounds, timing, version).
    Accuracies in ``methods`` are percentages (mean over clients of each client's test
    accuracy; ``acc_std`` is the standard deviation over seeds).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    dataset = load_dataset(cfg.data.dataset, data_root, **cfg.data.options)
    t_data = time.perf_counter() - t0
    seeds = [cfg.seed + k for k in range(cfg.seeds)]
    runs = {s: run_seed(cfg, dataset, s, out, resume, progress, train) for s in seeds}
    per_seed = {s: r[0] for s, r in runs.items()}
    stages = ([cfg.pretrain] if cfg.pretrain else []) + list(cfg.methods)
    methods = {st.label: _method_entry(st.label, st.algorithm, [per_seed[s][st.label] for s in seeds],
                                       cfg.published.get(st.label), [runs[s][1] for s in seeds]) for st in stages}
    results = {
        "config": cfg.to_dict(),
        "engine": engine,
        "status": "ok" if all(m["status"] == "ok" for m in methods.values()) else "diverged",
        "methods": methods,
        "rounds": {st.label: {f"seed{s}": per_seed[s][st.label]["history"] for s in seeds} for st in stages},
        "timing": {"total_seconds": time.perf_counter() - t0, "data_seconds": t_data,
                   "stages": {st.label: {f"seed{s}": per_seed[s][st.label].get("seconds", 0.0) for s in seeds}
                              for st in stages}},
        "version": version_info(),
    }
    write_json(out / "results.json", results)
    return results
