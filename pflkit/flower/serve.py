"""A whole pflkit experiment driven from a Flower ServerApp, written like `pflkit.runner`.

`serve(grid, settings)` is what the ServerApp's ``main`` does: resolve the experiment
from the settings (run config), map nodes to clients once, then for every seed build
the federation (to sample clients and to initialize algorithms that need its shape,
such as pFedHN's embeddings), train the pretraining stage and every method with a
`PflkitStrategy` each, and write the same files as a pflkit run: one JSON per stage,
the pretrained weights, ``federation.npz`` and ``results.json``. One Flower run serves
every stage, so Ray starts once per experiment.

Not available on Flower (they need the clients' data or state on the server):
algorithm reports (``algo.report``) and ``resume``.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from flwr.serverapp import Grid

from pflkit.algorithms import get_algorithm
from pflkit.data.datasets import load_dataset
from pflkit.fl.train import set_state
from pflkit.flower.runtime import build_seed_federation, experiment_from_settings, stages
from pflkit.flower.server_app import NodeMap, PflkitStrategy
from pflkit.io import save_torch, write_json
from pflkit.runner import _method_entry, _stage_record, initial_model, make_env, slug, version_info

log = logging.getLogger(__name__)


def _setting(settings, key, default, typ):
    value = settings.get(key, default)
    return typ(value) if value not in (None, "") else default


def _train_stage(stage, fed, env, model, seed_dir: Path, grid: Grid, nodes: NodeMap, header: dict,
                 timeout: float | None, progress: bool) -> dict:
    """One stage on Flower; writes its record (and global weights) like `pflkit.runner._run_stage`."""
    algo = get_algorithm(stage.algorithm)
    strategy = PflkitStrategy(algo, stage.config, fed, env, nodes, {**header, "stage": stage.label},
                              timeout=timeout, desc=f"{stage.label} (seed {env.seed}, Flower)" if progress else None)
    result = strategy.run(grid, model)
    record = {**_stage_record(result), "engine": "flower"}
    if algo.exports_global and result.status == "ok":
        save_torch(seed_dir / f"{slug(stage.label)}.weights.pt", algo.global_model(result.state))
    write_json(seed_dir / f"{slug(stage.label)}.json", record)
    record["_global"] = algo.global_model(result.state) if algo.exports_global and result.status == "ok" else None
    return record


def _run_seed(grid, cfg, dataset, seed, out: Path, nodes, header, timeout, progress):
    """All stages of one seed, as `pflkit.runner.run_seed` (same models, same order, same seeds)."""
    seed_dir = out / f"seed{seed}"
    seed_dir.mkdir(parents=True, exist_ok=True)
    fed = build_seed_federation(cfg, dataset, seed)
    fed.save(seed_dir / "federation.npz")
    env = make_env(cfg, fed, seed)
    header = {**header, "seed": seed}
    records: dict[str, dict] = {}
    pretrained = None
    if cfg.pretrain is not None:
        rec = _train_stage(cfg.pretrain, fed, env, initial_model(env), seed_dir, grid, nodes, header, timeout, progress)
        records[cfg.pretrain.label], pretrained = rec, rec["_global"]
    for stage in cfg.methods:
        if get_algorithm(stage.algorithm).needs_pretrained:
            if pretrained is None:
                records[stage.label] = {"status": "diverged", "error": "pretraining diverged", "per_client": [],
                                        "summary": {"acc": math.nan}, "history": [], "seconds": 0.0}
                continue
            start = set_state(initial_model(env), pretrained)
        else:
            start = initial_model(env)
        records[stage.label] = _train_stage(stage, fed, env, start, seed_dir, grid, nodes, header, timeout, progress)
    for rec in records.values():
        rec.pop("_global", None)
    return records, {"seen": fed.seen_ids, "unseen": fed.unseen_ids}


def serve(grid: Grid, settings) -> dict:
    """Run the experiment named by ``settings`` on the nodes behind ``grid``; returns (and writes) the results.

    Settings (Flower run config keys): ``experiment-json`` or ``experiment`` + ``preset`` +
    ``overrides``; ``data-root``; ``out`` (folder for results); ``round-timeout`` (s, 0: wait
    for every client); ``node-wait`` (s to wait for all nodes to connect); ``progress``.
    """
    cfg = experiment_from_settings(settings)
    out = Path(_setting(settings, "out", f"runs/{cfg.name}-{cfg.preset}-flower", str))
    out.mkdir(parents=True, exist_ok=True)
    data_root = _setting(settings, "data-root", None, str)
    timeout = _setting(settings, "round-timeout", 0.0, float) or None
    progress = bool(_setting(settings, "progress", False, bool))
    t0 = time.perf_counter()
    dataset = load_dataset(cfg.data.dataset, data_root, **cfg.data.options)
    t_data = time.perf_counter() - t0
    nodes = NodeMap(cfg.data.num_clients)
    nodes.refresh(grid, timeout, wait=_setting(settings, "node-wait", 120.0, float))
    from pflkit.flower.runtime import settings_for

    header = {k: v for k, v in settings_for(cfg, data_root).items()}
    seeds = [cfg.seed + k for k in range(cfg.seeds)]
    runs = {s: _run_seed(grid, cfg, dataset, s, out, nodes, header, timeout, progress) for s in seeds}
    per_seed = {s: r[0] for s, r in runs.items()}
    all_stages = stages(cfg)
    methods = {st.label: _method_entry(st.label, st.algorithm, [per_seed[s][st.label] for s in seeds],
                                       cfg.published.get(st.label), [runs[s][1] for s in seeds]) for st in all_stages}
    results = {
        "config": cfg.to_dict(),
        "engine": "flower",
        "status": "ok" if all(m["status"] == "ok" for m in methods.values()) else "diverged",
        "methods": methods,
        "rounds": {st.label: {f"seed{s}": per_seed[s][st.label]["history"] for s in seeds} for st in all_stages},
        "timing": {"total_seconds": time.perf_counter() - t0, "data_seconds": t_data,
                   "stages": {st.label: {f"seed{s}": per_seed[s][st.label].get("seconds", 0.0) for s in seeds}
                              for st in all_stages}},
        "version": version_info(),
    }
    write_json(out / "results.json", results)
    return results
