"""Packaging: the experiment catalog ships in the wheel, and the CLI finds it from any directory.

(That every catalog experiment resolves at every preset is checked in tests/test_experiments.py.)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pflkit.run.experiments import experiments_dir, list_experiments

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pflkit"
# top-level folders of the repository that must never end up in the wheel
NOT_SHIPPED = ("notebooks/", "tests/", "data/", "figures/", "benchmarks/", "docs/", "results/", "runs/")


def _source_files() -> list[Path]:
    """The files a clean clone would have: tracked plus untracked-but-not-ignored (git), else a walk."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                             capture_output=True, check=True).stdout.decode()
        files = [REPO / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in REPO.rglob("*") if ".git" not in p.parts]
    skip = {"__pycache__", ".ipynb_checkpoints", "build", "dist", "runs"}
    return [p for p in files if p.is_file() and not skip & set(p.relative_to(REPO).parts)
            and not any(part.endswith(".egg-info") or part.startswith(".ci-venv") for part in p.parts)]


def _pip(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the source tree (a build in place would leave build/ in the checkout)."""
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for f in _source_files():
        target = src / f.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    # offline: build with this environment's setuptools when it can; else pip's isolated build
    # environment (which needs setuptools from the package index)
    r = _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), ".", cwd=src)
    if r.returncode != 0:
        r = _pip("wheel", "-q", "--no-deps", "-w", str(dist), ".", cwd=src)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = dist.glob("pflkit-*.whl")
    return whl


def test_catalog_lives_inside_the_package():
    root = experiments_dir()
    assert root == PACKAGE / "catalog" or root.resolve() == (PACKAGE / "catalog").resolve()
    exps = list_experiments()
    assert "demo" in exps and len(exps) == len(list(root.rglob("*.toml")))
    assert not (REPO / "experiments").exists(), "the catalog moved to pflkit/catalog/"


def test_wheel_has_the_catalog_and_the_code_and_nothing_else(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tomls = {f"pflkit/{p.relative_to(PACKAGE).as_posix()}" for p in (PACKAGE / "catalog").rglob("*.toml")}
    assert len(tomls) >= 2 and "pflkit/catalog/tutorials/demo.toml" in tomls
    assert tomls <= names, f"catalog files missing from the wheel: {sorted(tomls - names)[:5]}"
    py = {f"pflkit/{p.relative_to(PACKAGE).as_posix()}" for p in _source_files()
          if p.suffix == ".py" and PACKAGE in p.parents}
    assert py <= names, f"modules missing from the wheel: {sorted(py - names)[:5]}"
    stray = [n for n in names if not (n.startswith("pflkit/") or n.startswith("pflkit-"))]
    assert not stray, f"files outside the package in the wheel: {stray[:5]}"
    assert not [n for n in names if n.startswith(NOT_SHIPPED) or n.endswith((".ipynb", ".npz", ".pt"))]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "pflkit = pflkit.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_installed_wheel_lists_and_resolves_from_another_directory(wheel, tmp_path):
    site, work = tmp_path / "site", tmp_path / "work"
    work.mkdir()
    r = _pip("install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel), cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    script = ("import sys, pflkit\n"
              "from pflkit.cli import main\n"
              "from pflkit.run.experiments import resolve\n"
              "print('FROM', pflkit.__file__)\n"
              "print('SMOKE', resolve('demo', 'smoke').data.num_clients)\n"
              "sys.exit(main(['list']))\n")
    # PYTHONPATH puts the wheel's copy ahead of the editable install of this checkout
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert Path(lines[0].split(" ", 1)[1]).resolve().is_relative_to(site.resolve())
    assert lines[1].startswith("SMOKE ") and int(lines[1].split()[1]) >= 1
    known = set(list_experiments())
    listed = [set(line.split()) & known for line in lines[2:]]
    assert all(len(names) == 1 for names in listed), lines[2:7]
    assert set().union(*listed) == known and len(listed) == len(known)


def test_pflkit_list_runs_from_outside_the_repository(tmp_path):
    exe = Path(sys.executable).parent / "pflkit"
    cmd = [str(exe), "list"] if exe.exists() else [sys.executable, "-c",
                                                    "import sys; from pflkit.cli import main; sys.exit(main(['list']))"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert any(line.split()[2:3] == ["demo"] for line in r.stdout.splitlines()), r.stdout[:500]


def _pyproject() -> dict:
    import tomllib

    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_notebooks_extra_has_jupyterlab_and_ipywidgets_and_the_environment_installs_it():
    extra = {req.split(">")[0].split("=")[0].split("[")[0].strip().lower()
             for req in _pyproject()["project"]["optional-dependencies"]["notebooks"]}
    assert {"jupyterlab", "ipywidgets"} <= extra
    pip_lines = [line.split("#")[0].strip() for line in (REPO / "environment.yml").read_text().splitlines()]
    assert any(line.startswith("- -e .[") and "notebooks" in line for line in pip_lines)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pathspec's pattern names, used by flwr
def test_flower_app_bundle_includes_the_catalog():
    """`flwr run .` packs only what fab-include names: the ServerApp resolves experiments by name."""
    pytest.importorskip("flwr")
    from flwr.cli.build import collect_files, get_filtered_fab_paths

    paths = set(get_filtered_fab_paths(collect_files(REPO), _pyproject()))
    tomls = {p.relative_to(REPO).as_posix() for p in (PACKAGE / "catalog").rglob("*.toml")}
    assert tomls <= paths, sorted(tomls - paths)[:5]
    assert "pflkit/flower/app.py" in paths and "pflkit/run/experiments.py" in paths
