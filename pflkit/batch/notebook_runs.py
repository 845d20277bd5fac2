"""The notebooks a batch executes after its experiments: those of the selected papers (``notebooks/<paper>/``),
with papermill at the batch's preset, reading the batch's runs (``results_root``) and writing figures to the
repository's ``figures/`` (not at ``smoke``, whose figures are meaningless). A notebook is skipped when neither
its text, the code nor its paper's results changed since it last ran through the batch (`_notebook_key`, kept
per notebook in `NOTEBOOKS_DONE`)."""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from pflkit.batch.outcomes import DONE, FAILED, NOT_RUN, SKIPPED, Outcome, one_line
from pflkit.io import read_json
from pflkit.notebooks import execute, session
from pflkit.report.compact import compact_path
from pflkit.run.experiments import list_experiments

NOTEBOOKS_DONE = "_done.json"  # in the work folder's notebooks/: each executed notebook's inputs (`_notebook_key`)


def _notebook_jobs():
    root = execute.notebooks_dir()
    return [(nb.relative_to(root).parent.as_posix(), nb.name) for nb in execute.find_notebooks(root=root)]


def run_notebook(folder: str, name: str, preset: str, work: Path, parameters: dict) -> Outcome:
    """Execute one notebook with papermill (figures to the repository's figures/ except at smoke).

    Its own output folder (``work/notebooks/<folder>/<stem>``) is emptied first: the batch reruns a
    notebook only when its inputs changed, and a run the notebook made there before would refuse to be
    overwritten (or be resumed with stale settings).
    """
    import papermill as pm  # optional: a batch without notebooks runs without it

    label = f"notebooks/{folder}/{name}"
    t0 = time.perf_counter()
    figures = None if preset == "smoke" else session.figures_root()
    shutil.rmtree(work / "notebooks" / folder / Path(name).stem, ignore_errors=True)
    try:  # only the parameters the notebook declares (results_root: those that can read saved runs)
        declared = pm.inspect_notebook(str(execute.notebooks_dir() / folder / name))
        # the batch's notebooks train (or read the batch's run folders), never the committed results
        params = {k: v for k, v in {"source": "train", **parameters}.items() if k in declared}
        execute.run_notebooks(preset, folder, work / "notebooks", params, only_names=[name], figures_dir=figures)
    except Exception as e:  # noqa: BLE001 - papermill's error names the cell; keep the batch going
        ename, evalue = getattr(e, "ename", ""), getattr(e, "evalue", "")
        if ename == "DatasetNotFoundError":
            return Outcome(label, NOT_RUN, f"data missing: {evalue.split(' was not found')[0]}",
                           time.perf_counter() - t0)
        reason = f"{ename}: {' '.join(evalue.split())[:200]}" if ename else one_line(e)
        return Outcome(label, FAILED, reason, time.perf_counter() - t0)
    return Outcome(label, DONE, "", time.perf_counter() - t0)


def recorded(done: dict, job: tuple[str, str]) -> dict:
    """A notebook's entry in ``_done.json`` (``{"key", "seconds"}``; anything else reads as none)."""
    entry = done.get("/".join(job))
    return entry if isinstance(entry, dict) else {}


def notebook_plan(selection: dict[str, Path], preset: str, results_dir, code: dict | None, done: dict,
                  rerun: set, outcomes: list[Outcome], root: Path | None = None):
    """(notebooks to execute, their key function `_notebook_key`): the notebooks of the selected papers,
    less those whose key is the one recorded in ``done`` when they last ran through the batch and whose
    paper has no experiment to rerun now; those are appended to ``outcomes`` as skipped. A key covers
    all of the paper's experiments in the catalog ``root``, whatever the selection."""
    folders = {p.parent.name for p in selection.values()}
    jobs = [j for j in _safe_notebook_jobs(outcomes) if j[0] in folders]
    rerun_folders = {selection[n].parent.name for n in rerun}
    catalog = list_experiments(root)

    def key(folder: str, name: str) -> str:  # all of the paper's experiments, whatever the selection
        mine = sorted(n for n, p in catalog.items() if p.parent.name == folder)
        return _notebook_key(folder, name, preset, code, [compact_path(results_dir, preset, n) for n in mine])

    fresh = [j for j in jobs if j[0] not in rerun_folders and recorded(done, j).get("key") == key(*j)]
    outcomes += [Outcome(f"notebooks/{f}/{n}", SKIPPED, "up to date") for f, n in fresh]
    return [j for j in jobs if j not in fresh], key


def unchanged_after_runs(jobs: list[tuple[str, str]], done: dict, key) -> list[tuple[str, str]]:
    """The planned notebooks whose key, computed now that the batch's experiments have run, is the one
    recorded when they last ran: an experiment that was to rerun but did not change its result (not run
    for missing data, failed) leaves its paper's notebooks up to date."""
    return [j for j in jobs if recorded(done, j).get("key") == key(*j)]


def _notebook_key(folder: str, name: str, preset: str, code: dict | None, compacts: list[Path]) -> str:
    """What a notebook's output depends on: its own text, the preset, the code version and the results
    (fingerprints) of its paper's experiments in the batch; an unchanged key makes it "skipped"."""
    h = hashlib.sha256((execute.notebooks_dir() / folder / name).read_bytes())
    fps = [read_json(c).get("fingerprint") if c.exists() else None for c in compacts]
    h.update(json.dumps([preset, code, [c.name for c in compacts], fps], sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _safe_notebook_jobs(outcomes: list[Outcome]) -> list[tuple[str, str]]:
    try:
        import papermill  # noqa: F401 - optional: without it the notebooks are "not run", the batch goes on

        return _notebook_jobs()
    except (ImportError, FileNotFoundError) as e:
        outcomes.append(Outcome("notebooks", NOT_RUN, one_line(e)))
        return []
