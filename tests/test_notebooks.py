"""Notebooks: structure, the Colab install cell, and execution at the smoke preset.

Execution uses the datasets under ``$PFLKIT_DATA`` when it is set (CI sets it); without it every
notebook runs with ``standin=True`` (sklearn digits in place of missing datasets, labelled as such).
"""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pflkit.notebooks.execute import find_notebooks, run_notebooks
from pflkit.notebooks.install import install_cell_source, repository_url

NOTEBOOKS = find_notebooks()
# every notebook's parameters cell takes these (`pflkit.notebooks.session.setup`'s arguments)
COMMON_PARAMETERS = {"preset", "out_dir", "data_root", "device", "download", "standin", "figures_dir", "seed"}
REPO = Path(__file__).resolve().parent.parent


def _ids():
    return [str(p.relative_to(p.parents[1])) for p in NOTEBOOKS]


# the experiments whose datasets a notebook reads at its default parameters even with standin or in results
# mode (sample images, domain names, a client's data for a hand step): without them its test skips, naming them
NOTEBOOK_DATA = {
    "fedl2p/03_domains": ["fedl2p_table3_digits_a0p5", "fedl2p_table3_cifar10c_a0p5"],
    "fedl2p/05_analysis": ["fedl2p_analysis_digits"],
    "pfedhn/01_method": ["pfedhn_table1_c10_n10"],
    "pfedvem/01_concept_drift_vem": ["pfedvem_omniglot_n50"],
}


def with_data(notebooks) -> list:
    """``notebooks`` as pytest params, each marked `needs_data` with the experiments it reads (`NOTEBOOK_DATA`)."""
    out = []
    for nb in notebooks:
        key = nb.relative_to(nb.parents[1]).with_suffix("").as_posix()
        marks = [pytest.mark.needs_data(experiments=NOTEBOOK_DATA[key])] if key in NOTEBOOK_DATA else []
        out.append(pytest.param(nb, marks=marks, id=key))
    return out


def _cells(nb: Path) -> list[dict]:
    return json.loads(nb.read_text())["cells"]


def _text(cell: dict) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=_ids())
def test_notebook_structure(nb):
    cells = _cells(nb)
    tags = [c.get("metadata", {}).get("tags", []) for c in cells]
    assert sum("parameters" in t for t in tags) == 1, "exactly one cell tagged 'parameters'"
    import papermill as pm

    params = set(pm.inspect_notebook(str(nb)))  # what papermill understands (a '=' or '(' in a comment hides a line)
    assert COMMON_PARAMETERS <= params, f"parameters cell lacks {sorted(COMMON_PARAMETERS - params)}"
    src = "".join(_text(c) for c in cells if c["cell_type"] == "code")
    assert not re.search(r"^\s*class \w+", src, re.MULTILINE), "notebooks import pflkit; they define no classes"
    # data come through setup's data_root / $PFLKIT_DATA, never a folder relative to the checkout
    assert not re.search(r"(\.\./)+\w+/data\b", "".join(_text(c) for c in cells)), "a fixed data path"
    twin = nb.with_suffix(".py")
    if twin.exists():
        import jupytext

        code = [c["source"] for c in jupytext.read(twin).cells if c["cell_type"] == "code"]
        assert code == [_text(c) for c in cells if c["cell_type"] == "code"], f"{twin} out of sync"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=_ids())
def test_badge_and_install_cell_follow_pyproject(nb):
    url = repository_url()
    cells = _cells(nb)
    rel = nb.relative_to(REPO).as_posix()
    badge = f"https://colab.research.google.com/github/{url.split('github.com/')[1]}/blob/main/{rel}"
    links = re.findall(r"\]\((https://colab\.research\.google\.com/github/[^)]*)\)", "".join(map(_text, cells)))
    assert links == [badge]
    install = [_text(c) for c in cells if "install" in c.get("metadata", {}).get("tags", [])]
    assert install == [install_cell_source(url)], "run pflkit.notebooks.session.sync_install_cells()"
    assert f'"{url}.git"' in install[0]


