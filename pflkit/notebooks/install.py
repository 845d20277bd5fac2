"""The notebooks' Colab badge and guarded install cell, written from the one repository address in
``pyproject.toml`` (`sync_install_cells`) into every notebook and its ``.py`` twin.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from pflkit.notebooks.execute import CHECKOUT, find_notebooks, notebooks_dir
from pflkit.report.committed import CLONE_DIR

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

    path = Path(pyproject) if pyproject else CHECKOUT / "pyproject.toml"
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

