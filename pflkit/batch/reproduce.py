"""``pflkit reproduce``: every experiment of the catalog in one resumable batch, and compact results.

For each selected experiment file (``paper``, ``only``) at one preset:

1. resolve it (an invalid file fails that experiment only, not the batch);
2. skip it when ``results/<preset>/<name>.json`` holds a compact result of the same resolved
   configuration (`config_hash`) and the same code (`code_version`), or, made by other code, the same
   behavioural fingerprint of every stage (`pflkit.batch.behaviour`: what the stage computes on a micro-run);
3. else run it with `pflkit.run.runner.run_experiment` into its work folder
   (``runs/reproduce/<preset>/<name>``): resumed when that folder holds an unfinished run of the
   same configuration and code (or, of other code, with the stages whose behaviour changed dropped, so only
   they train again), started over otherwise; a run started over first takes the finished
   stages another run folder of the work folder made with the same settings, data and code
   (`pflkit.batch.reuse`). A dataset (or pretrained weights file) that cannot be had offline makes it
   "not run (data missing: NAME)" and the batch goes on;
4. write the compact result (`compact_result`) from the run's ``results.json`` and its
   per-method reports (`pflkit.report.compact`): what the reproduction report and the claim checks
   read, small enough to commit, with every invocation that ran it and on what hardware (``invocations``:
   a run stopped on one machine and resumed on another names both).

Then, unless ``notebooks=False``, the notebooks of the selected papers (``notebooks/<paper>/``) are
executed with papermill at the same preset (skipped when neither the notebook, the code nor its
paper's results changed since it last ran through the batch), reading the batch's runs (``results_root``) and writing
figures to the repository's ``figures/`` (not at ``smoke``, whose figures are meaningless). Every
file is written atomically (`pflkit.io`) and each finished stage of a run is kept, so stopping at
any point and starting the same command again loses at most the unfinished stage.

The code version is a digest of the library code a run executes, ignoring comments and
docstrings (`code_version`), not the git commit: committing the results must not make them stale.
"""
from __future__ import annotations

import ast
import contextlib
import datetime
import fnmatch
import functools
import hashlib
import json
import logging
import os
import shutil
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import pflkit
from pflkit.config import ConfigError
from pflkit.batch.behaviour import BehaviourCache, stage_fingerprints, stale_stages
from pflkit.io import locked_folder, progress_bar, read_json, write_json
from pflkit.report.compact import COMPACT_FORMAT, compact_path, compact_result, config_digest
from pflkit.report.divergence import mark_divergence

log = logging.getLogger(__name__)

STATUS_FILE = "_status.json"  # per experiment: the last batch's outcome (why one was not run)
MATRIX_DONE = "_matrix_done.json"  # in the work folder: the inputs the matrix table and figure were drawn from
NOTEBOOKS_DONE = "_done.json"  # in the work folder's notebooks/: each executed notebook's inputs (`_notebook_key`)
MARKER = "reproduce.json"  # in a work folder: the configuration and code its run was started with
REUSED = "reused.json"  # in a work folder: the stages its run took from another run folder (`pflkit.batch.reuse`)
INVOCATIONS = "invocations.json"  # in a work folder: each invocation that ran its run, and on what hardware
# runs whose stages' trained states a notebook reads (`keep_states`): FedSelect's Fig. 1 masks, pFedHN-PC's
# mix-and-match (Fig. 3) and pFedHN's client embeddings (Fig. 4). Kept in the work folder only, so the notebook
# reads them instead of training the same model again
KEEP_STATES = ("fedselect_table1_*", "pfedhn_fig3_mixmatch", "pfedhn_fig4_embeddings")
# parts of the package that a run does not execute (tables, figures, the CLI, the notebooks, the Flower engine, and
# this batch layer: the batch, its stage reuse, the behavioural fingerprints, the hypergradient check)
NOT_RUN_CODE = ("report", "analysis", "flower", "catalog", "batch", "notebooks", "cli.py")
DONE, SKIPPED, NOT_RUN, FAILED = "done", "skipped", "not run", "failed"


