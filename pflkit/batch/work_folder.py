"""One experiment of the batch in its work folder (``runs/reproduce/<preset>/<name>``), and its compact result.

The folder's markers say what its run was started with (`MARKER`: configuration, code and the stages'
behavioural fingerprints), which stages it took from another run folder (`REUSED`, `pflkit.batch.reuse`) and
every invocation that ran it, on what hardware (`INVOCATIONS`: a run stopped on one machine and resumed on
another names both). `run_one` resumes the folder's run when those markers match, starts it over otherwise,
and writes the compact result (`pflkit.report.compact`) from the run's ``results.json``.
"""
from __future__ import annotations

import contextlib
import datetime
import fnmatch
import logging
import shutil
import time
import traceback
from pathlib import Path
from typing import Iterator

from pflkit.batch.behaviour import stale_stages
from pflkit.batch.outcomes import DONE, FAILED, NOT_RUN, Outcome, one_line
from pflkit.batch.versions import config_hash
from pflkit.data.base import DatasetNotFoundError, offline
from pflkit.io import locked_folder, read_json, slug, write_json
from pflkit.report.compact import compact_result
from pflkit.report.divergence import mark_divergence
from pflkit.report.papers import KEEP_STATES  # runs whose trained states a notebook reads: each paper names its own

log = logging.getLogger(__name__)

MARKER = "reproduce.json"  # in a work folder: the configuration and code its run was started with
REUSED = "reused.json"  # in a work folder: the stages its run took from another run folder (`pflkit.batch.reuse`)
INVOCATIONS = "invocations.json"  # in a work folder: each invocation that ran its run, and on what hardware


def _missing_weights(cfg) -> str | None:
    """Offline and torchvision's ImageNet weights not cached: the file a run would need."""
    if not cfg.model.options.get("pretrained") or not offline():
        return None
    from pflkit.models.resnet import pretrained_cache_path  # torchvision: only for a pretrained model

    path = pretrained_cache_path()
    return None if Path(path).is_file() else f"ImageNet ResNet-18 weights ({path})"


