"""The notebook session: one `setup` call per notebook, and the `Session` every cell reads and runs through.

Every notebook starts with `setup` (threads, device, output folders, the smoke warning) and then
reads data and runs experiments through the returned `Session`, so that the data actually used is
always the data named in titles and tables. Executing the notebooks is `pflkit.notebooks.execute`;
their Colab badge and install cell, `pflkit.notebooks.install`; the stand-in datasets,
`pflkit.notebooks.standins`.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from pflkit.data.datasets import dataset_name
from pflkit.notebooks.execute import notebooks_dir
from pflkit.notebooks.standins import STANDIN_DATASET, STANDINS, standin_overrides
from pflkit.run.experiments import PRESETS

log = logging.getLogger(__name__)

SOURCES = ("results", "train")  # a notebook's `source`: draw from the committed results, or train here
SMOKE_NOTE = ("preset 'smoke': tiny sizes, so the accuracies below are meaningless; "
              "they only show that the code runs (use preset 'cpu' or 'paper' for numbers)")


def resolve_device(device: str = "auto") -> str:
    """``auto`` -> ``cuda`` when CUDA is available, else ``cpu``; an unavailable device is an error."""
    from pflkit.run.environment import resolve_device as resolve
    from pflkit.run.experiment_config import check_device

    check_device(device)
    return str(resolve(device))


@dataclass(frozen=True)
class Session:
    """What one notebook run uses: preset, device, data location, output folders. Made by `setup`."""

    preset: str
    device: str
    data_root: str | None
    download: bool
    standin: bool
    out: Path
    figures: Path
    seed: int
    source: str = "train"  # train: train here; results: the committed results of `preset`, no training
    results_dir: str | None = None  # where the committed results are (`pflkit.report.committed.results_dir`)

    def resolve(self, name: str, *overrides: str):
        """The experiment ``name`` at this preset with this seed and device (and the stand-in, if asked).

        ``overrides`` are ``key=value`` strings as for ``--set``; they are applied after the stand-in's.
        """
        from pflkit.run.experiments import resolve

        base = [f"seed={self.seed}", f"device={self.device}"]
        cfg = resolve(name, self.preset, [*base, *overrides])
        standin = standin_overrides(cfg) if self.standin else []
        if standin:
            log.info("%s: %s replaced by the stand-in %s", name, cfg.data.dataset, STANDIN_DATASET)
            cfg = resolve(name, self.preset, [*base, *standin, *overrides])
        return cfg

    def run_dir(self, name: str, results_root: str | os.PathLike | None = None) -> Path:
        """Where `run` reads or writes ``name``: ``results_root/name`` if it holds results of this preset."""
        if results_root is not None:
            saved = Path(results_root) / name
            if _preset_of(saved / "results.json") == self.preset:
                return saved
        return self.out / name

    def run(self, name: str, *overrides: str, results_root: str | os.PathLike | None = None) -> dict:
        """Results of experiment ``name``: saved ones from ``results_root`` (same preset), else a fresh run;
        a method that diverged with finite numbers is marked so (`pflkit.report.divergence`)."""
        from pflkit.report.divergence import mark_divergence

        return mark_divergence(self._results(name, *overrides, results_root=results_root))

    def committed(self, name: str) -> dict:
        """Experiment ``name``'s committed result at this preset (`pflkit.report.committed.read_committed`)."""
        from pflkit.report.committed import read_committed

        return read_committed(name, self.preset, self.results_dir)

    def rows(self, prefix: str) -> list[str]:
        """The experiments whose names start with ``prefix``: the committed ones in results mode, else the
        catalog's (`pflkit.run.experiments.list_experiments`), sorted."""
        if self.source == "results":
            from pflkit.report.committed import results_dir

            return sorted(p.stem for p in results_dir(self.preset, self.results_dir).glob(f"{prefix}*.json"))
        from pflkit.run.experiments import list_experiments

        return sorted(n for n in list_experiments() if n.startswith(prefix))

    def training_time(self, name: str) -> str:
        """What training ``name`` at this preset cost the committed batch (`pflkit.report.committed`)."""
        from pflkit.report.committed import MissingResultError, training_time

        try:
            return training_time(self.committed(name))
        except MissingResultError:
            return "no committed run to time it by"

    def run_times(self, names) -> "pd.DataFrame":
        """The notebook's run time per preset and source, from the committed batch's stored timings:
        results mode reads files (seconds); training costs what the batch's runs of ``names`` took."""
        import pandas as pd

        from pflkit.report.committed import MissingResultError, read_committed, total_training_time

        rows = []
        for preset in PRESETS:
            try:
                found = [read_committed(n, preset, self.results_dir if preset == self.preset else None)
                         for n in names]
                train = total_training_time(found) + " (the batch, one CPU thread each)"
                results = "seconds (trains nothing)"
            except MissingResultError:
                train = "no committed timing" if preset == "smoke" else "not run by the batch yet"
                results = "no committed results"
            rows.append({"preset": preset, "source='results'": results, "source='train'": train})
        return pd.DataFrame(rows).set_index("preset")

    def _results(self, name: str, *overrides: str, results_root: str | os.PathLike | None = None) -> dict:
        from pflkit.io import read_json

        if self.source == "results":
            from pflkit.report.compact import config_digest

            res = self.committed(name)
            if overrides and config_digest(self.resolve(name, *overrides).to_dict()) != res["fingerprint"]["config"]:
                raise ValueError(f"{name}: {list(overrides)} gives other settings than the committed result; "
                                 "run them with source='train'")
            print(f"{name}: the committed result (preset {self.preset}; training it took {self.training_time(name)})")
            return res
        folder = self.run_dir(name, results_root)
        if folder != self.out / name:
            print(f"{name}: results read from {folder}")
            return read_json(folder / "results.json")
        from pflkit.run.folder import RunMismatchError
        from pflkit.run.runner import run_experiment

        # re-executing a cell continues (or reuses) the run in `folder`; other settings start it over
        cfg, kwargs = self.resolve(name, *overrides), dict(data_root=self.data_root, download=self.download,
                                                            progress=True)
        print(f"{name}: training at preset {self.preset}; the committed batch took {self.training_time(name)}")
        try:
            return run_experiment(cfg, folder, resume=True, **kwargs)
        except RunMismatchError as e:
            print(f"{name}: {folder} held a run with other settings; starting over ({str(e)[:200]})")
            return run_experiment(cfg, folder, overwrite=True, **kwargs)

    def trained(self, exp, label: str, fed, env, dataset, results_root: str | os.PathLike | None = None):
        """Method ``label`` of the resolved experiment ``exp`` trained on its whole federation ``fed``.

        Read back (`pflkit.run.folder.load_stage`) from the run of ``exp`` under ``results_root`` when that run
        was made with the same settings and data (its fingerprint, of ``dataset`` read) and kept the
        stage's final states, as `pflkit reproduce` does for the figures that need them (``KEEP_STATES``);
        else trained here (`pflkit.run.stages.train_method`, with ``env``). Returns a `StageResult`.
        """
        from pflkit.io import read_json
        from pflkit.run.folder import RUN_FILE, final_states_path, fingerprint, fingerprint_hash, load_stage
        from pflkit.run.stages import train_method

        folder = self.run_dir(exp.name, results_root)
        if (folder != self.out / exp.name and final_states_path(folder, label, self.seed).exists()
                and (folder / RUN_FILE).exists()):
            if read_json(folder / RUN_FILE).get("hash") == fingerprint_hash(fingerprint(exp, dataset)):
                print(f"{exp.name}: {label} read from {folder}")
                return load_stage(folder, label, self.seed)
            print(f"{exp.name}: the run in {folder} has other settings or data; training {label} here")
        return train_method(exp, label, fed, env)

    def load(self, dataset: str, **options):
        """`pflkit.data.datasets.load_dataset` with this session's data root (the stand-in when asked)."""
        from pflkit.data.datasets import load_dataset

        if self.standin and dataset in STANDINS:
            return load_dataset(STANDIN_DATASET, self.data_root)
        return load_dataset(dataset, self.data_root, download=self.download, **options)

    def dataset_label(self, results_or_cfg) -> str:
        """The dataset actually used, e.g. ``CIFAR-10 (offline subset)`` or ``sklearn digits (STAND-IN for CIFAR-10)``.

        A results dict tells the subset (``results["data"]["source"]``); a config names the dataset only.
        """
        used, intended = _datasets(results_or_cfg)
        if used != intended:
            return f"{dataset_name(used)} (STAND-IN for {dataset_name(intended)})"
        source = (results_or_cfg.get("data") or {}).get("source", "") if isinstance(results_or_cfg, dict) else ""
        return f"{dataset_name(used)} (offline subset)" if "subset" in source else dataset_name(used)

    def paper_header(self, results) -> str:
        """``paper``, or ``paper (on CIFAR-10)`` when these results are on another dataset than the paper's."""
        used, intended = _datasets(results)
        return "paper" if used == intended else f"paper (on {dataset_name(intended)})"

    def format_table(self, results: dict) -> str:
        """`pflkit.report.tables.format_table` naming the dataset used, its paper column `paper_header`."""
        from pflkit.report.tables import format_table

        return format_table(results, dataset=self.dataset_label(results), paper_header=self.paper_header(results))

    def figure(self, name: str) -> Path:
        """The path to save figure ``name`` to (the figures folder of this session)."""
        return self.figures / name

    def checked_claims(self, paper: str, names=(), results_root: str | os.PathLike | None = None, *, made=None):
        """The paper's claims (`pflkit.report.papers.claims_of`) checked on ``names``' results: in results mode
        the committed ones, else the runs `run` made or read (``made``: ``{experiment: (results, run folder or
        None)}`` for results made otherwise). An experiment without results is "not run". A list of
        `ClaimResult` (verdict, paper's value, ours, why), which `pflkit.report.readings.takeaways` reads."""
        from pflkit.io import read_json
        from pflkit.report.compact import analysis
        from pflkit.report.papers import claims_of

        if self.source == "results":
            found = {name: self.committed(name) for name in names}
        else:
            runs = {name: (read_json(f / "results.json"), f) for name in names
                    if ((f := self.run_dir(name, results_root)) / "results.json").exists()}
            runs.update(made or {})
            found = {name: {**res, "analysis": analysis(Path(folder), res) if folder else {}}
                     for name, (res, folder) in runs.items()}
        return claims_of(found, paper)

    def claims(self, paper: str, names=(), results_root: str | os.PathLike | None = None, *, made=None):
        """`checked_claims` as a table, and the paragraph that says what they mean (`claims.conclusion`),
        written from the verdicts. Returns ``(frame, text)``."""
        import pandas as pd

        from pflkit.report.claims import conclusion

        checked = self.checked_claims(paper, names, results_root, made=made)
        frame = pd.DataFrame([{"claim": c.text, "verdict": c.verdict, "paper": c.paper_value, "ours": c.ours,
                               "95% interval": c.interval, "why": c.reason} for c in checked])
        return frame, conclusion(checked, self.preset)


