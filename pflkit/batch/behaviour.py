"""A fingerprint per stage that follows what the stage computes, not the text of the code that computes it.

A committed result goes stale when its numbers would change. The digest of every run module
(`pflkit.batch.versions.code_version`) changes with any edit -- a refactor, a moved function, a faster engine that
gives the same numbers -- and would make every result stale at once. A stage's fingerprint instead is

* its settings: data, model, the stage's own settings and those of the stage it starts from
  (`pflkit.batch.reuse.stage_keys`, without the data files, which the runner checks on its own);
* its behaviour: the digest of what the stage computes, bitwise, on a micro-run of the same experiment
  at its ``smoke`` preset (the same algorithm, data set, partition scheme and model at tiny sizes): its
  per-client and per-round numbers and its report, everything but wall times (`record_digest`);
* the fingerprint of the stage it starts from (a pretraining that now computes otherwise stales the
  fine-tuning that starts from it).

So a change to one algorithm's arithmetic changes the micro-run of exactly its stages (and of those that
start from them), and a change that moves no number changes nothing. A micro-run is a probe, not a proof:
an edit that only shows at ``cpu`` sizes (a branch the smoke sizes never take) is missed, which is why the
pinned-number tests (`tests/algorithms/test_pinned_numbers.py`) stay; and a micro-run is bitwise only on
one machine: recomputed on another CPU it may differ in the last bits and stale a stage needlessly (never
the reverse). An experiment whose micro-run cannot run here (data missing offline) falls back to the digest
of the run code for its stages: any code change stales them, as before.

Micro-runs are cached by the run code's digest in ``results/_behaviour.json`` (`BehaviourCache`): with
unchanged code nothing runs, and after a change each experiment's micro-run runs once.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import tempfile
from pathlib import Path

from pflkit.io import read_json, slug, write_json

log = logging.getLogger(__name__)

CACHE_FILE = "_behaviour.json"  # in the results folder (beside the presets' folders)
UNTIMED = ("seconds", "wall_seconds", "engine")  # what a record holds that is not a number the stage computed


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def untimed(obj):
    """``obj`` less every `UNTIMED` key, at any depth (floats are kept as written: bitwise)."""
    if isinstance(obj, dict):
        return {k: untimed(v) for k, v in obj.items() if k not in UNTIMED}
    if isinstance(obj, list):
        return [untimed(v) for v in obj]
    return obj


def record_digest(seed_dirs: list[Path], label: str) -> str | None:
    """Digest of what stage ``label`` left in the seed folders of a finished run: its record, its report and,
    for a pretraining with its own federation, the record in ``pretrain/``; None when it left no record."""
    name, parts = slug(label), []
    for seed_dir in seed_dirs:
        files = [seed_dir / f"{name}.json", seed_dir / f"{name}.report.json", seed_dir / "pretrain" / f"{name}.json"]
        found = [(f.relative_to(seed_dir).as_posix(), untimed(read_json(f))) for f in files if f.exists()]
        if not found:
            return None
        parts.append(found)
    return _digest(parts)


@contextlib.contextmanager
def _one_thread():
    """One intra-op thread and a forked RNG: a micro-run's numbers do not depend on the caller's settings, and
    the caller's random state is left as it was."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)


def micro_run(path: Path, overrides=()) -> tuple[str, dict[str, str | None]]:
    """(digest of the smoke configuration, ``{stage label: behaviour digest}``) of the experiment file ``path``
    run at ``smoke`` on the CPU; every digest is None when it cannot run (data missing, invalid at smoke)."""
    from pflkit.run.experiments import resolve
    from pflkit.report.compact import config_digest
    from pflkit.run.runner import run_experiment

    smoke = resolve(path, "smoke", [*overrides, "device=cpu"])
    labels = ([smoke.pretrain.label] if smoke.pretrain else []) + [m.label for m in smoke.methods]
    key = config_digest(smoke.to_dict())
    with tempfile.TemporaryDirectory(prefix="pflkit-behaviour-") as tmp, _one_thread():
        try:
            run_experiment(smoke, Path(tmp) / "run", overwrite=True, progress=False)
        except Exception as e:  # noqa: BLE001 - the stages then fall back to the code digest
            log.info("micro-run of %s not possible (%s): its stages follow the code digest", Path(path).stem, e)
            return key, dict.fromkeys(labels)
        seeds = sorted(p for p in (Path(tmp) / "run").glob("seed*") if p.is_dir())
        return key, {label: record_digest(seeds, label) for label in labels}