# ----------------------------------------------------------------------------- the setup helper


@pytest.fixture(autouse=True)
def _keep_process_settings():
    """`setup` sets torch's threads and matplotlib's defaults: give other tests theirs back."""
    import matplotlib as mpl
    import torch

    threads, rc = torch.get_num_threads(), dict(mpl.rcParams)
    yield
    torch.set_num_threads(threads)
    mpl.rcParams.update(rc)


def test_setup_makes_folders_and_says_smoke_numbers_are_meaningless(tmp_path, capsys):
    from pflkit.notebooks.session import setup

    s = setup("smoke", str(tmp_path / "run"), threads=1)
    assert "meaningless" in capsys.readouterr().out
    assert s.device in ("cpu", "cuda") and s.out.is_dir() and s.figures == s.out / "figures" and s.figures.is_dir()
    assert s.figure("a.png") == s.figures / "a.png"
    cfg = s.resolve("fedl2p_table2_a0p1_e5", "data.partition.alpha=0.5")
    assert (cfg.data.dataset, cfg.seed, cfg.device, cfg.data.partition["alpha"]) == ("cifar10", 0, s.device, 0.5)
    assert s.paper_header(cfg) == "paper" and s.dataset_label(cfg) == "CIFAR-10"
    other = setup("cpu", str(tmp_path / "b"), figures_dir=str(tmp_path / "figs"), threads=1)
    assert other.figures == tmp_path / "figs" and "meaningless" not in capsys.readouterr().out


def test_standin_is_used_only_when_asked_and_labelled(tmp_path):
    from pflkit.notebooks.session import setup

    s = setup("smoke", str(tmp_path), standin=True, threads=1)
    cfg = s.resolve("fedl2p_table2_a0p1_e5")
    assert (cfg.data.dataset, cfg.model.name) == ("digits", "digits_cnn")
    assert s.dataset_label(cfg) == "sklearn digits (STAND-IN for CIFAR-10)"
    assert s.paper_header(cfg) == "paper (on CIFAR-10)"
    assert s.load("cifar10").meta.name == "digits"
    assert s.resolve("fedl2p_table4_fsdd_e5").data.scheme == "dirichlet"  # digits have no speakers
    demo = s.resolve("demo")
    assert s.dataset_label(demo) == "sklearn digits" and s.paper_header(demo) == "paper"


def test_a_saved_run_that_blew_up_with_finite_numbers_reads_as_diverged(tmp_path):
    """`Session.run` hands a notebook the results with `pflkit.report.divergence` applied, so its tables
    and conclusions never show a broken model's number as a result."""
    from pflkit.io import write_json
    from pflkit.notebooks.session import setup

    s = setup("smoke", str(tmp_path / "out"), threads=1)
    ok = {"status": "ok", "acc_mean": 80.0, "acc_std": 0.0, "per_seed": [80.0], "error": ""}
    res = {"status": "ok", "config": {"preset": "smoke"},
           "methods": {"A": {**ok, "acc_mean": 5.0, "per_seed": [5.0]}, "B": ok},
           "rounds": {"A": {"seed0": [{"round": r + 1, "train_loss": 2.0 if r < 5 else 300.0} for r in range(30)]}}}
    write_json(tmp_path / "saved" / "x" / "results.json", res)
    got = s.run("x", results_root=tmp_path / "saved")
    assert got["methods"]["A"]["status"] == "diverged" and got["methods"]["A"]["acc_mean"] is None
    assert got["methods"]["B"] == ok and got["status"] == "diverged"


def test_setup_refuses_a_device_the_machine_lacks(tmp_path):
    import torch

    from pflkit.notebooks.session import setup

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="device='cuda'"):
        setup("smoke", str(tmp_path), device="cuda", threads=1)


# ----------------------------------------------------------------------------- the install cell in a fresh Python