def _preset_of(path: Path) -> str | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())["config"]["preset"]
    except (ValueError, KeyError, TypeError):
        return None


def _datasets(results_or_cfg) -> tuple[str, str]:
    """(dataset used, dataset the experiment file names) of a results dict or an ExperimentConfig."""
    from pflkit.run.experiments import resolve

    if isinstance(results_or_cfg, dict):
        config = results_or_cfg.get("config", results_or_cfg)
        name, preset, used = config["name"], config["preset"], config["data"]["dataset"]
    else:
        name, preset, used = results_or_cfg.name, results_or_cfg.preset, results_or_cfg.data.dataset
    try:
        intended = resolve(name, preset).data.dataset
    except Exception:  # noqa: BLE001 - a config not from a catalog file: nothing to compare with
        intended = used
    return used, intended


def _threads(preset: str, threads: int | None) -> int:
    if threads:
        return int(threads)
    # tests run several smoke notebooks side by side: one thread each avoids oversubscription
    return 1 if preset == "smoke" else (os.cpu_count() or 1)


def setup(preset: str, out_dir: str, *, data_root: str | None = None, device: str = "auto",
          download: bool = True, standin: bool = False, figures_dir: str | None = None, seed: int = 0,
          threads: int | None = None, source: str = "train", results_dir: str | None = None) -> Session:
    """Set up a notebook run: torch threads, matplotlib defaults, device, output folders.

    Args:
        preset: ``smoke``, ``cpu`` or ``paper``; at ``smoke`` one line says the numbers are meaningless.
        source: ``results`` (every table and figure from the committed results of ``preset``, no training)
            or ``train`` (train here, with progress bars; the committed batch's time is printed first).
        results_dir: where the committed results are (default: ``$PFLKIT_RESULTS``, then the checkout's
            ``results/``; `pflkit.report.committed.results_dir`).
        out_dir: the run folder; results go to ``out_dir/<experiment>``.
        data_root: a folder with datasets (searched before ``$PFLKIT_DATA`` and the cache).
        device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        download: let `load_dataset` download missing datasets (not when ``PFLKIT_OFFLINE=1``).
        standin: replace datasets other than sklearn digits by digits (`pflkit.notebooks.standins`); labelled as such.
        figures_dir: where figures go (default ``out_dir/figures``).
        seed: the experiments' first seed.
        threads: torch CPU threads (default: 1 at ``smoke``, else every core).
    """
    import torch

    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r}: must be {', '.join(PRESETS[:-1])} or {PRESETS[-1]}")
    if source not in SOURCES:
        raise ValueError(f"source={source!r}: must be one of {', '.join(SOURCES)}")
    if source == "results":
        from pflkit.report.committed import results_dir as find

        results_dir = str(find(preset, results_dir))  # no committed results: say so before any work
    torch.set_num_threads(_threads(preset, threads))
    from pflkit.report.figures import use_style

    use_style()
    out = Path(out_dir)
    figures = Path(figures_dir) if figures_dir else out / "figures"
    out.mkdir(parents=True, exist_ok=True)
    figures.mkdir(parents=True, exist_ok=True)
    session = Session(preset=preset, device=resolve_device(device), data_root=data_root, download=download,
                      standin=standin, out=out, figures=figures, seed=seed, source=source, results_dir=results_dir)
    if preset == "smoke":
        print(SMOKE_NOTE)
    if source == "results":
        print(f"pflkit: the committed results of preset {preset} (no training; source='train' trains them here)")
    else:
        print(f"pflkit: training at preset {preset}, device {session.device}, {torch.get_num_threads()} thread(s)"
              + (", stand-in datasets" if standin else ""))
    return session


def figures_root() -> Path:
    """The repository's committed ``figures/`` folder (written only by ``pflkit notebooks --figures``)."""
    return notebooks_dir().parent / "figures"

