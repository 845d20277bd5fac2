"""Notebook support: one setup call per notebook, the Colab install cell, and batch execution.

Every notebook starts with `setup` (threads, device, output folders, the smoke warning) and then
reads data and runs experiments through the returned `Session`, so that the data actually used is
always the data named in titles and tables. `run_notebooks` executes the notebooks with papermill
(`pflkit notebooks`); `sync_install_cells` rewrites every notebook's Colab badge and install cell
from the one repository address in ``pyproject.toml``.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pflkit.data.datasets import DATASET_NAMES, dataset_name
from pflkit.run.experiments import PRESETS

log = logging.getLogger(__name__)

SOURCES = ("results", "train")  # a notebook's `source`: draw from the committed results, or train here
SMOKE_NOTE = ("preset 'smoke': tiny sizes, so the accuracies below are meaningless; "
              "they only show that the code runs (use preset 'cpu' or 'paper' for numbers)")

# Stand-ins (only with ``standin=True``): every dataset that may be missing offline is replaced by the
# embedded sklearn digits with its small BN conv net, pooled and re-split by the experiment's partition.
STANDIN_DATASET = "digits"
_STANDIN_BASE = ("data.dataset=digits", "data.options={}", "model.name=digits_cnn", "model.options={}",
                 "data.augment=none", "data.task=label", "data.split=pool")
STANDINS: dict[str, tuple[str, ...]] = {name: _STANDIN_BASE for name in DATASET_NAMES if name != STANDIN_DATASET}
# Partitions that need per-sample groups (domains, speakers) or superclasses, which digits lacks,
# become Dirichlet label shift.
_GROUP_SCHEMES = {"domains", "natural", "concept_drift"}
_GROUP_SCHEME_STANDIN = ("data.scheme=dirichlet", "data.partition={ alpha = 0.5 }")
# Experiments whose budgets are sizes of one network (pFedHN Table 2: LeNet widths 8 / 16 / 32) keep them on
# the stand-in as the hidden units of an MLP: digits' 8x8 images are too small for a LeNet.
BUDGET_STANDIN = ("mlp", "hidden")


def budget_standin(cfg, model: str = BUDGET_STANDIN[0], option: str = BUDGET_STANDIN[1]) -> list[str]:
    """Overrides that carry an experiment's budget sizes to ``model``'s ``option`` (none if it has no budgets).

    A budget is pFedHN's ``budget_widths`` (its ``budget_model`` / ``budget_option`` become ``model`` /
    ``option``) or a method's own ``model = { width = w }`` (it becomes ``{ option = w }``).
    """
    out = []
    for m in cfg.methods:
        if getattr(m.config, "budget_widths", ()):
            out += [f'methods."{m.label}".budget_model={model}', f'methods."{m.label}".budget_option={option}']
        sizes = getattr(m, "model", None) or {}
        if len(sizes) > 1:
            raise ValueError(f"methods.{m.label}.model={sizes}: a budget stand-in needs one size option")
        out += [f'methods."{m.label}".model={{ {option} = {v} }}' for v in sizes.values()]
    return [f"model.name={model}", "model.options={}", *out] if out else []


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

    def _standin_overrides(self, cfg) -> list[str]:
        if not self.standin or cfg.data.dataset not in STANDINS:
            return []
        extra = _GROUP_SCHEME_STANDIN if cfg.data.scheme in _GROUP_SCHEMES else ()
        return [*STANDINS[cfg.data.dataset], *extra, *budget_standin(cfg)]

    def resolve(self, name: str, *overrides: str):
        """The experiment ``name`` at this preset with this seed and device (and the stand-in, if asked).

        ``overrides`` are ``key=value`` strings as for ``--set``; they are applied after the stand-in's.
        """
        from pflkit.run.experiments import resolve

        base = [f"seed={self.seed}", f"device={self.device}"]
        cfg = resolve(name, self.preset, [*base, *overrides])
        standin = self._standin_overrides(cfg)
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

        Read back (`pflkit.run.runner.load_stage`) from the run of ``exp`` under ``results_root`` when that run
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
        """The paper's claims (`pflkit.report.claims.check_all`) checked on ``names``' results: in results mode
        the committed ones, else the runs `run` made or read (``made``: ``{experiment: (results, run folder or
        None)}`` for results made otherwise). An experiment without results is "not run". A list of
        `ClaimResult` (verdict, paper's value, ours, why), which `pflkit.report.readings.takeaways` reads."""
        from pflkit.io import read_json
        from pflkit.report.claims import check_all
        from pflkit.report.compact import analysis

        if self.source == "results":
            found = {name: self.committed(name) for name in names}
        else:
            runs = {name: (read_json(f / "results.json"), f) for name in names
                    if ((f := self.run_dir(name, results_root)) / "results.json").exists()}
            runs.update(made or {})
            found = {name: {**res, "analysis": analysis(Path(folder), res) if folder else {}}
                     for name, (res, folder) in runs.items()}
        return [c for c in check_all(found) if c.paper == paper]

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
        standin: replace datasets other than sklearn digits by digits (`STANDINS`); labelled as such.
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


# ----------------------------------------------------------------------------- Colab badge and install cell

CLONE_DIR = "pflkit-src"  # not "pflkit": a folder of that name in the working directory shadows the package
# the install cell shows collapsed: its source hidden in Jupyter, a form (its title only) in Colab
INSTALL_METADATA = {"jupyter": {"source_hidden": True}, "cellView": "form"}
INSTALL_HEADER = '# %% tags=["install"] cellView="form" jupyter={"source_hidden": true}'  # the same, in a .py twin

_INSTALL_CELL = '''\
#@title Install pflkit (Colab or a fresh machine; skipped where it is installed) {{ display-mode: "form" }}
# Skipped when pflkit and the packages its notebooks use all import, also after "Restart runtime". An
# install that was interrupted (a clone whose dependencies are missing) is completed. The clone goes to
# "{clone}": a folder named "pflkit" here would shadow the package.
import importlib
import subprocess
import sys
from pathlib import Path

src = Path("{clone}").absolute()
if (src / "pflkit" / "__init__.py").exists() and str(src) not in sys.path:
    sys.path.insert(0, str(src))  # beats a stray pflkit/ folder in the working directory
needed = ["pflkit.cli", "torch", "numpy", "matplotlib", "seaborn", "pandas", "sklearn", "tqdm", "papermill"]
try:  # a real install imports its submodules from a regular package (a namespace one has no __file__)
    for name in needed:
        importlib.import_module(name)
    installed = getattr(sys.modules["pflkit"], "__file__", None) is not None
except ImportError:
    installed = False
if not installed:
    if not (src / "pyproject.toml").exists():
        subprocess.run(["git", "clone", "--depth", "1", "{url}.git", str(src)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{{src}}[notebooks]"], check=True)
    # usable now, without a restart: the clone on sys.path, a stale namespace "pflkit" forgotten
    sys.path.insert(0, str(src))
    for mod in [m for m in sys.modules if m == "pflkit" or m.startswith("pflkit.")]:
        del sys.modules[mod]
    importlib.invalidate_caches()'''

_BADGE = re.compile(r"\[!\[Open In Colab\]\((?P<img>[^)]*)\)\]\(https://colab\.research\.google\.com/github/[^)]*\)")


def repository_url(pyproject: str | os.PathLike | None = None) -> str:
    """``[project.urls] Repository`` of pyproject.toml (the one place the address is written)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    path = Path(pyproject) if pyproject else Path(__file__).resolve().parent.parent / "pyproject.toml"
    return tomllib.loads(path.read_text())["project"]["urls"]["Repository"].rstrip("/")


def install_cell_source(repo_url: str) -> str:
    """The guarded install cell's code for the repository at ``repo_url`` (``https://github.com/OWNER/REPO``)."""
    return _INSTALL_CELL.format(clone=CLONE_DIR, url=repo_url.rstrip("/").removesuffix(".git"))


def badge_target(repo_url: str, notebook: str) -> str:
    """The Colab link opening ``notebook`` (a path relative to the repository root) from GitHub."""
    owner_repo = repo_url.rstrip("/").removesuffix(".git").split("github.com/", 1)[1]
    return f"https://colab.research.google.com/github/{owner_repo}/blob/main/{notebook}"


def _fix_badge(text: str, target: str) -> str:
    return _BADGE.sub(lambda m: f"[![Open In Colab]({m['img']})]({target})", text)


def _sync_py(path: Path, cell: str, target: str) -> str:
    text = _fix_badge(path.read_text(), target)
    pattern = re.compile(r'(# %% [^\n]*tags=\["install"\][^\n]*\n)(.*?)(?=\n+# %%)', re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{path}: no cell tagged 'install'")
    return pattern.sub(lambda m: INSTALL_HEADER + "\n" + cell, text, count=1)


def _sync_ipynb(path: Path, cell: str, target: str) -> str:
    nb = json.loads(path.read_text())
    for c in nb["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] == "code" and "install" in c.get("metadata", {}).get("tags", []):
            src = cell
            c["metadata"].update(INSTALL_METADATA)
        elif c["cell_type"] == "markdown":
            src = _fix_badge(src, target)
        c["source"] = src.splitlines(keepends=True)
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def sync_install_cells(root: Path | None = None, repo_url: str | None = None) -> list[Path]:
    """Rewrite the Colab badge and the install cell of every notebook (and its .py twin).

    The address comes from pyproject.toml (`repository_url`). Returns the files that changed.
    """
    root = root or notebooks_dir()
    repo_url = repo_url or repository_url()
    cell = install_cell_source(repo_url)
    changed = []
    for nb in find_notebooks(root=root):
        target = badge_target(repo_url, f"notebooks/{nb.relative_to(root).as_posix()}")
        for path, sync in ((nb.with_suffix(".py"), _sync_py), (nb, _sync_ipynb)):
            if not path.exists():
                continue
            new = sync(path, cell, target)
            if new != path.read_text():
                path.write_text(new)
                changed.append(path)
    return changed


# ----------------------------------------------------------------------------- batch execution

def notebooks_dir() -> Path:
    here = Path(__file__).resolve().parent.parent / "notebooks"
    if not here.is_dir():
        raise FileNotFoundError(f"no notebooks folder at {here}; run from a clone of the repository")
    return here


def figures_root() -> Path:
    """The repository's committed ``figures/`` folder (written only by ``pflkit notebooks --figures``)."""
    return notebooks_dir().parent / "figures"


def find_notebooks(only: str | None = None, root: Path | None = None) -> list[Path]:
    """Every ``.ipynb`` under notebooks/ (or under one subfolder), sorted; checkpoints skipped."""
    root = root or notebooks_dir()
    base = root / only if only else root
    if only and not base.is_dir():
        folders = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        raise ValueError(f"--only {only!r}: no such folder under {root}; folders: {', '.join(folders)}")
    return sorted(p for p in base.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def run_notebooks(preset: str = "smoke", only: str | None = None, out: str | Path = "notebooks_out",
                  parameters: dict[str, Any] | None = None, kernel: str | None = None,
                  only_names: list[str] | None = None, figures_dir: str | Path | None = None,
                  root: Path | None = None, timeout: int | None = None) -> list[Path]:
    """Execute notebooks with papermill into ``out`` (mirroring folders).

    Every notebook receives ``preset`` and ``out_dir`` (plus ``parameters``) through its cell
    tagged ``parameters``. With ``figures_dir`` each notebook also gets ``figures_dir`` =
    ``figures_dir/<its folder>`` (the batch command passes the repository's ``figures/``);
    without it figures stay under each notebook's ``out_dir``. A failing cell raises
    `papermill.PapermillExecutionError` naming the notebook and the cell, after the partially
    executed copy is written.
    """
    import papermill as pm

    # the "python3" kernelspec runs whatever `python` is first on PATH: make it this interpreter
    bindir = os.path.dirname(sys.executable)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bindir:
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    root = root or notebooks_dir()
    out = Path(out)
    done = []
    for nb in find_notebooks(only, root):
        if only_names is not None and nb.name not in only_names:
            continue
        rel = nb.relative_to(root)
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        params = {"preset": preset, "out_dir": str((out / rel.parent / rel.stem).resolve()), **(parameters or {})}
        if figures_dir is not None:
            params["figures_dir"] = str((Path(figures_dir) / rel.parent).resolve())
        log.info("executing %s", rel)
        pm.execute_notebook(str(nb), str(target), parameters=params, kernel_name=kernel, cwd=str(nb.parent),
                            progress_bar=False, execution_timeout=timeout)
        done.append(target)
    if not done:
        raise ValueError(f"no notebooks found under {root / (only or '')}")
    return done