class BehaviourCache:
    """The micro-runs' digests for one run-code digest, read from and written to ``folder/_behaviour.json``:
    ``{"code": source digest, "experiments": {name: {"smoke": config digest, "stages": {label: digest}}}}``.
    Entries made by other code are dropped when it is read; ``folder=None``: held in memory only."""

    def __init__(self, folder, code: dict):
        self.path, self.code = (Path(folder) / CACHE_FILE if folder is not None else None), code["source"]
        stored = read_json(self.path) if self.path is not None and self.path.exists() else {}
        self.entries = stored.get("experiments", {}) if stored.get("code") == self.code else {}
        self.changed = False

    def behaviour(self, name: str, path: Path, overrides=()) -> dict[str, str | None]:
        from pflkit.run.experiments import resolve
        from pflkit.report.compact import config_digest

        entry = self.entries.get(name)
        try:
            key = config_digest(resolve(path, "smoke", [*overrides, "device=cpu"]).to_dict())
        except Exception:  # noqa: BLE001 - no smoke preset that resolves: nothing to run
            return {}
        if entry is None or entry.get("smoke") != key:
            key, stages = micro_run(path, overrides)
            entry = self.entries[name] = {"smoke": key, "stages": stages}
            self.changed = True
        return entry["stages"]

    def save(self) -> None:
        if self.changed and self.path is not None:
            write_json(self.path, {"code": self.code, "experiments": dict(sorted(self.entries.items()))})
            self.changed = False


def stage_fingerprints(cfg, path: Path, code: dict, cache: BehaviourCache | None = None,
                       overrides=()) -> dict[str, str]:
    """``{stage label: fingerprint}`` of the resolved experiment ``cfg`` read from ``path``: settings,
    behaviour (``cache``'s micro-run; the code digest where there is none) and upstream (module docstring)."""
    from pflkit.batch.reuse import fingerprinted_config, stage_keys, stage_upstreams

    config = fingerprinted_config(cfg)
    settings, upstream = stage_keys({"config": config}), stage_upstreams(config)
    behaviour = (cache or BehaviourCache(None, code)).behaviour(cfg.name, path, overrides)
    out: dict[str, str] = {}
    for label in settings:  # in stage order: an upstream stage comes first
        did = behaviour.get(label) or {"code": code["source"]}
        out[label] = _digest({"settings": settings[label], "behaviour": did,
                              "upstream": out.get(upstream[label]) if upstream[label] else None})
    return out


def stale_stages(stored: dict | None, now: dict[str, str]) -> list[str]:
    """The stage labels of ``now`` whose fingerprint ``stored`` lacks or holds otherwise (all without one)."""
    if not stored:
        return list(now)
    return [label for label, fp in now.items() if stored.get(label) != fp]


def add_stage_fingerprints(results_dir, preset: str, code: dict, catalog: Path | None = None,
                           cache: BehaviourCache | None = None) -> dict[str, str]:
    """Give the compact results of ``results_dir/<preset>/`` that lack them their stages' fingerprints (a
    one-off migration from results that only stored the run-code digest): ``{experiment: what was done}``.

    Only a result whose stored run-code digest is ``code`` (the code computing the fingerprints now) and whose
    configuration digest is its experiment file's is given them: that code made it, so this code's micro-runs
    describe it. Any other is left as it is (a result stored without a code digest, made with
    ``--no-code-check``, cannot be told apart from one made by other code).
    """
    from pflkit.run.experiments import list_experiments, resolve
    from pflkit.report.compact import config_digest

    files, done = list_experiments(catalog), {}
    cache = cache or BehaviourCache(results_dir, code)
    for path in sorted((Path(results_dir) / preset).glob("*.json")):
        if path.name.startswith("_"):
            continue
        res = read_json(path)
        fp = res.get("fingerprint") or {}
        if fp.get("stages"):
            done[path.stem] = "has them"
        elif fp.get("code") != code:
            done[path.stem] = f"left: made by code {(fp.get('code') or {}).get('source')}, not {code['source']}"
        elif path.stem not in files:
            done[path.stem] = "left: no experiment file"
        else:
            cfg = resolve(files[path.stem], preset, list(res.get("overrides") or []))
            if config_digest(cfg.to_dict()) != fp.get("config"):
                done[path.stem] = "left: its experiment file changed"
                continue
            fp["stages"] = stage_fingerprints(cfg, files[path.stem], code, cache, res.get("overrides") or [])
            write_json(path, res)
            done[path.stem] = "given"
    cache.save()
    return done