_DRIVER = """
import json, os, subprocess, sys
calls = []
def fake_run(cmd, *args, **kwargs):  # git and pip stubs: log the call; a clone is a link to the repository
    calls.append([os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd)])
    if cmd[0] == "git":
        os.symlink(os.environ["REPO_ROOT"], cmd[-1])
    return subprocess.CompletedProcess(cmd, 0)
subprocess.run = fake_run
for name in filter(None, os.environ.get("MISSING", "").split(",")):
    sys.modules[name] = None  # a dependency that is not installed: importing it raises ImportError
exec(compile(open(os.environ["CELL_FILE"]).read(), "install-cell", "exec"))
import pflkit.data.datasets
print(json.dumps({"calls": calls, "file": pflkit.__file__}))
"""


def _run_install_cell(cwd: Path, tmp_path: Path, missing: str = "") -> dict:
    cell = tmp_path / "cell.py"
    cell.write_text(install_cell_source(repository_url()))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(REPO_ROOT=str(REPO), CELL_FILE=str(cell), MISSING=missing)
    # `python -c` puts the working directory first on sys.path, as a notebook kernel does
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_DRIVER)], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_install_cell_skips_when_installed_despite_a_pflkit_folder(tmp_path):
    """After "Restart runtime": a clone exists and a folder named pflkit/ sits in the working directory."""
    work = tmp_path / "content"
    work.mkdir()
    (work / "pflkit").symlink_to(REPO)  # an old-style clone: a namespace package shadowing the install
    (work / "pflkit-src").symlink_to(REPO)
    got = _run_install_cell(work, tmp_path)
    assert got["calls"] == []
    assert got["file"].endswith(os.path.join("pflkit", "__init__.py"))


def test_install_cell_completes_an_interrupted_install(tmp_path):
    """A clone is there but a dependency is not (the pip install was stopped): install, do not clone again."""
    work = tmp_path / "content"
    work.mkdir()
    (work / "pflkit-src").symlink_to(REPO)
    got = _run_install_cell(work, tmp_path, missing="seaborn")
    assert [c[:2] for c in got["calls"]] == [[os.path.basename(sys.executable), "-m"]]
    assert got["calls"][0][-1].endswith("[notebooks]"), "installs the notebooks' extras"


def test_install_cell_is_collapsed_in_jupyter_and_a_form_in_colab():
    from pflkit.notebooks.install import INSTALL_METADATA

    for nb in NOTEBOOKS:
        cell = next(c for c in _cells(nb) if "install" in c.get("metadata", {}).get("tags", []))
        assert cell["metadata"]["jupyter"]["source_hidden"] and cell["metadata"]["cellView"] == "form"
        assert cell["metadata"].items() >= INSTALL_METADATA.items() and _text(cell).startswith("#@title")


def test_install_cell_clones_and_installs_when_only_a_stray_folder_imports(tmp_path):
    work = tmp_path / "content"
    work.mkdir()
    (work / "pflkit").symlink_to(REPO)
    got = _run_install_cell(work, tmp_path)
    assert [c[:2] for c in got["calls"]] == [["git", "clone"], [os.path.basename(sys.executable), "-m"]]
    assert Path(got["calls"][0][-1]).resolve() == (work / "pflkit-src").resolve()
    assert "pip" in got["calls"][1] and "-e" in got["calls"][1]
    assert (work / "pflkit-src").is_symlink()
    # importable in the same process, without a restart, from the fresh clone
    assert Path(got["file"]).parent.parent.name == "pflkit-src"


# ----------------------------------------------------------------------------- execution


def _data_parameters() -> dict:
    root = os.environ.get("PFLKIT_DATA")
    return {"source": "train", **({"data_root": root} if root else {"standin": True})}


@pytest.mark.parametrize("nb", with_data(NOTEBOOKS))
def test_notebook_runs_at_smoke(nb, tmp_path):
    done = run_notebooks("smoke", nb.parent.name, tmp_path, parameters=_data_parameters(), only_names=[nb.name])
    assert done and done[0].exists()