@dataclass
class Outcome:
    """What the batch did with one experiment (or notebook): ``status`` is done / skipped / not run / failed."""

    name: str
    status: str
    reason: str = ""
    seconds: float = 0.0


# ----------------------------------------------------------------------------- selection and versions

def _paper_of(path: Path) -> str:
    from pflkit.run.experiments import tomllib

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
    from pflkit.run.experiments import list_experiments

    found = list_experiments(root)
    chosen = {n: p for n, p in found.items()
              if (not paper or paper in (p.parent.name, _paper_of(p))) and (not only or _matches(n, only, found))}
    if not chosen:
        papers = sorted({p.parent.name for p in found.values()})
        raise ConfigError(f"no experiment matches --paper {paper!r} --only {only!r}; papers: {', '.join(papers)}")
    return chosen


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def code_version(package: Path | None = None) -> dict:
    """``{"pflkit": version, "source": digest}``: the digest covers the syntax tree of every module a
    run executes (`NOT_RUN_CODE` excluded), so comments and docstrings do not count, code does.

    For the installed package it is computed once per process: the code a process runs is the code
    it imported, whatever is edited on disk meanwhile.
    """
    if package is None:
        return dict(_own_code_version())
    return _digest(Path(package))


@functools.lru_cache(maxsize=1)
def _own_code_version() -> tuple:
    return tuple(_digest(Path(pflkit.__file__).resolve().parent).items())


def _digest(root: Path) -> dict:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in NOT_RUN_CODE or "__pycache__" in rel.parts:
            continue
        text = path.read_text()
        try:
            body = ast.dump(_strip_docstrings(ast.parse(text)))
        except SyntaxError:  # a file mid-edit: its text then
            body = text
        h.update(f"{rel.as_posix()}\0{body}\0".encode())
    return {"pflkit": pflkit.__version__, "source": h.hexdigest()[:16]}


def config_hash(cfg) -> str:
    """Digest of the resolved configuration less the settings that do not change a run's numbers
    (`pflkit.report.compact.config_digest`; seeds and sizes count)."""
    return config_digest(cfg.to_dict())


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


# ----------------------------------------------------------------------------- one experiment

def _missing_weights(cfg) -> str | None:
    """Offline and torchvision's ImageNet weights not cached: the file a run would need."""
    from pflkit.data.base import offline

    if not cfg.model.options.get("pretrained") or not offline():
        return None
    from pflkit.models.resnet import pretrained_cache_path

    path = pretrained_cache_path()
    return None if Path(path).is_file() else f"ImageNet ResNet-18 weights ({path})"


