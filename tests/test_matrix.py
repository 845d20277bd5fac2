"""The cross-paper matrix: its experiment files, the table / heatmap / text of `pflkit.report.matrix`, and
one end-to-end smoke batch of a matrix file through `pflkit reproduce`."""
from __future__ import annotations

import shutil
import time

import pytest

from pflkit.batch import reproduce as rp
from pflkit.run.experiments import PRESETS, list_experiments, resolve
from pflkit.report import matrix as mx
from pflkit.report.reproduction import build_report

MATRIX = {n: p for n, p in list_experiments().items() if p.parent.name == "matrix"}


def method(mean, std=0.5, seeds=3, status="ok"):
    ok = status == "ok"
    return {"status": status, "acc_mean": mean if ok else None, "acc_std": std if ok else None,
            "per_seed": [mean] * seeds if ok else [None] * seeds}


def results(**cols) -> dict:
    """Hand-made compact results: results(matrix_dirichlet={"A": method(50.0)}, ...)."""
    return {name: {"experiment": name, "paper": "matrix", "methods": methods} for name, methods in cols.items()}


HAND = results(
    matrix_dirichlet={"FedAvg": method(40.0, 1.25), "Local": method(55.5, 0.5), "FedL2P": method(55.0, 2.0)},
    matrix_domains={"FedAvg": method(70.0, 1.0), "Local": method(60.0), "FedL2P": method(None, status="diverged")},
)


# ----------------------------------------------------------------------------- the experiment files

def test_there_is_one_matrix_file_per_scenario():
    assert sorted(MATRIX) == sorted(mx.SCENARIOS)


@pytest.mark.parametrize("name", sorted(mx.SCENARIOS))
@pytest.mark.parametrize("preset", PRESETS)
def test_every_matrix_file_resolves_with_three_seeds(name, preset):
    cfg = resolve(name, preset)
    assert cfg.paper == "matrix" and cfg.seeds == 3  # seeds are not a size: 3 at every preset


def _labels(name: str) -> list[str]:
    cfg = resolve(name, "cpu")
    return [cfg.pretrain.label] * (cfg.pretrain is not None) + [m.label for m in cfg.methods]


def test_every_matrix_file_has_the_same_methods_except_documented_exclusions():
    everyone = set().union(*(_labels(n) for n in MATRIX))
    excluded = mx.declared_exclusions()
    for name in MATRIX:
        mine, out = set(_labels(name)), set(excluded.get(name, {}))
        assert not mine & out, f"{name}: excludes methods it runs: {sorted(mine & out)}"
        assert mine | out == everyone, f"{name}: missing without a reason: {sorted(everyone - mine - out)}"
        assert all(why.strip() for why in excluded.get(name, {}).values())


def test_every_algorithm_of_pflkit_is_in_the_matrix_but_the_fedl2p_ablations():
    from pflkit.algorithms import ALGORITHMS

    used = {m.algorithm for n in MATRIX for m in resolve(n, "cpu").methods} | {"fedavg"}
    ablations = {"fedl2p_fomaml", "fedl2p_bnnet", "fedl2p_lrnet_beta1", "fedl2p_lrnet_beta0", "fedselect_v2"}
    assert set(ALGORITHMS) - used == ablations


@pytest.mark.parametrize("name", sorted(mx.SCENARIOS))
def test_the_round_budget_is_the_same_across_federated_methods(name):
    cfg = resolve(name, "cpu")
    n_clients = cfg.data.num_clients
    rounds = {m.label: m.config.rounds for m in cfg.methods}
    base = cfg.pretrain.config.rounds
    for label in ("Local", "FedPer", "Per-FedAvg (FO)", "Per-FedAvg (HF)", "pFedMe", "FedSelect", "FedAlt",
                  "FedRep", "FedBABU", "Ditto", "LotteryFL", "pFedVEM", "pFedMAP"):
        assert rounds[label] == base, label
    assert rounds["pFedHN"] == rounds["pFedHN-PC"] == base * n_clients  # one client per server step


# ----------------------------------------------------------------------------- the table

def test_table_cells_bold_best_and_words():
    text = mx.matrix_table(HAND, scenarios=["matrix_dirichlet", "matrix_domains"])
    assert text.splitlines() == [
        "| method | Dirichlet label shift | Digit domains (feature shift) |",
        "|---|---:|---:|",
        "| FedAvg | 40.0 ± 1.2 | **70.0 ± 1.0** |",
        "| Local | **55.5 ± 0.5** | 60.0 ± 0.5 |",
        "| FedL2P | 55.0 ± 2.0 | diverged |",
    ]


def test_missing_methods_are_na_with_the_files_reason_and_missing_scenarios_not_run():
    res = results(matrix_dirichlet={"FedAvg": method(40.0), "pFedHN": method(30.0)},
                  matrix_speakers={"FedAvg": method(80.0)})
    text = mx.matrix_table(res, {"matrix_speakers": {"pFedHN": "no hypernetwork for audio"}},
                           scenarios=["matrix_dirichlet", "matrix_speakers", "matrix_domains"])
    lines = text.splitlines()
    assert lines[3] == "| pFedHN | 30.0 ± 0.5 | n/a [1] | not run |"
    assert lines[-1] == "[1] `matrix_speakers`: pFedHN left out: no hypernetwork for audio"


