"""Finding and executing the repository's notebooks: the ``notebooks/`` folder of the checkout, every notebook
under it (or one subfolder), and their execution with papermill (`pflkit notebooks`, `pflkit reproduce`).
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CHECKOUT = Path(__file__).resolve().parents[2]  # the repository pflkit is imported from (above pflkit/notebooks/)


def notebooks_dir() -> Path:
    """The checkout's ``notebooks/`` folder; an error when pflkit is not imported from a clone."""
    here = CHECKOUT / "notebooks"
    if not here.is_dir():
        raise FileNotFoundError(f"no notebooks folder at {here}; run from a clone of the repository")
    return here



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