def _outputs(nb: Path) -> str:
    out = []
    for c in _cells(nb):
        for o in c.get("outputs", []):
            data = o.get("data", {})
            out.append("".join(o.get("text", "")) + "".join(data.get("text/markdown", data.get("text/plain", ""))))
    return "\n".join(out)


def test_missing_dataset_stops_the_notebook_unless_standin(tmp_path, monkeypatch):
    from papermill.exceptions import PapermillExecutionError

    monkeypatch.setenv("PFLKIT_DATA", "")
    monkeypatch.setenv("PFLKIT_OFFLINE", "1")
    monkeypatch.setenv("PFLKIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(PapermillExecutionError) as err:
        run_notebooks("smoke", "fedl2p", tmp_path / "missing", {"source": "train"},
                      only_names=["02_label_shift.ipynb"])
    assert err.value.ename == "DatasetNotFoundError"
    assert "cifar10" in err.value.evalue
    done = run_notebooks("smoke", "fedl2p", tmp_path / "standin", parameters={"standin": True, "source": "train"},
                         only_names=["02_label_shift.ipynb"])
    text = _outputs(done[0])
    assert "sklearn digits (STAND-IN for CIFAR-10)" in text
    assert "paper (on CIFAR-10)" in text


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=_ids())
def test_notebook_links_the_fidelity_ledger(nb):
    cells = json.loads(nb.read_text())["cells"]
    text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    link = re.search(r"\]\(((?:\.\./)+docs/fidelity\.md)\)", text)
    assert link, "the intro links docs/fidelity.md"
    assert (nb.parent / link.group(1)).resolve().is_file()


# ----------------------------------------------------------------------------- a notebook reading the batch's run

TINY_PC = """
[experiment]
paper = "pfedhn"
table = "Fig. 3"
title = "tiny pFedHN-PC on digits"

[data]
dataset = "digits"
scheme = "pathological"
num_clients = 4
split = "paired"
val_fraction = 0.2

[data.partition]
classes_per_client = 2

[model]
name = "digits_cnn"

[methods."pFedHN-PC"]
algorithm = "pfedhn_pc"
rounds = 3
local_steps = 2
eval_every = 1
"""


def test_trained_reads_a_kept_run_of_the_same_settings_and_trains_otherwise(tmp_path, capsys):
    """`Session.trained` (pFedHN's Fig. 3 / 4 notebooks): the stage read back from a run that kept its states
    is what training it in the notebook gives (states and test metrics bitwise); a run with other settings is
    not read."""
    from pflkit.fl.federate import federation_for
    from pflkit.notebooks.session import setup
    from pflkit.run.environment import make_env
    from pflkit.run.runner import run_experiment
    from pflkit.run.stages import train_method
    from tests.helpers_compare import assert_tree

    spec = tmp_path / "tiny_pc.toml"
    spec.write_text(TINY_PC)
    session = setup("smoke", str(tmp_path / "nb"), threads=1)
    exp = session.resolve(str(spec))
    run_experiment(exp, tmp_path / "runs" / "tiny_pc", progress=False, keep_states=True, engine="sequential")
    dataset = session.load(exp.data.dataset)
    fed = federation_for(exp.data, dataset, exp.seed)

    read = session.trained(exp, "pFedHN-PC", fed, make_env(exp, fed, 0), dataset, tmp_path / "runs")
    assert "pFedHN-PC read from" in capsys.readouterr().out
    here = train_method(exp, "pFedHN-PC", fed, make_env(exp, fed, 0))
    assert read.status == here.status == "ok"
    assert_tree((read.state, read.client_states), (here.state, here.client_states))
    assert_tree(read.summary, here.summary)
    assert [r["val_acc"] for r in read.history] == [r["val_acc"] for r in here.history]

    other = session.resolve(str(spec), "methods.pFedHN-PC.rounds=2")
    again = session.trained(other, "pFedHN-PC", fed, make_env(other, fed, 0), dataset, tmp_path / "runs")
    assert "has other settings or data" in capsys.readouterr().out
    assert len(again.history) == 2