def test_one_seed_has_no_spread_and_ties_are_all_bold():
    res = results(matrix_dirichlet={"A": method(50.0, 0.0, seeds=1), "B": method(50.04, 0.0, seeds=1)})
    lines = mx.matrix_table(res, scenarios=["matrix_dirichlet"]).splitlines()
    assert lines[2:] == ["| A | **50.0** |", "| B | **50.0** |"]


def test_non_matrix_results_are_ignored_and_no_result_says_so():
    other = {"pfedhn_table1_c10_n10": {"experiment": "x", "paper": "pfedhn", "methods": {"A": method(1.0)}}}
    assert mx.matrix_results({**HAND, **other}).keys() == HAND.keys()
    assert "No matrix results yet" in mx.matrix_table(other)


def test_cell_rejects_a_number_with_a_word():
    with pytest.raises(ValueError, match="exactly one"):
        mx.Cell(mean=1.0, word="n/a")


def test_best_text_names_the_winner_and_a_close_runner_up():
    text = mx.best_text(HAND, scenarios=["matrix_dirichlet", "matrix_domains", "matrix_speakers"])
    assert text.splitlines() == [
        "- Dirichlet label shift: **Local** (55.5 ± 0.5), then FedL2P (55.0 ± 2.0); within the spread across "
        "seeds, so not a clear winner.",
        "- Digit domains (feature shift): **FedAvg** (70.0 ± 1.0), then Local (60.0 ± 0.5).",
        "- Speakers (FSDD): no result yet.",
    ]


def test_the_figure_and_the_markdown_are_written(tmp_path):
    md, png = mx.write_matrix(HAND, "cpu", tmp_path / "figures" / "matrix")
    assert png.name == "matrix_cpu.png" and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = md.read_text()
    assert "`pflkit reproduce --paper matrix --preset cpu`" in text and "**Local**" in text
    assert "![matrix](matrix_cpu.png)" in text


def test_the_report_has_a_matrix_section_only_with_matrix_results(tmp_path):
    import json

    folder = tmp_path / "results" / "cpu"
    folder.mkdir(parents=True)
    for name, res in HAND.items():
        (folder / f"{name}.json").write_text(json.dumps(res))
    text = build_report(tmp_path / "results", with_catalog=False)
    assert "### Cross-paper matrix (preset `cpu`)" in text and "| Local | **55.5 ± 0.5** |" in text
    (folder / "matrix_dirichlet.json").unlink()
    (folder / "matrix_domains.json").unlink()
    (folder / "x.json").write_text(json.dumps({"experiment": "x", "paper": "tiny", "methods": {}}))
    assert "Cross-paper matrix" not in build_report(tmp_path / "results", with_catalog=False)


# ----------------------------------------------------------------------------- end to end

def test_reproduce_runs_a_matrix_file_and_writes_the_table_and_figure(tmp_path, shared_data):
    """The smallest matrix file at smoke, one seed (``--set seeds=1``), through the batch."""
    catalog = tmp_path / "catalog" / "matrix"
    catalog.mkdir(parents=True)
    shutil.copy(MATRIX["matrix_dirichlet"], catalog)
    t0 = time.perf_counter()
    outcomes = rp.reproduce("smoke", paper="matrix", results_dir=tmp_path / "results", work_dir=tmp_path / "work",
                            overrides=["seeds=1"], catalog=catalog.parent, notebooks=False, progress=False,
                            data_root=shared_data)
    took = time.perf_counter() - t0
    status = {o.name: o.status for o in outcomes}
    assert status == {"matrix_dirichlet": "done", "matrix table and figure": "done"}, outcomes
    md = (tmp_path / "work" / "matrix" / "matrix_smoke.md").read_text()
    assert "| FedL2P |" in md and "not run" in md  # the other scenarios have no result here
    assert (tmp_path / "work" / "matrix" / "matrix_smoke.png").stat().st_size > 0
    assert took < 180, f"{took:.0f} s"
    again = dict(paper="matrix", results_dir=tmp_path / "results", work_dir=tmp_path / "work", overrides=["seeds=1"],
                 catalog=catalog.parent, notebooks=False, progress=False, data_root=shared_data)
    assert {o.status for o in rp.reproduce("smoke", **again)} == {"skipped"}  # nothing changed: nothing drawn
    (tmp_path / "work" / "matrix" / "matrix_smoke.png").unlink()
    status = {o.name: o.status for o in rp.reproduce("smoke", **again)}
    assert status == {"matrix_dirichlet": "skipped", "matrix table and figure": "done"}
    assert (tmp_path / "work" / "matrix" / "matrix_smoke.png").exists()
