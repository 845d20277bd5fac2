"""The committed compact results (``results/<preset>/<experiment>.json``) as notebooks and the CLI read them.

A notebook in results mode draws every table, figure and verdict from these files, so it shows the batch's
numbers on open, with no training. They are found, in this order: a folder the caller names; the folder
in ``$PFLKIT_RESULTS``; the ``results/`` of the checkout pflkit runs from (a clone, an editable install,
Colab's ``pflkit-src``). A wheel install carries no results: it then has to be told where they are.

The view returned by `read_committed` is the compact result with its per-round ``history`` also under
``rounds`` (the key of a run's ``results.json``), so the table and figure functions take either.
"""
from __future__ import annotations

import os
from pathlib import Path

from pflkit.io import read_json
from pflkit.report.divergence import mark_divergence

RESULTS_ENV = "PFLKIT_RESULTS"  # a folder holding <preset>/<experiment>.json
CLONE_DIR = "pflkit-src"  # where the notebooks' install cell clones the repository


class MissingResultError(FileNotFoundError):
    """A committed result that is not there; the message names the experiment, the preset and the folder."""


def _candidates(explicit) -> list[Path]:
    here = Path(__file__).resolve().parents[2] / "results"  # the checkout pflkit was imported from
    found = [Path(explicit)] if explicit else []
    if os.environ.get(RESULTS_ENV):
        found.append(Path(os.environ[RESULTS_ENV]))
    return found + [here, Path.cwd() / CLONE_DIR / "results", Path.cwd() / "results"]


def results_dir(preset: str, path: str | os.PathLike | None = None) -> Path:
    """The folder of ``preset``'s committed results: ``path/<preset>`` (or ``path`` itself when it holds
    the ``*.json`` results), else ``$PFLKIT_RESULTS/<preset>``, else the checkout's ``results/<preset>``."""
    if path and Path(path).is_dir() and any(Path(path).glob("*.json")):
        return Path(path)
    for root in _candidates(path):
        if (root / preset).is_dir() and any((root / preset).glob("*.json")):
            return root / preset
    where = f"{path} or " if path else ""
    raise MissingResultError(f"no committed results of preset {preset!r} in {where}${RESULTS_ENV} or a checkout's "
                             "results/ folder; clone the repository, or pass the folder as results_dir")


def read_committed(name: str, preset: str, path: str | os.PathLike | None = None) -> dict:
    """Experiment ``name``'s committed result at ``preset``, marked where it diverged
    (`pflkit.report.divergence.mark_divergence`), with ``rounds`` beside ``history``."""
    folder = results_dir(preset, path)
    file = folder / f"{name}.json"
    if not file.is_file():
        raise MissingResultError(f"{name}: no committed result at preset {preset!r} in {folder}; "
                                 "train it with source='train'")
    res = mark_divergence(read_json(file))
    return {**res, "rounds": res.get("history", {})}


def _minutes(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def training_time(res: dict) -> str:
    """How long the committed batch took to train this result, and on what: ``"21 min on one CPU thread
    (AVX512)"``; the GPU's name where an invocation ran on one."""
    seconds = (res.get("timing") or {}).get("total_seconds")
    if seconds is None:
        return "time not recorded"
    runs = (res.get("invocations") or {}).get("runs") or []
    gpus = sorted({r["gpu"] for r in runs if r.get("gpu")})
    cpus = sorted({r["cpu_capability"] for r in runs if r.get("cpu_capability") and not r.get("gpu")})
    on = " and ".join([*gpus, *(f"one CPU thread ({c})" for c in cpus)]) or "one CPU thread"
    return f"{_minutes(seconds)} on {on}"


def total_training_time(results: list[dict]) -> str:
    """The summed training time of several committed results (one thread each, one after the other)."""
    seconds = [(r.get("timing") or {}).get("total_seconds") for r in results]
    known = [s for s in seconds if s is not None]
    if not known:
        return "not recorded"
    return _minutes(sum(known)) + ("" if len(known) == len(seconds) else " (some not recorded)")
