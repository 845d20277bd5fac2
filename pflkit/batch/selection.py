"""Which experiments a batch runs: the experiment files of the selection (``--paper``, ``--only``), and the
plan: an experiment whose compact result was made from the same configuration (`config_hash`) and code
(`code_version`, or, made by other code, the same behavioural fingerprint of every stage:
`pflkit.batch.behaviour`) is skipped, every other one runs."""
from __future__ import annotations

import fnmatch
from functools import partial
from pathlib import Path
from typing import Callable

from pflkit.batch.behaviour import BehaviourCache, stage_fingerprints, stale_stages
from pflkit.batch.outcomes import FAILED, SKIPPED, Outcome
from pflkit.batch.versions import config_hash
from pflkit.config import ConfigError
from pflkit.io import read_json, write_json
from pflkit.report.compact import COMPACT_FORMAT, compact_path
from pflkit.run.experiments import list_experiments, resolve, tomllib


def _paper_of(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return str(tomllib.load(f).get("experiment", {}).get("paper", ""))
    except (OSError, ValueError):
        return ""


def _matches(name: str, pattern: str, names=()) -> bool:
    """``pattern``: comma-separated globs (``fedl2p_table3_*``) or plain substrings (``demo``); a part
    that is itself one of ``names`` (an experiment's full name) matches that experiment only, so the
    command of ``pfedhn_table1_c10_n10`` does not also run ``pfedhn_table1_c10_n100``."""
    for p in (s.strip() for s in pattern.split(",")):
        if not p:
            continue
        if any(c in p for c in "*?["):
            hit = fnmatch.fnmatchcase(name, p)
        else:
            hit = name == p if p in names else p in name
        if hit:
            return True
    return False


def select(paper: str | None = None, only: str | None = None, root: Path | None = None) -> dict[str, Path]:
    """The experiment files of the batch, by name: of ``paper`` (its folder or ``[experiment] paper``),
    whose names match ``only``. An empty selection is an error naming what exists."""
    found = list_experiments(root)
    chosen = {n: p for n, p in found.items()
              if (not paper or paper in (p.parent.name, _paper_of(p))) and (not only or _matches(n, only, found))}
    if not chosen:
        papers = sorted({p.parent.name for p in found.values()})
        raise ConfigError(f"no experiment matches --paper {paper!r} --only {only!r}; papers: {', '.join(papers)}")
    return chosen


def _up_to_date(stored: Path, cfg, code: dict | None, stages: Callable[[], dict] | None = None) -> tuple[bool, str]:
    """(skip?, why not): same configuration and, with ``code``, the same code version or, given ``stages``
    (a function returning the stages' behavioural fingerprints, `pflkit.batch.behaviour.stage_fingerprints`), the
    same fingerprint of every stage; in the current compact format (an older format is rewritten from the
    kept run folder, which resumes at no cost). Why not names the stages whose behaviour changed."""
    if not stored.exists():
        return False, "new"
    try:
        res = read_json(stored)
    except (OSError, ValueError):
        return False, "unreadable compact result"
    fp = res.get("fingerprint", {})
    if res.get("format") != COMPACT_FORMAT:
        return False, "compact format changed"
    if fp.get("config") != config_hash(cfg):
        return False, "configuration changed"
    if code is not None and fp.get("code") != code:
        if stages is None or not fp.get("stages"):
            return False, "code changed"
        stale = stale_stages(fp["stages"], stages())
        if stale:
            return False, f"code changed: {', '.join(stale)}"
    return True, "up to date"


def _refresh(stored: Path, cfg) -> None:
    """Bring the documentation of an up-to-date result (published numbers, title, deviations) in line
    with the experiment file; they are not part of its fingerprint."""
    res = read_json(stored)
    new = {"title": cfg.title, "deviations": list(cfg.deviations)}
    published = {label: cfg.published.get(label) for label in res.get("methods", {})}
    if all(res.get(k) == v for k, v in new.items()) and all(
            m.get("published") == published[k] for k, m in res.get("methods", {}).items()):
        return
    res.update(new)
    res["config"].update(title=cfg.title, deviations=list(cfg.deviations), published=dict(cfg.published))
    for label, m in res.get("methods", {}).items():
        m["published"] = published[label]
    write_json(stored, res)


def plan(preset: str, selection: dict[str, Path], results_dir, overrides, code: dict | None, force: bool,
         cache: BehaviourCache | None = None):
    """(outcomes of the experiments that need no run: skipped or invalid, [(config, why) to run]); with
    ``cache``, a result made by other code is up to date when no stage's behaviour changed (`_up_to_date`)."""
    outcomes, todo = [], []
    for name, path in selection.items():
        try:
            cfg = resolve(path, preset, list(overrides))
        except ConfigError as e:
            outcomes.append(Outcome(name, FAILED, f"invalid: {' '.join(str(e).split())[:200]}"))
            continue
        stored = compact_path(results_dir, preset, name)
        fps = (partial(stage_fingerprints, cfg, path, code, cache, overrides)
               if cache is not None and code is not None else None)
        fresh, why = _up_to_date(stored, cfg, code, fps)
        if fresh and not force:
            _refresh(stored, cfg)
            outcomes.append(Outcome(name, SKIPPED, why))
        else:
            todo.append((cfg, "forced" if fresh else why))
    return outcomes, todo
