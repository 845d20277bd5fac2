"""The README's result tables come from the committed compact results (`pflkit.report.readme`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pflkit.report.readme import blocks, render, stale_blocks, sync_readme, sync_text

ROOT = Path(__file__).resolve().parents[1]


def compact(name: str, methods: dict, published=None, seeds=1) -> dict:
    return {"experiment": name, "command": f"pflkit reproduce --preset cpu --only {name}",
            "deviations": ["model.options"], "timing": {"wall_seconds": 600.0},
            "data": {"source": "cifar10_small.npz (subset)"},
            "config": {"data": {"dataset": "cifar10"}, "published": published or {}, "seeds": seeds},
            "methods": methods}


def ok(acc, std=0.0, seeds=1):
    return {"status": "ok", "acc_mean": acc, "acc_std": std, "per_seed": [acc] * seeds}


def write(tmp_path, preset, res):
    folder = tmp_path / "results" / preset
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{res['experiment']}.json").write_text(json.dumps(res))


def test_render_cells_by_hand():
    a = compact("exp_a", {"FedAvg": ok(33.54), "Ditto": {"status": "diverged"}}, published={"FedAvg": 33.5})
    b = compact("exp_b", {"FedAvg": ok(40.04, std=1.26, seeds=3), "Local": ok(70.0)}, seeds=3)
    text = render([a, b])
    rows = text.splitlines()
    assert rows[0] == "| method | `exp_a` | `exp_b` |"
    assert rows[2] == "| FedAvg | 33.5 (33.5) | 40.0 ± 1.3 |"   # ± only with several seeds
    assert rows[3] == "| Ditto | diverged | - |"                  # a status, never a number, when not ok
    assert rows[4] == "| Local | - | 70.0 |"
    assert "`exp_b`: CIFAR-10 (offline subset); seeds 3; declared deviations: `model.options`, 10 min here." in text
    assert "`pflkit reproduce --preset cpu --only exp_a`" in text
    # a method measured on unseen clients too gets an "(unseen)" row; "-" where an experiment has none
    fsdd = compact("exp_u", {"FedL2P": {**ok(98.0), "unseen": {"acc_mean": 84.0, "per_seed": [84.0]}},
                             "Ditto": {"status": "diverged", "unseen": {"acc_mean": 1.0, "per_seed": [1.0]}}},
                   published={"FedL2P (unseen)": 87.85})
    rows = render([a, fsdd]).splitlines()
    assert "| FedL2P (unseen) | - | 84.0 (87.85) |" in rows and "| Ditto (unseen) | - | diverged |" in rows
    assert "| FedAvg (unseen)" not in "\n".join(rows)
    a["analysis"] = {"FedL2P": {"beta_mean": 0.0654}, "L2P": {"beta_mean": None}}
    assert "10 min here; learned beta (mean over clients and BN layers): FedL2P 0.07. `pflkit" in render([a])
    # resumed from stages an earlier invocation finished: all its stages' time, not the last invocation's
    b["timing"] = {"wall_seconds": 600.0, "total_seconds": 4500.0}
    assert "`model.options`, 75 min over its stages (resumed; the last invocation 10 min) here." in render([b])


def test_the_report_gives_a_resumed_runs_time_over_all_its_stages():
    from pflkit.report.timing import run_time

    assert run_time({"timing": {"wall_seconds": 1087.2, "total_seconds": 4462.6}}) == \
        "74.4 min over its stages (resumed; the last invocation 18.1 min)"
    # a run in one go: its stages take about its wall time (data loading and reports on top)
    assert run_time({"timing": {"wall_seconds": 2534.9, "total_seconds": 2525.2}}) == "42.2 min"
    assert run_time({}) == ""
    # stages taken from another experiment's run count in its stages' time, not in this run's
    assert run_time({"timing": {"wall_seconds": 1087.2, "total_seconds": 4462.6},
                     "reused": {"FedL2P": {"from": "x", "seeds": [0]}}}) == \
        "18.1 min here; 74.4 min over its stages with those taken from another run"
    # under a minute in seconds, not "0 min" (the demo at `cpu` takes about 20 s on one thread)
    assert run_time({"timing": {"wall_seconds": 19.8, "total_seconds": 19.6}}, decimals=0) == "20 s"
    assert run_time({"timing": {"wall_seconds": 59.4, "total_seconds": 59.0}}) == "59 s"


def test_the_batch_time_counts_each_runs_own_time_once():
    from pflkit.report.timing import batch_time, own_seconds

    resumed = {"experiment": "a", "timing": {"wall_seconds": 600.0, "total_seconds": 4500.0}}
    reusing = {"experiment": "b", "timing": {"wall_seconds": 1800.0, "total_seconds": 9000.0},
               "reused": {"FedL2P": {"from": "a", "seeds": [0]}}}
    untimed = {"experiment": "c"}
    assert (own_seconds(resumed), own_seconds(reusing), own_seconds(untimed)) == (4500.0, 1800.0, 0.0)
    # 4500 + 1800 s = 1.75 h; the 7200 s b's reused stages took are a's, not counted again
    assert batch_time([resumed, reusing, untimed]) == (
        "Time here: the 2 runs took 1.8 h in all (the sum of each run's own time; a stage taken from another run "
        "counts once); the longest, `a`, 1.2 h.")
    assert batch_time([untimed]) == ""
    # stages taken from part runs with no result of their own (trained beside the rest) count in b
    parts = {**reusing, "reused": {"FedL2P": {"from": "b_part2", "seeds": [0]}}}
    assert own_seconds(parts, frozenset({"a", "b"})) == 9000.0 and own_seconds(parts) == 1800.0
    assert batch_time([resumed, parts]).startswith("Time here: the 2 runs took 3.8 h in all")


def test_hardware_names_the_gpu_else_the_cpus_instruction_set_and_counts_a_mix():
    from pflkit.report.reproduction import _row_note
    from pflkit.report.timing import hardware, hardware_mix

    gpu = {"environment": {"gpu": "NVIDIA H100 80GB HBM3", "cpu_capability": "AVX512"}}
    avx2 = {"environment": {"gpu": None, "cpu_capability": "AVX2"}}
    avx512 = {"environment": {"gpu": None, "cpu_capability": "AVX512"}}
    assert [hardware(r) for r in (gpu, avx2, avx512, {})] == \
        ["NVIDIA H100 80GB HBM3", "a CPU with AVX2", "a CPU with AVX512", ""]
    assert hardware_mix([avx2, avx512, avx512, {}]) == (
        "Hardware: 2 on a CPU with AVX512, 1 on a CPU with AVX2, 1 not recorded. Each changes the float rounding, "
        "which training amplifies, so a rerun on other hardware differs from a row by run-to-run noise.")
    # one kind of hardware (what is not recorded aside): nothing to warn about
    assert hardware_mix([avx2, avx2, {}]) == ""
    row = {**compact("exp_a", {"FedAvg": ok(50.0)}), **avx512}
    assert "Run with pflkit ?, on a CPU with AVX512, 10.0 min." in _row_note(row, {})
    assert "Run with pflkit ?, 10.0 min." in _row_note(compact("exp_a", {"FedAvg": ok(50.0)}), {})


def test_sync_fills_then_detects_a_changed_number(tmp_path):
    write(tmp_path, "cpu", compact("exp_a", {"FedAvg": ok(50.0)}))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results cpu: exp_a -->\nhand-typed 99.9\n<!-- /results -->\noutro\n")
    assert stale_blocks(readme.read_text(), tmp_path / "results") == ["cpu: exp_a"]
    assert sync_readme(readme, tmp_path / "results") == ["cpu: exp_a"]
    text = readme.read_text()
    assert "| FedAvg | 50.0 |" in text and "99.9" not in text and text.startswith("intro\n") and text.endswith("outro\n")
    assert stale_blocks(text, tmp_path / "results") == [] and sync_text(text, tmp_path / "results") == text
    write(tmp_path, "cpu", compact("exp_a", {"FedAvg": ok(51.0)}))   # a new run: the README is now stale
    assert stale_blocks(text, tmp_path / "results") == ["cpu: exp_a"]


def test_a_claims_block_shows_the_verdict_the_results_give(tmp_path):
    """A claims block holds the paper's claims checked on the results (here pFedHN-PC against pFedHN, by
    hand: 82 >= 80 - 1 holds, 78 < 80 - 1 fails); a new result that flips the verdict makes it stale."""
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    write(tmp_path, "cpu", compact("pfedhn_x", {"pFedHN": ok(80.0), "pFedHN-PC": ok(82.0)}))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- claims cpu: pfedhn -->\nhand-typed\n<!-- /claims -->\noutro\n")
    assert sync_readme(readme, tmp_path / "results", catalog) == ["claims cpu: pfedhn"]
    text = readme.read_text()
    rows = [r for r in text.splitlines() if r.startswith("| pfedhn | pFedHN-PC at least matches")]
    assert len(rows) == 1 and "| **holds** |" in rows[0] and "hand-typed" not in text
    assert not any(r.startswith("| fedl2p") for r in text.splitlines())  # only the block's paper
    assert stale_blocks(text, tmp_path / "results", catalog) == []
    write(tmp_path, "cpu", compact("pfedhn_x", {"pFedHN": ok(80.0), "pFedHN-PC": ok(78.0)}))
    assert stale_blocks(text, tmp_path / "results", catalog) == ["claims cpu: pfedhn"]
    assert "| **fails** |" in sync_text(text, tmp_path / "results", catalog)


def test_a_block_without_its_result_names_the_experiment(tmp_path):
    (tmp_path / "results" / "cpu").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="exp_missing.*pflkit reproduce --preset cpu --only exp_missing"):
        stale_blocks("<!-- results cpu: exp_missing -->\n<!-- /results -->", tmp_path / "results")


def test_block_parsing():
    text = "<!-- results cpu: a, b -->\nx\n<!-- /results -->\n<!-- results smoke: c -->\n<!-- /results -->"
    assert [(b.preset, b.names, b.body) for b in blocks(text)] == [("cpu", ("a", "b"), "x\n"), ("smoke", ("c",), "")]


def test_readme_tables_agree_with_committed_results():
    """The sync test: every generated table and claims block of README.md equals what results/ gives (`pflkit reproduce --report`)."""
    text = (ROOT / "README.md").read_text()
    assert blocks(text), "README.md has no generated results table"
    assert stale_blocks(text, ROOT / "results") == [], "run `pflkit reproduce --report` to regenerate the README's tables"


def test_reproduction_report_agrees_with_committed_results(monkeypatch):
    """REPRODUCTION.md is `pflkit reproduce --report --preset cpu` over the committed results and catalog."""
    from pflkit.report.reproduction import build_report

    monkeypatch.chdir(ROOT)
    assert (ROOT / "REPRODUCTION.md").read_text() == build_report("results", ["cpu"]), \
        "run `pflkit reproduce --report --preset cpu` to regenerate REPRODUCTION.md"


def test_a_declared_finding_is_shown_under_its_row_and_is_not_part_of_the_configuration():
    """``[experiment] finding`` explains a surprising number beside it (pFedHN on MNIST at 100 clients,
    27.49 vs the paper's 99.16); it documents the run, so the stored result stays up to date."""
    from pflkit.run.experiments import list_experiments, resolve, tomllib
    from pflkit.io import read_json
    from pflkit.report.compact import config_digest
    from pflkit.report.reproduction import build_report

    path = list_experiments()["pfedhn_table3_mnist_n100"]
    with open(path, "rb") as f:
        finding = tomllib.load(f)["experiment"]["finding"]
    stored = read_json(ROOT / "results" / "cpu" / "pfedhn_table3_mnist_n100.json")
    assert config_digest(resolve(path, "cpu").to_dict()) == stored["fingerprint"]["config"]
    notes = {line.split("`")[1]: line for line in build_report(ROOT / "results", ["cpu"]).splitlines()
             if line.startswith("- `")}
    assert "Finding: " + " ".join(finding.split()) in notes["pfedhn_table3_mnist_n100"]
    assert "Finding:" not in notes["pfedhn_table3_mnist_n10"]  # a file without one