def _one_line(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def run_one(cfg, folder: Path, compact: Path, *, code: dict | None, overrides=(), data_root=None,
            download: bool = False, reuse: bool = True, stages: dict | None = None) -> Outcome:
    """Run (or resume) one experiment into ``folder`` and write its compact result to ``compact``.

    ``stages``: the stages' behavioural fingerprints (`pflkit.batch.behaviour.stage_fingerprints`), recorded with
    the result; a folder started by other code is resumed with only the stages whose fingerprint changed
    dropped (`_drop_stale_stages`), and a donor made by other code gives the stages whose fingerprint matches.

    ``reuse``: a run started afresh first takes the finished stages that another run folder of the
    batch holds with the same settings, data and code (`pflkit.batch.reuse`); the compact result names them.
    """
    from pflkit.data.base import DatasetNotFoundError
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
        log.warning("%s failed: %s (traceback in %s)", cfg.name, _one_line(e), folder / "reproduce-error.log")
        return Outcome(cfg.name, FAILED, _one_line(e), time.perf_counter() - t0)
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
    from pflkit.io import slug
    from pflkit.batch.reuse import stage_files

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
    (`pflkit.run.runner.device_info`), and, when it returns or raises, its wall seconds. A run resumed on other
    hardware then names every machine it ran on, not only the last one (``environment``)."""
    from pflkit.run.environment import device_info

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


# ----------------------------------------------------------------------------- notebooks

def _notebook_jobs():
    from pflkit.notebooks.session import find_notebooks, notebooks_dir

    root = notebooks_dir()
    return [(nb.relative_to(root).parent.as_posix(), nb.name) for nb in find_notebooks(root=root)]


def run_notebook(folder: str, name: str, preset: str, work: Path, parameters: dict) -> Outcome:
    """Execute one notebook with papermill (figures to the repository's figures/ except at smoke).

    Its own output folder (``work/notebooks/<folder>/<stem>``) is emptied first: the batch reruns a
    notebook only when its inputs changed, and a run the notebook made there before would refuse to be
    overwritten (or be resumed with stale settings).
    """
    import papermill as pm

    from pflkit.notebooks.session import figures_root, notebooks_dir, run_notebooks

    label = f"notebooks/{folder}/{name}"
    t0 = time.perf_counter()
    figures = None if preset == "smoke" else figures_root()
    shutil.rmtree(work / "notebooks" / folder / Path(name).stem, ignore_errors=True)
    try:  # only the parameters the notebook declares (results_root: those that can read saved runs)
        declared = pm.inspect_notebook(str(notebooks_dir() / folder / name))
        # the batch's notebooks train (or read the batch's run folders), never the committed results
        params = {k: v for k, v in {"source": "train", **parameters}.items() if k in declared}
        run_notebooks(preset, folder, work / "notebooks", params, only_names=[name], figures_dir=figures)
    except Exception as e:  # noqa: BLE001 - papermill's error names the cell; keep the batch going
        ename, evalue = getattr(e, "ename", ""), getattr(e, "evalue", "")
        if ename == "DatasetNotFoundError":
            return Outcome(label, NOT_RUN, f"data missing: {evalue.split(' was not found')[0]}",
                           time.perf_counter() - t0)
        reason = f"{ename}: {' '.join(evalue.split())[:200]}" if ename else _one_line(e)
        return Outcome(label, FAILED, reason, time.perf_counter() - t0)
    return Outcome(label, DONE, "", time.perf_counter() - t0)


# ----------------------------------------------------------------------------- the batch

def _save_status(path: Path, outcomes: list[Outcome]) -> None:
    """Record each experiment's last outcome (a skip keeps the earlier record: what made the result)."""
    status = read_json(path) if path.exists() else {}
    for o in outcomes:
        if o.name.startswith("notebooks") or (o.status == SKIPPED and o.name in status):
            continue
        status[o.name] = {"status": o.status, "reason": o.reason, "seconds": round(o.seconds, 1)}
    write_json(path, dict(sorted(status.items())))


def _estimate(compact: Path, status: dict, name: str) -> float | None:
    """Seconds one experiment is expected to take: its last run's, from its (maybe stale) result or record;
    for a run resumed from stages finished earlier, the time of all its stages (a rerun trains them all)."""
    try:
        if compact.exists():
            timing = read_json(compact)["timing"]
            return max(float(timing["wall_seconds"]), float(timing.get("total_seconds") or 0.0))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return (status.get(name) or {}).get("seconds")


def plan(preset: str, selection: dict[str, Path], results_dir, overrides, code: dict | None, force: bool,
         cache: BehaviourCache | None = None):
    """(outcomes of the experiments that need no run: skipped or invalid, [(config, why) to run]); with
    ``cache``, a result made by other code is up to date when no stage's behaviour changed (`_up_to_date`)."""
    from pflkit.run.experiments import resolve

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


def reproduce(preset: str = "cpu", *, paper: str | None = None, only: str | None = None,
              results_dir="results", work_dir=None, overrides=(), data_root=None, download: bool = False,
              device: str = "auto", notebooks: bool = True, force: bool = False, code_check: bool = True,
              catalog: Path | None = None, progress: bool = True, jobs: int = 1, reuse: bool = True) -> list[Outcome]:
    """Run the selected experiments (and then the notebooks) at ``preset``; returns one `Outcome` each.

    Args:
        results_dir: compact results go to ``results_dir/<preset>/<name>.json``.
        work_dir: full run folders (default ``runs/reproduce/<preset>``), kept for resuming.
        overrides: ``--set`` values applied to every experiment (part of its configuration).
        force: rerun experiments whose compact result is up to date.
        code_check: a changed code version makes a result stale (off: only the configuration counts).
        catalog: another catalog folder (tests); default: the package's.
        progress: one bar over the batch; its estimate of what is left weighs each experiment by the
            time its last run took, where known.
        jobs: experiments (then notebooks) run at once, each in its own process with
            ``cores // jobs`` threads; results are the same as with one job (every run is seeded).
        reuse: an experiment started afresh takes the finished stages another run folder of ``work_dir``
            holds with the same settings, data and code (`pflkit.batch.reuse`) instead of training them again.
    """
    if int(jobs) < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    
    n_jobs = int(jobs)
    work = Path(work_dir or Path("runs") / "reproduce" / preset)
    status_file = Path(results_dir) / preset / STATUS_FILE
    code = code_version() if code_check else None
    sets = [*overrides, *([f"device={device}"] if device != "auto" else [])]
    selection = select(paper, only, catalog)
    cache = BehaviourCache(results_dir, code) if code is not None else None
    outcomes, todo = plan(preset, selection, results_dir, sets, code, force, cache)
    stages = {c.name: stage_fingerprints(c, selection[c.name], code, cache, sets) if cache else None
              for c, _ in todo}
    if cache is not None:
        cache.save()
    nb_done = work / "notebooks" / NOTEBOOKS_DONE
    nb_record = read_json(nb_done) if nb_done.exists() else {}
    jobs, nb_key = _notebook_plan(selection, preset, results_dir, code, {} if force else nb_record,
                                  {c.name for c, _ in todo}, outcomes, catalog) if notebooks else ([], None)
    old = read_json(status_file) if status_file.exists() else {}
    weights = _weights([_estimate(compact_path(results_dir, preset, c.name), old, c.name) for c, _ in todo]
                       + [_recorded(nb_record, j).get("seconds") for j in jobs])
    with locked_folder(work):
        _save_status(status_file, outcomes)
        bar = progress_bar(total=sum(weights), desc=f"reproduce ({preset})", disable=not progress or not weights,
                   bar_format="{desc}: {percentage:3.0f}% |{bar}| {elapsed} elapsed, ~{remaining} left{postfix}")
        steps, total, count = iter(weights), len(todo) + len(jobs), 0
        runs = [(partial(run_one, cfg, work / cfg.name, compact_path(results_dir, preset, cfg.name), code=code,
                         overrides=overrides, data_root=data_root, download=download, reuse=reuse,
                         stages=stages[cfg.name]), cfg.name)
                for cfg, _ in todo]
        params = {"device": device, "results_root": str(work.resolve()),
                  **({"data_root": str(data_root)} if data_root else {})}
        try:
            for o in _in_turn(runs, n_jobs, processes=True, started=lambda what: bar.set_postfix_str(
                    f"{count + 1}/{total} {what}")):
                outcomes.append(o)
                _save_status(status_file, [o])
                count += 1
                if n_jobs > 1:
                    bar.set_postfix_str(f"{count}/{total} {o.name}")
                bar.update(next(steps))
            for job in _unchanged_after_runs(jobs, {} if force else nb_record, nb_key):
                jobs.remove(job)  # its paper's reruns left its inputs as they were (e.g. data missing)
                outcomes.append(Outcome(f"notebooks/{'/'.join(job)}", SKIPPED, "up to date"))
                count += 1
                bar.update(next(steps))
            books = [(partial(run_notebook, folder, name, preset, work, params), f"{folder}/{name}")
                     for folder, name in jobs]
            for (fn, what), o in zip(books, _in_turn(books, n_jobs, processes=False, ordered=True)):
                outcomes.append(o)
                if o.status == DONE:  # its inputs as they were when it ran: the next batch skips it
                    record = read_json(nb_done) if nb_done.exists() else {}
                    entry = {"key": nb_key(*fn.args[:2]), "seconds": round(o.seconds, 1)}
                    write_json(nb_done, {**record, what: entry})
                count += 1
                bar.set_postfix_str(f"{count}/{total} {what}")
                bar.update(next(steps))
        finally:
            bar.close()
        outcomes += _matrix_outputs(selection, preset, results_dir, work)
    return outcomes


def _worker_threads(threads: int) -> None:
    """A batch worker process: this many intra-op threads and cores for the round engine, so that
    ``jobs`` workers share the machine's cores instead of each taking all of them."""
    import torch

    os.environ["PFLKIT_CPUS"] = str(threads)
    torch.set_num_threads(threads)


def _in_turn(calls: list[tuple[Callable[[], Outcome], str]], jobs: int, *, processes: bool, ordered: bool = False,
             started: Callable[[str], None] | None = None, threads: int | None = None,
             in_process: bool = True) -> Iterator[Outcome]:
    """The outcomes of ``calls`` (``(call, label)``), one after another (``jobs == 1``) or ``jobs`` at a time:
    experiments in worker processes (``processes``; each with ``threads`` intra-op threads, default cores / jobs),
    notebooks in threads (each runs its own kernel process). ``in_process=False``: worker processes even for one
    job or one call. Outcomes come as they finish, or in the calls' order with ``ordered``."""
    if in_process and (jobs == 1 or len(calls) <= 1):
        for call, label in calls:
            if started is not None:
                started(label)
            yield call()
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait

    if processes:
        threads = threads or max(1, (os.cpu_count() or 1) // jobs)
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_worker_threads, initargs=(threads,))
    else:
        pool = ThreadPoolExecutor(jobs)
    with pool:
        futures = [pool.submit(call) for call, _ in calls]
        if ordered:
            for f in futures:
                yield f.result()
            return
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=futures.index):
                yield f.result()


def _matrix_outputs(selection: dict[str, Path], preset: str, results_dir, work: Path) -> list[Outcome]:
    """When the batch includes the cross-paper matrix (``catalog/matrix/``): its table and heatmap
    (`pflkit.report.matrix`), in the repository's ``figures/matrix/`` (at ``smoke``, in the work folder)."""
    from pflkit.report.matrix import PAPER, declared_exclusions, write_matrix
    from pflkit.report.reproduction import load_results

    if not any(p.parent.name == PAPER for p in selection.values()):
        return []
    from pflkit.notebooks.session import figures_root

    import pflkit.report.matrix as matrix_module

    folder = work / PAPER if preset == "smoke" else figures_root() / PAPER
    label, record = f"{PAPER} table and figure", work / MATRIX_DONE
    outputs = [folder / f"matrix_{preset}.md", folder / f"matrix_{preset}.png"]
    t0 = time.perf_counter()
    try:
        results, excluded = load_results(results_dir).get(preset, {}), declared_exclusions()
        fingerprints = [(n, (results.get(n) or {}).get("fingerprint")) for n in sorted(excluded)]
        key = hashlib.sha256(json.dumps([preset, fingerprints, sorted(excluded.items()),
                                         Path(matrix_module.__file__).read_text()], default=str).encode())
        key = key.hexdigest()[:16]
        if all(o.exists() for o in outputs) and record.exists() and read_json(record).get("key") == key:
            return [Outcome(label, SKIPPED, "up to date")]
        md, png = write_matrix(results, preset, folder, excluded)
        write_json(record, {"key": key})
    except Exception as e:  # noqa: BLE001 - the runs are kept; only the rendering failed
        return [Outcome(label, FAILED, _one_line(e), time.perf_counter() - t0)]
    return [Outcome(label, DONE, f"{md}, {png}", time.perf_counter() - t0)]


def _weights(seconds: list) -> list[float]:
    """The progress bar's weight of each job: its last duration, else the median of the known ones
    (1 each when none is known, i.e. the bar then counts jobs)."""
    import statistics

    known = [s for s in seconds if s]
    typical = statistics.median(known) if known else 1.0
    return [float(s) if s else typical for s in seconds]


def _recorded(done: dict, job: tuple[str, str]) -> dict:
    """A notebook's entry in ``_done.json`` (``{"key", "seconds"}``; anything else reads as none)."""
    entry = done.get("/".join(job))
    return entry if isinstance(entry, dict) else {}


def _notebook_plan(selection: dict[str, Path], preset: str, results_dir, code: dict | None, done: dict,
                   rerun: set, outcomes: list[Outcome], root: Path | None = None):
    """(notebooks to execute, their key function `_notebook_key`): the notebooks of the selected papers,
    less those whose key is the one recorded in ``done`` when they last ran through the batch and whose
    paper has no experiment to rerun now; those are appended to ``outcomes`` as skipped. A key covers
    all of the paper's experiments in the catalog ``root``, whatever the selection."""
    folders = {p.parent.name for p in selection.values()}
    jobs = [j for j in _safe_notebook_jobs(outcomes) if j[0] in folders]
    rerun_folders = {selection[n].parent.name for n in rerun}

    from pflkit.run.experiments import list_experiments

    catalog = list_experiments(root)

    def key(folder: str, name: str) -> str:  # all of the paper's experiments, whatever the selection
        mine = sorted(n for n, p in catalog.items() if p.parent.name == folder)
        return _notebook_key(folder, name, preset, code, [compact_path(results_dir, preset, n) for n in mine])

    fresh = [j for j in jobs if j[0] not in rerun_folders and _recorded(done, j).get("key") == key(*j)]
    outcomes += [Outcome(f"notebooks/{f}/{n}", SKIPPED, "up to date") for f, n in fresh]
    return [j for j in jobs if j not in fresh], key


def _unchanged_after_runs(jobs: list[tuple[str, str]], done: dict, key) -> list[tuple[str, str]]:
    """The planned notebooks whose key, computed now that the batch's experiments have run, is the one
    recorded when they last ran: an experiment that was to rerun but did not change its result (not run
    for missing data, failed) leaves its paper's notebooks up to date."""
    return [j for j in jobs if _recorded(done, j).get("key") == key(*j)]


def _notebook_key(folder: str, name: str, preset: str, code: dict | None, compacts: list[Path]) -> str:
    """What a notebook's output depends on: its own text, the preset, the code version and the results
    (fingerprints) of its paper's experiments in the batch; an unchanged key makes it "skipped"."""
    from pflkit.notebooks.session import notebooks_dir

    h = hashlib.sha256((notebooks_dir() / folder / name).read_bytes())
    fps = [read_json(c).get("fingerprint") if c.exists() else None for c in compacts]
    h.update(json.dumps([preset, code, [c.name for c in compacts], fps], sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _safe_notebook_jobs(outcomes: list[Outcome]) -> list[tuple[str, str]]:
    try:
        import papermill  # noqa: F401

        return _notebook_jobs()
    except (ImportError, FileNotFoundError) as e:
        outcomes.append(Outcome("notebooks", NOT_RUN, _one_line(e)))
        return []


def _duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def format_summary(outcomes: list[Outcome], seconds: float | None = None) -> str:
    """Counts of done / skipped / not run / failed, then one line per experiment that was not skipped."""
    counts = {s: sum(o.status == s for o in outcomes) for s in (DONE, SKIPPED, NOT_RUN, FAILED)}
    head = ", ".join(f"{n} {s}" for s, n in counts.items())
    lines = [f"reproduce: {head}" + (f" in {_duration(seconds)}" if seconds is not None else "")]
    for o in outcomes:
        if o.status != SKIPPED:
            note = f": {o.reason}" if o.reason else ""
            lines.append(f"  {o.status:8s} {o.name} ({_duration(o.seconds)}){note}")
    return "\n".join(lines)
