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

The batch's parts, one job each: `pflkit.batch.selection` (which experiments, which are up to date),
`pflkit.batch.versions` (the code version and configuration digest), `pflkit.batch.work_folder` (one experiment in
its work folder), `pflkit.batch.pool` (experiments and notebooks ``jobs`` at a time),
`pflkit.batch.notebook_runs` and `pflkit.batch.matrix_figure` (what is drawn after the runs) and
`pflkit.batch.outcomes` (what the batch did with each, and its summary). This module runs them in turn, with
one progress bar over the batch.
"""
from __future__ import annotations

import statistics
from functools import partial
from pathlib import Path

from pflkit.batch.behaviour import BehaviourCache, stage_fingerprints
from pflkit.batch.matrix_figure import matrix_outputs
from pflkit.batch.notebook_runs import NOTEBOOKS_DONE, notebook_plan, recorded, run_notebook, unchanged_after_runs
from pflkit.batch.outcomes import DONE, SKIPPED, Outcome
from pflkit.batch.pool import in_turn
from pflkit.batch.selection import plan, select
from pflkit.batch.versions import code_version
from pflkit.batch.work_folder import run_one
from pflkit.io import locked_folder, progress_bar, read_json, write_json
from pflkit.report.compact import compact_path

STATUS_FILE = "_status.json"  # per experiment: the last batch's outcome (why one was not run)


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
    jobs, nb_key = notebook_plan(selection, preset, results_dir, code, {} if force else nb_record,
                                 {c.name for c, _ in todo}, outcomes, catalog) if notebooks else ([], None)
    old = read_json(status_file) if status_file.exists() else {}
    weights = _weights([_estimate(compact_path(results_dir, preset, c.name), old, c.name) for c, _ in todo]
                       + [recorded(nb_record, j).get("seconds") for j in jobs])
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
            for o in in_turn(runs, n_jobs, processes=True, started=lambda what: bar.set_postfix_str(
                    f"{count + 1}/{total} {what}")):
                outcomes.append(o)
                _save_status(status_file, [o])
                count += 1
                if n_jobs > 1:
                    bar.set_postfix_str(f"{count}/{total} {o.name}")
                bar.update(next(steps))
            for job in unchanged_after_runs(jobs, {} if force else nb_record, nb_key):
                jobs.remove(job)  # its paper's reruns left its inputs as they were (e.g. data missing)
                outcomes.append(Outcome(f"notebooks/{'/'.join(job)}", SKIPPED, "up to date"))
                count += 1
                bar.update(next(steps))
            books = [(partial(run_notebook, folder, name, preset, work, params), f"{folder}/{name}")
                     for folder, name in jobs]
            for (fn, what), o in zip(books, in_turn(books, n_jobs, processes=False, ordered=True)):
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
        outcomes += matrix_outputs(selection, preset, results_dir, work)
    return outcomes


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


def _weights(seconds: list) -> list[float]:
    """The progress bar's weight of each job: its last duration, else the median of the known ones
    (1 each when none is known, i.e. the bar then counts jobs)."""
    known = [s for s in seconds if s]
    typical = statistics.median(known) if known else 1.0
    return [float(s) if s else typical for s in seconds]