def run_one(cfg, folder: Path, compact: Path, *, code: dict | None, overrides=(), data_root=None,
            download: bool = False, reuse: bool = True, stages: dict | None = None) -> Outcome:
    """Run (or resume) one experiment into ``folder`` and write its compact result to ``compact``.

    ``stages``: the stages' behavioural fingerprints (`pflkit.batch.behaviour.stage_fingerprints`), recorded with
    the result; a folder started by other code is resumed with only the stages whose fingerprint changed
    dropped (`_drop_stale_stages`), and a donor made by other code gives the stages whose fingerprint matches.

    ``reuse``: a run started afresh first takes the finished stages that another run folder of the
    batch holds with the same settings, data and code (`pflkit.batch.reuse`); the compact result names them.
    """
    # the runner and reuse (which imports it) load every algorithm and dataset: a batch worker process needs
    # them, the process that only plans the batch or skips every experiment does not
    from pflkit.batch.reuse import seed_from_donors
    from pflkit.run.folder import RunMismatchError
    from pflkit.run.runner import run_experiment

    weights = _missing_weights(cfg)
    if weights:
        return Outcome(cfg.name, NOT_RUN, f"weights missing: {weights}")
    key = {"config": config_hash(cfg), "code": code, **({"stages": stages} if stages else {})}
    marker, reused_file = folder / MARKER, folder / REUSED
    started = read_json(marker) if marker.exists() else {}
    # continue the folder's run only if it was started with this configuration and code (code=None: any), or
    # by other code whose stages' fingerprints it recorded: those that changed are dropped and train again
    resume = started.get("config") == key["config"] and (code is None or started.get("code") == code)
    if not resume and started.get("config") == key["config"] and stages and started.get("stages"):
        _drop_stale_stages(folder, stale_stages(started["stages"], stages))
        resume = True
    # the run's earlier invocations, or none when it starts over (or was resumed before they were recorded)
    calls = _invocations(folder / INVOCATIONS, resume)
    keep = any(fnmatch.fnmatchcase(cfg.name, p) for p in KEEP_STATES)
    if not resume:
        reused_file.unlink(missing_ok=True)
        if reuse:
            with locked_folder(folder):
                reused = seed_from_donors(cfg, folder, code=code, marker=MARKER, keep_states=keep, stages=stages)
            if reused:
                write_json(reused_file, reused)
                resume = True
    write_json(marker, key)
    t0 = time.perf_counter()
    kwargs = dict(data_root=data_root, download=download, progress=False, keep_states=keep)
    try:
        try:
            with _invocation(folder / INVOCATIONS, calls, cfg):
                results = run_experiment(cfg, folder, resume=resume, overwrite=not resume, **kwargs)
        except RunMismatchError:  # same config and code, other data files (than a donor's too): start over
            reused_file.unlink(missing_ok=True)
            calls = _invocations(folder / INVOCATIONS, False)
            with _invocation(folder / INVOCATIONS, calls, cfg):
                results = run_experiment(cfg, folder, overwrite=True, **kwargs)
    except DatasetNotFoundError as e:
        _drop_if_empty(folder)
        return Outcome(cfg.name, NOT_RUN, f"data missing: {e.name}", time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - one failed experiment must not stop the batch
        (folder / "reproduce-error.log").write_text(traceback.format_exc())
        log.warning("%s failed: %s (traceback in %s)", cfg.name, one_line(e), folder / "reproduce-error.log")
        return Outcome(cfg.name, FAILED, one_line(e), time.perf_counter() - t0)
    result = compact_result(results, folder, cfg_hash=key["config"], code=code, overrides=overrides)
    if stages:
        result["fingerprint"]["stages"] = stages
    if reused_file.exists():
        result["reused"] = read_json(reused_file)
    result["invocations"] = calls
    write_json(compact, result)
    (folder / "reproduce-error.log").unlink(missing_ok=True)
    bad = {label: m["status"] for label, m in mark_divergence(results)["methods"].items() if m["status"] != "ok"}
    reason = "" if not bad else "status " + ", ".join(f"{k}: {v}" for k, v in bad.items())
    return Outcome(cfg.name, DONE, reason, time.perf_counter() - t0)


def _drop_stale_stages(folder: Path, labels: list[str]) -> None:
    """Delete what the stages ``labels`` left in every seed folder of ``folder`` (record, report, weights,
    final states, checkpoint), so that resuming the run trains them again and keeps every other stage."""
    from pflkit.batch.reuse import stage_files  # the runner, as in `run_one`

    for seed_dir in sorted(p for p in folder.glob("seed*") if p.is_dir()):
        for label in labels:
            for path in stage_files(seed_dir, label) + [seed_dir / f"{slug(label)}.ckpt"]:
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def _invocations(path: Path, resume: bool) -> dict:
    """The record of the invocations that ran a work folder's run: ``{"unrecorded": bool, "runs": [...]}``.

    A resumed run continues its record; one resumed from before invocations were recorded has
    ``unrecorded`` set (its earlier hardware is unknown). A run that starts over starts a new record.
    """
    if not resume:
        return {"unrecorded": False, "runs": []}
    try:
        return read_json(path)
    except (OSError, ValueError):
        return {"unrecorded": True, "runs": []}


@contextlib.contextmanager
def _invocation(path: Path, calls: dict, cfg) -> Iterator[None]:
    """Record this invocation in ``calls`` (written to ``path`` before the run starts, so a killed process
    leaves its entry): when it started, the GPU's name or the CPU's vector instructions
    (`pflkit.run.environment.device_info`), and, when it returns or raises, its wall seconds. A run resumed on other
    hardware then names every machine it ran on, not only the last one (``environment``)."""
    from pflkit.run.environment import device_info  # the runner, as in `run_one`

    info = device_info(cfg)
    entry = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "gpu": info["gpu"], "cpu_capability": info["cpu_capability"], "seconds": None}
    calls["runs"].append(entry)
    write_json(path, calls)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        write_json(path, calls)


def _drop_if_empty(folder: Path) -> None:
    """Remove a work folder that holds no run (only the marker, the invocation record and the lock)."""
    if folder.is_dir() and {p.name for p in folder.iterdir()} <= {MARKER, INVOCATIONS, ".pflkit.lock"}:
        shutil.rmtree(folder, ignore_errors=True)
