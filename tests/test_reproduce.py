"""`pflkit reproduce`: the resumable batch, compact results, the reproduction report and the claim checks.

The batch tests run a catalog of two tiny experiment files written here (sklearn digits, 3 clients, one
round; and the same on CIFAR-100, which is not available offline), so they take seconds.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pflkit.batch import notebook_runs as nr
from pflkit.batch import outcomes as oc
from pflkit.batch import selection as sel
from pflkit.batch import versions as ver
from pflkit.batch import work_folder as wf
from pflkit.batch import reproduce as rp
from pflkit.cli import main
from pflkit.run.experiments import resolve
from pflkit.report import claims as cl
from pflkit.report import compact as cp
from pflkit.report.fedl2p.claims import (fedl2p_beta_by_shift, fedl2p_beta_per_client, fedl2p_ift_matches_fomaml,
                                         fedl2p_lrnet_input_ari, fedl2p_matches_best_ft)
from pflkit.report.fedselect.claims import fedselect_beats_fedavg_lg
from pflkit.report.papers import CLAIMS, check_all
from pflkit.report.pfedhn.claims import pfedhn_beats_baselines_n50, pfedhn_pc_matches
from pflkit.report.pfedvem.claims import pfedvem_best_under_drift
from pflkit.report.reproduction import build_report, out_of_date
from pflkit.fl.engines import nbytes
from pflkit.fl.loop import check_finite
from pflkit.run.folder import load_final_states

from helpers_catalog import tiny_toml, write_toml  # noqa: E402

def write_tiny(folder: Path, name: str, dataset: str = "digits", epochs: int = 1, ft_published: float = 87.25):
    text = tiny_toml(dataset=dataset, title=f"{dataset}, 3 clients, one round", ft={"client": epochs},
                     published={"Global": 12.5, "FT (BN C)": ft_published})
    return write_toml(folder / "tiny" / f"{name}.toml", text)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """One batch over the tiny catalog (done + not run), shared by the tests that only read its output."""
    root = tmp_path_factory.mktemp("reproduce")
    catalog = root / "catalog"
    write_tiny(catalog, "tiny_digits")
    write_tiny(catalog, "tiny_cifar100", dataset="cifar100")
    kw = dict(results_dir=root / "results", work_dir=root / "work", catalog=catalog, notebooks=False, progress=False)
    outcomes = rp.reproduce("smoke", **kw)
    return {"root": root, "catalog": catalog, "kw": kw, "outcomes": {o.name: o for o in outcomes}}


def by_name(outcomes):
    return {o.name: o for o in outcomes}


def test_batch_runs_and_reports_missing_data_as_not_run(batch):
    out = batch["outcomes"]
    assert out["tiny_digits"].status == "done", out["tiny_digits"]
    assert out["tiny_cifar100"].status == "not run" and out["tiny_cifar100"].reason == "data missing: cifar100"
    assert not (batch["root"] / "work" / "tiny_cifar100").exists()  # nothing left behind
    status = json.loads((batch["root"] / "results" / "smoke" / "_status.json").read_text())
    assert status["tiny_cifar100"]["status"] == "not run"
    summary = oc.format_summary(list(out.values()), 3.0)
    assert "1 done, 0 skipped, 1 not run, 0 failed" in summary and "data missing: cifar100" in summary


def test_compact_result_holds_what_the_report_needs_and_no_checkpoints(batch):
    path = batch["root"] / "results" / "smoke" / "tiny_digits.json"
    res = json.loads(path.read_text())
    full = json.loads((batch["root"] / "work" / "tiny_digits" / "results.json").read_text())
    assert res["methods"] == full["methods"]  # summary, per-seed and per-client accuracies, as the run wrote them
    assert len(res["methods"]["FT (BN C)"]["per_client"][0]) == 3
    assert res["methods"]["FT (BN C)"]["published"] == 87.25
    assert set(res["history"]) == {"Global", "FT (BN C)"} and res["history"]["Global"]["seed0"][0]["round"] == 1
    assert res["config"] == full["config"] and res["preset"] == "smoke" and res["deviations"] == []
    assert res["fingerprint"]["code"] == ver.code_version() and res["version"]["pflkit"]
    f = res["data"]["files"][0]
    assert len(f["sha256"]) == 64 and "path" not in f and f["file"] == "digits.csv.gz"
    assert res["command"] == "pflkit reproduce --preset smoke --only tiny_digits"
    assert path.stat().st_size < 20_000 and ".pt" not in path.read_text()


def test_runs_a_notebook_reads_keep_their_trained_states(batch, tmp_path, monkeypatch):
    """`KEEP_STATES` runs keep each stage's final states in the work folder (FedSelect's notebook reads
    them instead of training again); other runs keep none."""
    assert not list((batch["root"] / "work" / "tiny_digits").rglob("*.final.pt"))
    monkeypatch.setattr(wf, "KEEP_STATES", ("tiny_dig*",))
    rp.reproduce("smoke", **dict(batch["kw"], results_dir=tmp_path / "results", work_dir=tmp_path / "work"))
    kept = load_final_states(tmp_path / "work" / "tiny_digits", "Global")
    assert nbytes(kept["state"]) > 0
    check_finite(kept["state"], "state", "kept by the batch")


def test_second_batch_skips_a_changed_config_reruns_and_an_interrupted_run_resumes(batch):
    kw, catalog = batch["kw"], batch["catalog"]
    # published numbers are documentation: a new one is copied into the result, nothing reruns
    write_tiny(catalog, "tiny_digits", ft_published=90.5)
    again = by_name(rp.reproduce("smoke", **kw))
    assert again["tiny_digits"].status == "skipped" and again["tiny_cifar100"].status == "not run"
    compact = kw["results_dir"] / "smoke" / "tiny_digits.json"
    assert json.loads(compact.read_text())["methods"]["FT (BN C)"]["published"] == 90.5
    # a changed setting reruns it (from scratch: the work folder's run had other settings)
    write_tiny(catalog, "tiny_digits", epochs=2, ft_published=90.5)
    again = by_name(rp.reproduce("smoke", only="digits", **kw))
    assert set(again) == {"tiny_digits"} and again["tiny_digits"].status == "done"
    assert json.loads(compact.read_text())["config"]["methods"][0]["epochs"] == 2
    # stopped mid-run: the finished stage is kept, the missing one runs, the numbers are the same
    seed = kw["work_dir"] / "tiny_digits" / "seed0"
    before, stamp = json.loads(compact.read_text())["methods"], (seed / "global.json").stat().st_mtime_ns
    compact.unlink()
    (seed / "ft-bn-c.json").unlink()
    again = by_name(rp.reproduce("smoke", only="tiny_digits", **kw))
    assert again["tiny_digits"].status == "done"
    assert (seed / "global.json").stat().st_mtime_ns == stamp
    assert json.loads(compact.read_text())["methods"] == before


def test_a_result_names_every_machine_its_run_was_resumed_on(batch, tmp_path, monkeypatch):
    """Each invocation that runs a work folder's run is recorded before it starts (a killed one leaves its
    entry) with the hardware it ran on; the compact result keeps them all, so a run resumed on another
    machine names both, not only the last one's ``environment``."""
    import pflkit.run.environment as environment
    import pflkit.run.runner as runner
    from pflkit.report.timing import hardware

    real_info, real_run = runner.device_info, runner.run_experiment
    seen = []

    def on(cap):
        def info(cfg):
            return {**real_info(cfg), "gpu": None, "cpu_capability": cap}
        monkeypatch.setattr(runner, "device_info", info)  # the run's record
        monkeypatch.setattr(environment, "device_info", info)  # the batch's record of each invocation

    def run_and_look(cfg, folder, **kw):  # the entry is on disk while the run trains
        seen.append(json.loads((folder / wf.INVOCATIONS).read_text())["runs"][-1])
        return real_run(cfg, folder, **kw)

    monkeypatch.setattr(runner, "run_experiment", run_and_look)
    write_tiny(tmp_path / "catalog", "tiny_digits")
    kw = dict(batch["kw"], results_dir=tmp_path / "results", work_dir=tmp_path / "work", only="tiny_digits",
              catalog=tmp_path / "catalog")
    compact, seed = tmp_path / "results" / "smoke" / "tiny_digits.json", tmp_path / "work" / "tiny_digits" / "seed0"
    on("AVX512")
    rp.reproduce("smoke", **kw)
    assert seen[-1]["cpu_capability"] == "AVX512" and seen[-1]["seconds"] is None
    first = json.loads(compact.read_text())["invocations"]
    assert first["unrecorded"] is False and len(first["runs"]) == 1 and first["runs"][0]["seconds"] > 0
    assert hardware(json.loads(compact.read_text())) == "a CPU with AVX512"
    # stopped before its last stage, resumed on a machine with other vector instructions
    compact.unlink()
    (seed / "ft-bn-c.json").unlink()
    on("AVX2")
    rp.reproduce("smoke", **kw)
    res = json.loads(compact.read_text())
    assert [r["cpu_capability"] for r in res["invocations"]["runs"]] == ["AVX512", "AVX2"]
    assert res["environment"]["cpu_capability"] == "AVX2"  # the runner's record: the last machine only
    assert hardware(res) == "a CPU with AVX512, then a CPU with AVX2"
    # a run resumed from before invocations were recorded says so
    compact.unlink()
    (seed / "ft-bn-c.json").unlink()
    (seed.parent / wf.INVOCATIONS).unlink()
    rp.reproduce("smoke", **kw)
    res = json.loads(compact.read_text())
    assert res["invocations"]["unrecorded"] is True and len(res["invocations"]["runs"]) == 1
    assert hardware(res) == "a CPU with AVX2 (earlier invocations not recorded)"
    # a run that starts over (another setting) starts a new record
    write_tiny(tmp_path / "catalog", "tiny_digits", epochs=2)
    on("AVX512")
    rp.reproduce("smoke", **kw)
    calls = json.loads(compact.read_text())["invocations"]
    assert calls["unrecorded"] is False and [r["cpu_capability"] for r in calls["runs"]] == ["AVX512"]


def test_a_code_change_makes_a_result_stale(batch, monkeypatch):
    from pflkit.run.experiments import resolve

    compact = batch["kw"]["results_dir"] / "smoke" / "tiny_digits.json"
    cfg = resolve(batch["catalog"] / "tiny" / "tiny_digits.toml", "smoke")
    code = json.loads(compact.read_text())["fingerprint"]["code"]
    assert sel._up_to_date(compact, cfg, code) == (True, "up to date")
    assert sel._up_to_date(compact, cfg, {**code, "source": "0" * 16}) == (False, "code changed")
    assert sel._up_to_date(compact, cfg, None) == (True, "up to date")  # --no-code-check
    monkeypatch.setattr(sel, "COMPACT_FORMAT", sel.COMPACT_FORMAT + 1)
    assert sel._up_to_date(compact, cfg, code) == (False, "compact format changed")


def test_code_version_ignores_comments_and_docstrings_not_code(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "report").mkdir(parents=True)
    (pkg / "a.py").write_text('"""Doc."""\nx = 1  # one\n')
    base = ver.code_version(pkg)
    (pkg / "a.py").write_text('"""Other doc."""\n# a comment\nx = 1\n')
    (pkg / "report" / "t.py").write_text("y = 2\n")  # not run code
    assert ver.code_version(pkg) == base
    (pkg / "a.py").write_text('"""Doc."""\nx = 2\n')
    assert ver.code_version(pkg) != base


def test_data_sources_lose_machine_folders():
    src = "mnist: /srv/datasets/mnist.npz; mnist_m: /home/u/d/mnist_m_small.npz (subset); split 80/20"
    assert cp._no_folders(src) == "mnist: mnist.npz; mnist_m: mnist_m_small.npz (subset); split 80/20"


def test_selection_by_paper_and_pattern():
    assert list(sel.select(only="demo")) == ["demo"]
    fedselect = sel.select(paper="fedselect")
    assert fedselect and all(n.startswith("fedselect_") for n in fedselect)
    assert set(sel.select(only="fedselect_table1_s*,demo")) == {"fedselect_table1_s2", "fedselect_table1_s4", "demo"}
    # a full name selects that experiment only (it is the command each compact result records)
    assert set(sel.select(only="pfedhn_table1_c10_n10,demo")) == {"demo", "pfedhn_table1_c10_n10"}
    assert {"pfedhn_table1_c10_n10", "pfedhn_table1_c10_n100"} <= set(sel.select(only="c10_n10"))  # a substring
    with pytest.raises(Exception, match="no experiment matches"):
        sel.select(only="no_such_experiment")


def test_report_shows_published_and_measured_numbers(batch, tmp_path):
    text = build_report(batch["kw"]["results_dir"], catalog=batch["catalog"])
    res = json.loads((batch["kw"]["results_dir"] / "smoke" / "tiny_digits.json").read_text())
    ours = f"{res['methods']['FT (BN C)']['acc_mean']:.2f}"
    assert "## Preset `smoke`" in text and "#### Table 1" in text
    assert f"**{ours}** / {res['methods']['FT (BN C)']['published']:g}" in text
    assert "`tiny_cifar100` (not run)" in text and "data missing: cifar100" in text and "- / 87.25" in text
    assert "Reproduce: `pflkit reproduce --preset smoke --only tiny_digits" in text
    assert "### Claims" in text and "| **not run** |" in text
    out = tmp_path / "REPRODUCTION.md"
    assert main(["reproduce", "--report", "--results", str(batch["kw"]["results_dir"]), "--output", str(out)]) == 0
    assert "Reproduction report" in out.read_text()


def test_the_report_marks_a_result_whose_experiment_file_changed_since(batch, tmp_path):
    results, catalog = tmp_path / "results", tmp_path / "catalog"
    shutil.copytree(batch["kw"]["results_dir"], results)
    shutil.copytree(batch["catalog"], catalog)
    compact = results / "smoke" / "tiny_digits.json"
    res = json.loads(compact.read_text())
    epochs = res["config"]["methods"][0]["epochs"]
    write_tiny(catalog, "tiny_digits", epochs=epochs)
    assert not out_of_date(res, catalog)
    assert "out of date" not in build_report(results, catalog=catalog).lower()
    # a new published number documents the run: the same configuration
    write_tiny(catalog, "tiny_digits", epochs=epochs, ft_published=1.5)
    assert not out_of_date(res, catalog)
    # a setting that changes the numbers: marked in the table, in the row's note and in the count
    write_tiny(catalog, "tiny_digits", epochs=epochs + 1)
    assert out_of_date(res, catalog)
    text = build_report(results, catalog=catalog)
    assert "| `tiny_digits` (out of date) |" in text and "1 of them is out of date" in text
    assert "- `tiny_digits`: " in text and "**Out of date**: its resolved settings" in text
    assert "the earlier configuration's numbers): `tiny_digits`." in text  # under the claims
    # the batch agrees: it is the one it would rerun
    cfg = resolve(catalog / "tiny" / "tiny_digits.toml", "smoke")
    assert sel._up_to_date(compact, cfg, None) == (False, "configuration changed")
    # a result of an experiment the catalog does not know is not judged
    assert not out_of_date({**res, "experiment": "no_such_experiment"}, catalog)


def test_fedl2p_reports_are_summarized_with_beta_and_ari(tmp_path):
    seed = tmp_path / "seed0"
    seed.mkdir()
    info = [{"domain": d} for d in (0, 0, 0, 1, 1, 1)]
    np.savez(seed / "federation.npz", __info__=np.array(json.dumps(info)))
    rows = [{"client": c, "beta": {"bn1": 0.1 * c, "bn2": 0.1 * c}, "sparsity": 0.0, "eta": {"w": 0.1},
             "xi": [float(d["domain"]), 0.0], "features": [10.0 * d["domain"] + 0.01 * c, 1.0]}
            for c, d in enumerate(info)]
    (seed / "fedl2p.report.json").write_text(json.dumps(rows))
    results = {"config": {"seed": 0, "seeds": 1}, "methods": {"FedL2P": {}, "FT (BN C)": {}}}
    a = cp.analysis(tmp_path, results)
    assert set(a) == {"FedL2P"}
    assert a["FedL2P"]["beta_mean"] == pytest.approx(0.25)
    assert a["FedL2P"]["seeds"][0]["beta_per_client"] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert a["FedL2P"]["seeds"][0]["ari"]["features"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- claims on hand-made results

def method(acc, published=None, status="ok"):
    return {"status": status, "acc_mean": acc if status == "ok" else None, "published": published}


def result(methods: dict, *, dataset="cifar10", scheme="dirichlet", beta=None, ari=None, alpha=0.5):
    analysis = {}
    if beta is not None or ari is not None:
        analysis["FedL2P"] = {"beta_mean": beta, "seeds": [{"seed": 0, **({"ari": {"features": ari}} if ari else {})}]}
    return {"methods": methods, "analysis": analysis,
            "config": {"data": {"dataset": dataset, "scheme": scheme, "partition": {"alpha": alpha}}}}


def fedl2p_row(fedl2p, ft_c, ft_g, **kw):
    return result({"FT (BN C)": method(ft_c, 70.0), "FT (BN G)": method(ft_g, 75.0),
                   "FedL2P": method(fedl2p, 76.0)}, **kw)


@pytest.mark.parametrize("label_beta, feature_beta, verdict", [(0.05, 0.6, "holds"), (0.5, 0.6, "fails"),
                                                               (0.05, 0.1, "fails"), (None, 0.6, "not run")])
def test_claim_fedl2p_beta(label_beta, feature_beta, verdict):
    res = {"fedl2p_table3_cifar10c_a0p5": fedl2p_row(70, 60, 65, dataset="cifar10c", beta=feature_beta)}
    if label_beta is not None:
        res["fedl2p_table2_a0p1_e5"] = fedl2p_row(70, 60, 65, beta=label_beta)
    c = fedl2p_beta_by_shift(res)
    assert c.verdict == verdict, c
    if verdict != "not run":
        assert f"{label_beta:.2f}" in c.ours and f"{feature_beta:.2f}" in c.ours


@pytest.mark.parametrize("ft_c, ft_g, explained", [(60, 65, True), (70, 65, False)])
def test_claim_fedl2p_beta_names_the_bn_premise(ft_c, ft_g, explained):
    """A low feature-shift beta is explained by the same runs when FT (BN G) beats FT (BN C) there."""
    res = {"fedl2p_table3_cifar10c_a0p5": fedl2p_row(70, ft_c, ft_g, dataset="cifar10c", beta=0.05),
           "fedl2p_table3_digits_a0p5": fedl2p_row(70, ft_c + 2, ft_g, dataset="digit_domains", beta=0.05),
           "fedl2p_table2_a0p1_e5": fedl2p_row(70, 60, 65, beta=0.05)}
    c = fedl2p_beta_by_shift(res)
    assert c.verdict == "fails"
    assert ("FT (BN G) beats FT (BN C) (65.00 vs 61.00, mean of 2)" in c.reason) == explained, c.reason


@pytest.mark.parametrize("cifar_beta, split", [(0.6, True), (0.2, False)])
def test_claim_fedl2p_beta_splits_feature_shift_by_dataset(cifar_beta, split):
    """A low pooled feature-shift beta that one dataset clears: that dataset is named, and the BN premise is
    computed from the other dataset's runs only."""
    res = {"fedl2p_table3_cifar10c_a0p5": fedl2p_row(70, 68, 60, dataset="cifar10c", beta=cifar_beta),
           "fedl2p_table3_digits_a0p5": fedl2p_row(70, 40, 50, dataset="digit_domains", beta=0.05),
           "fedl2p_table3_digits_a1p0": fedl2p_row(70, 30, 44, dataset="digit_domains", beta=0.10),
           "fedl2p_table3_digits_a1000": fedl2p_row(70, 20, 30, dataset="digit_domains", beta=0.0),
           "fedl2p_table2_a0p1_e5": fedl2p_row(70, 60, 65, beta=0.05)}
    c = fedl2p_beta_by_shift(res)
    assert c.verdict == "fails"
    pooled = (cifar_beta + 0.15) / 4
    assert f"{pooled:.2f} (feature shift, 4 runs: CIFAR-10-C {cifar_beta:.2f} in 1, MNIST / MNIST-M / USPS 0.05 in 3)" \
        in c.ours, c.ours
    assert ("beta is at least 0.3 on CIFAR-10-C (0.60) and 0.05 on MNIST / MNIST-M / USPS" in c.reason) == split
    # FT (BN C) / (BN G) means: digits only (30.00 vs 41.33) when split, all four runs (39.50 vs 46.00) otherwise
    premise = "MNIST / MNIST-M / USPS feature-shift runs FT (BN G) beats FT (BN C) (41.33 vs 30.00, mean of 3)" \
        if split else "in these feature-shift runs FT (BN G) beats FT (BN C) (46.00 vs 39.50, mean of 4)"
    assert premise in c.reason, c.reason


@pytest.mark.parametrize("repeat_beta, counted", [(0.9, False), (0.7, True)])
def test_claim_fedl2p_beta_counts_a_repeated_run_once(repeat_beta, counted):
    """Table 5's FedL2P that is Table 3's run (same data, same outcome) weighs once in the mean and is named;
    a run of the same scenario with another outcome is a second run."""
    res = {"fedl2p_table3_cifar10c_a0p1": fedl2p_row(70, 60, 65, dataset="cifar10c", beta=0.9),
           "fedl2p_table3_digits_a0p1": fedl2p_row(70, 60, 65, dataset="digit_domains", beta=0.0),
           "fedl2p_table5_cifar10c_a0p1": fedl2p_row(70, 60, 65, dataset="cifar10c", beta=repeat_beta),
           "fedl2p_table2_a0p1_e5": fedl2p_row(70, 60, 65, beta=0.05)}
    res["fedl2p_table5_cifar10c_a0p1"]["methods"]["FedL2P"]["published"] = 89.23  # the paper's side may differ
    c = fedl2p_beta_by_shift(res)
    # feature-shift means: (0.9 + 0.0) / 2 = 0.45 when the repeat counts once, (0.9 + 0.0 + 0.7) / 3 = 0.53
    expected = "0.53 (feature shift, 3 runs" if counted else "0.45 (feature shift, 2 runs"
    assert expected in c.ours, c.ours
    note = "counted once, as the same FedL2P run: fedl2p_table5_cifar10c_a0p1 = fedl2p_table3_cifar10c_a0p1"
    assert (note in c.ours) == (not counted), c.ours


def with_client_betas(res: dict, betas: list[float], xi_ari: float | None = None) -> dict:
    """``res`` with the clients' kept beta (and the ARI of BNNet's input) in seed 0's analysis."""
    seed = res["analysis"]["FedL2P"]["seeds"][0]
    seed["beta_per_client"] = betas
    if xi_ari is not None:
        seed["ari"] = {**seed.get("ari", {}), "xi": xi_ari}
    return res


@pytest.mark.parametrize("span, verdict", [(0.3, "holds"), (0.125, "inconclusive"), (0.0625, "fails"),
                                           (0.004, "fails")])
def test_claim_fedl2p_beta_per_client_reads_the_widest_feature_shift_span(span, verdict):
    """The clients' beta must spread in at least one feature-shift run; a label-shift run's spread does not count.
    Twelve clients evenly spread: the bootstrap interval of the span over clients reaches below 0.1 for a span
    of 0.125 (inconclusive), not for 0.3."""
    betas = list(np.linspace(0.25, 0.25 + span, 12))
    res = {"fedl2p_table3_cifar10c_a0p5": with_client_betas(
               fedl2p_row(70, 60, 65, dataset="cifar10c", beta=0.5), betas, xi_ari=0.9),
           "fedl2p_table3_digits_a0p5": with_client_betas(
               fedl2p_row(70, 60, 65, dataset="digit_domains", beta=0.1), [0.1, 0.101], xi_ari=1.0),
           "fedl2p_table2_a0p1_e5": with_client_betas(fedl2p_row(70, 60, 65, beta=0.2), [0.0, 0.9])}
    c = fedl2p_beta_per_client(res)
    assert c.verdict == verdict, c
    assert f"widest span of the clients' beta {span:.4f} (fedl2p_table3_cifar10c_a0p5), in 2 feature-shift runs" \
        in c.ours, c.ours
    explained = "although its input xi separates the domains (ARI of xi 0.90-1.00)"
    assert (explained in c.reason) == (verdict == "fails"), c.reason


def test_claim_fedl2p_beta_per_client_not_run_without_client_betas():
    res = {"fedl2p_table3_cifar10c_a0p5": fedl2p_row(70, 60, 65, dataset="cifar10c", beta=0.5),
           "fedl2p_table2_a0p1_e5": with_client_betas(fedl2p_row(70, 60, 65, beta=0.2), [0.0, 0.9])}
    assert fedl2p_beta_per_client(res).verdict == "not run"


def with_beta_history(res: dict, betas_per_seed: list[list[float]], kept: list[int]) -> dict:
    """``res`` with FedL2P's per-round history (``client_beta_mean``) and kept round per seed."""
    res["methods"]["FedL2P"]["best_round"] = kept
    res["history"] = {"FedL2P": {f"seed{s}": [{"round": t + 1, "client_beta_mean": b} for t, b in enumerate(bs)]
                                 for s, bs in enumerate(betas_per_seed)}}
    return res


@pytest.mark.parametrize("last, explained", [(0.0, True), (0.6, False)])
def test_claim_fedl2p_beta_names_an_early_kept_round(last, explained):
    """A high label-shift beta kept from an early round, with beta lower by the last round, is said with the
    kept rounds' median and the round-1 / last-round means of the runs' histories."""
    res = {"fedl2p_table3_cifar10c_a0p5": fedl2p_row(70, 60, 65, dataset="cifar10c", beta=0.6),
           "fedl2p_table2_a0p1_e5": with_beta_history(fedl2p_row(70, 60, 65, beta=0.45),
                                                      [[0.5, 0.45, 0.3, last], [0.4, 0.2, 0.1, last]], [2, 2]),
           "fedl2p_table2_a0p5_e5": with_beta_history(fedl2p_row(70, 60, 65, beta=0.35),
                                                      [[0.6, 0.5, 0.35, 0.2, 0.1, last]], [3])}
    c = fedl2p_beta_by_shift(res)
    assert c.verdict == "fails"
    clause = (f"median round 2 of 4 in 3 runs, while beta went from 0.50 in round 1 to {last:.2f} in the last "
              f"round (means)")
    assert (clause in c.reason) == explained, c.reason


@pytest.mark.parametrize("last, explained", [(0.9, True), (0.0, False)])
def test_claim_fedl2p_beta_names_an_early_kept_round_across_domains(last, explained):
    """The other direction: a low feature-shift beta kept early is said only when beta rose by the last round."""
    res = {"fedl2p_table3_cifar10c_a0p5": with_beta_history(fedl2p_row(70, 70, 65, dataset="cifar10c", beta=0.1),
                                                            [[0.4, 0.1, 0.5, last]], [2]),
           "fedl2p_table2_a0p1_e5": fedl2p_row(70, 60, 65, beta=0.05)}
    c = fedl2p_beta_by_shift(res)
    assert c.verdict == "fails"
    clause = "the feature-shift lambda kept is the one of the round with the lowest validation loss"
    assert (clause in c.reason) == explained, c.reason
    if explained:
        assert f"median round 2 of 4 in 1 runs, while beta went from 0.40 in round 1 to {last:.2f}" in c.reason


@pytest.mark.parametrize("fedl2p, verdict", [(80.0, "holds"), (79.5, "holds"), (78.0, "fails")])
def test_claim_fedl2p_matches_best_ft(fedl2p, verdict):
    res = {"fedl2p_table2_a0p1_e5": fedl2p_row(fedl2p, 70.0, 80.0), "fedl2p_table2_a1p0_e5": fedl2p_row(90, 85, 70)}
    c = fedl2p_matches_best_ft(res)
    assert c.verdict == verdict, c
    assert c.paper_value.endswith("in 2/2 rows")  # 76 >= 75 - 1 in both published rows
    if verdict == "fails":  # the worst row, each side beside the paper's number
        assert "worst fedl2p_table2_a0p1_e5: FedL2P 78.00 (paper 76) vs FT (BN G) 80.00 (paper 75)" in c.reason, c
        # the finding: the authors' design, with their files cited (`pflkit.report.findings`)
        assert "are the authors' design" in c.reason and "src/models/weight_net.py:5-36" in c.reason, c.reason
    else:
        assert "authors' design" not in c.reason
    assert fedl2p_matches_best_ft({"fedl2p_x": result({"FedL2P": method(80)})}).verdict == "not run"


@pytest.mark.parametrize("betas, kept, named", [([0.5, 0.4, 0.1, 0.0], 2, True),   # kept early, 0.4 further
                                                 ([0.5, 0.4, 0.1, 0.0], 4, False),  # kept the last round
                                                 ([0.5, 0.4, 0.3, 0.25], 2, False)])  # 0.15 further only
def test_claim_fedl2p_matches_best_ft_names_an_early_kept_round(betas, kept, named):
    """A failed row whose kept round holds a beta further from the best FT's (FT (BN G): 0) than training
    ended with is named with that round and both betas; FT (BN C)'s beta is 1."""
    res = {"fedl2p_table3_digits_a1000": with_beta_history(fedl2p_row(60, 50, 70, dataset="digit_domains"),
                                                           [betas], [kept]),
           "fedl2p_table3_cifar10c_a0p5": with_beta_history(fedl2p_row(60, 70, 50, dataset="cifar10c"),
                                                            [[0.2, 0.5, 0.9]], [1])}
    c = fedl2p_matches_best_ft(res)
    assert c.verdict == "fails"
    cifar = "fedl2p_table3_cifar10c_a0p5 round 1 of 3, beta 0.20 (last 0.90; FT (BN C) 1)"
    digits = f"fedl2p_table3_digits_a1000 round 2 of 4, beta 0.40 (last {betas[-1]:.2f}; FT (BN G) 0)"
    assert f"in {1 + named} of the 2 the lambda kept" in c.reason and cifar in c.reason, c.reason
    assert (digits in c.reason) == named, c.reason


@pytest.mark.parametrize("ari, verdict", [(0.9, "holds"), (0.2, "fails"), (None, "not run")])
def test_claim_lrnet_input_ari(ari, verdict):
    row = fedl2p_row(80, 70, 75, dataset="digit_domains", scheme="domains", ari=ari)
    row["config"]["published_detail"] = resolve("fedl2p_analysis_digits", preset="cpu").published_detail
    c = fedl2p_lrnet_input_ari({"fedl2p_analysis_digits": row})
    assert c.verdict == verdict, c
    assert "0.72" in c.paper_value  # Table 6, DomainNet alpha = 0.5, LRNet input


@pytest.mark.parametrize("ift, verdict", [(70.0, "holds"), (68.0, "holds"), (67.5, "fails"), (None, "not run")])
def test_claim_fedl2p_ift_matches_fomaml(ift, verdict):
    """Table 8: IFT against FOMAML+ per row, within MATCH_TOL; a failure says why the two differ."""
    rows = {"FT (BN C)": method(75.0, 80.97), "FedL2P (FOMAML+)": method(69.0, 83.2)}
    if ift is not None:
        rows["FedL2P (IFT)"] = method(ift, 88.85)
    res = {"fedl2p_table8_digits_a0p1": result(rows), "fedl2p_table8_digits_a1000": result(
        {"FedL2P (FOMAML+)": method(50.0, 52.7), "FedL2P (IFT)": method(51.0, 54.38)})}
    if ift is None:
        res.pop("fedl2p_table8_digits_a1000")
    c = fedl2p_ift_matches_fomaml(res)
    assert c.verdict == verdict, c
    if verdict == "not run":
        return
    assert c.paper_value == "IFT >= FOMAML+ - 1 in 2/2 rows"  # FT (BN C) is no rival: 88.85 vs 83.2, not 80.97
    assert ("the sign flipped" in c.reason) == (verdict == "fails"), c.reason
    if verdict == "fails":
        assert "fedl2p_table8_digits_a0p1: FedL2P (IFT) 67.50 (paper 88.85) vs FedL2P (FOMAML+) 69.00" in c.reason


@pytest.mark.parametrize("pc, verdict", [(88.0, "holds"), (86.5, "holds"), (85.5, "fails"), (None, "not run")])
def test_claim_pfedhn_pc(pc, verdict):
    methods = {"pFedHN": method(87.0, 88.38), "pFedHN-PC": method(pc, 90.08) if pc else method(None, 90.08, "diverged")}
    c = pfedhn_pc_matches({"pfedhn_table1_c10_n50": result(methods)})
    assert c.verdict == verdict
    # a method that ran but diverged is named, not passed over in silence
    assert ("not compared (not ok): pfedhn_table1_c10_n50: pFedHN-PC (diverged)" in c.reason) == (pc is None), c


@pytest.mark.parametrize("late, rising", [(0.63, True), (0.605, False)])
def test_a_failed_claim_says_when_the_method_was_still_learning(late, rising):
    """pFedHN at a cut step budget: validation accuracy still climbing in the last quarter of its rounds
    (mean over seeds) is named as the likely reason; a plateau is not."""
    curve = [(30, 0.13), (150, 0.40), (300, 0.60), (330, 0.59), (360, late), (400, 0.61)]
    res = result({"FedPer": method(84.3, 83.39), "pFedHN": method(60.8, 88.38)})
    res["history"] = {"pFedHN": {f"seed{s}": [{"round": r, "val_acc": a + d} for r, a in curve]
                                 for s, d in ((0, -0.01), (1, 0.01))}}
    c = pfedhn_beats_baselines_n50({"pfedhn_table1_c10_n50": res})
    assert c.verdict == ("budget-limited" if rising else "fails"), c
    assert ("budget-limited (failing, but still learning when training stopped): pfedhn_table1_c10_n50: pFedHN's "
            "validation accuracy still rising when training stopped: best +3.0 pp after round 300 of 400" in c.reason) \
        == rising, c.reason
    res["history"]["pFedHN"] = {"seed0": [{"round": r, "val_acc": a} for r, a in curve[:3]]}  # too few to tell
    c = pfedhn_beats_baselines_n50({"pfedhn_table1_c10_n50": res})
    assert c.verdict == "fails" and "still rising" not in c.reason


def test_claims_name_the_rivals_they_left_out():
    """A diverged rival has no accuracy, so the comparison skips it; the reason says so (and which run)."""
    methods = {"FedAvg": method(50.0, 47.79), "Per-FedAvg (HF)": method(None, 83.03, "diverged"),
               "pFedHN": method(88.0, 88.38), "pFedHN-PC": method(None, 90.08, "incomplete")}
    c = pfedhn_beats_baselines_n50({"pfedhn_table1_c10_n50": result(methods)})
    assert c.verdict == "holds"
    # pFedHN-PC is no baseline of this claim: not named here
    assert c.reason.endswith("; not compared (not ok): pfedhn_table1_c10_n50: Per-FedAvg (HF) (diverged)"), c
    vem = {"pFedPer": method(None, 50.9, "diverged"), "pFedMAP": method(58.0, 58.8), "pFedVEM": method(62.0, 62.6)}
    c = pfedvem_best_under_drift({"pfedvem_omniglot_n50": result(vem)})
    assert c.verdict == "holds" and "pfedvem_omniglot_n50: pFedPer (diverged)" in c.reason, c
    fs = {"FedAvg": method(33.0, 33.54), "LG-FedAvg": method(None, 59.95, "diverged"),
          "FedSelect (0.25)": method(84.0, 84.22)}
    c = fedselect_beats_fedavg_lg({"fedselect_table1_s2": result(fs)})
    assert c.verdict == "holds" and c.reason.endswith("fedselect_table1_s2: LG-FedAvg (diverged)"), c
    ok = {k: method(m["acc_mean"] or 40.0, m["published"]) for k, m in methods.items()}
    assert "not compared" not in pfedhn_beats_baselines_n50({"pfedhn_table1_c10_n50": result(ok)}).reason


@pytest.mark.parametrize("hn, verdict", [(88.0, "holds"), (85.0, "fails")])
def test_claim_pfedhn_beats_baselines_at_50_clients(hn, verdict):
    methods = {"FedAvg": method(50.0, 47.79), "pFedMe": method(86.0, 86.09), "pFedHN": method(hn, 88.38),
               "pFedHN-PC": method(99.0, 90.08)}  # its own variant is no baseline
    res = {"pfedhn_table1_c10_n50": result(methods), "pfedhn_table1_c10_n10": result({"pFedHN": method(1.0)})}
    c = pfedhn_beats_baselines_n50(res)
    assert c.verdict == verdict, c
    assert c.paper_value == "pFedHN > best baseline in 1/1 rows"
    assert pfedhn_beats_baselines_n50({"pfedhn_table1_c10_n10": result(methods)}).verdict == "not run"
    # an experiment not run yet (only its config): no verdict, but the paper's side is known
    stub = {"config": {"published": {k: m["published"] for k, m in methods.items()}}}
    c = pfedhn_beats_baselines_n50({"pfedhn_table1_c10_n50": stub})
    assert c.verdict == "not run" and c.paper_value == "pFedHN > best baseline in 1/1 rows"


@pytest.mark.parametrize("lg, iou, verdict", [(60.0, None, "holds"), (60.0, 0.4, "holds"), (90.0, None, "fails"),
                                              (60.0, 1.0, "fails")])
def test_claim_fedselect(lg, iou, verdict):
    methods = {"FedAvg": method(33.0, 33.54), "LG-FedAvg": method(lg, 59.95),
               "FedSelect (0.25)": method(84.0, 84.22), "FedSelect (0.50)": method(85.0, 85.64),
               "FedSelect/code (0.25)": method(10.0)}  # not a paper row
    res = result(methods)
    if iou is not None:
        res["analysis"] = {k: {"seeds": [{"seed": 0, "mask_iou": iou}]} for k in methods if k.startswith("FedSelect (")}
    c = fedselect_beats_fedavg_lg({"fedselect_table1_s2": res, "fedselect_table1_s4": result({})})
    assert c.verdict == verdict, c
    assert c.paper_value == "FedSelect above in 4/4 comparisons"
    assert ("mask IoU not recorded" in c.reason) == (iou is None)
    if lg > 84.0:  # the largest shortfall, beside the paper's numbers
        assert f"worst fedselect_table1_s2: FedSelect (0.25) 84.00 (paper 84.22) vs LG-FedAvg {lg:.2f} (paper 59.95)" \
            in c.reason, c
    assert fedselect_beats_fedavg_lg({}).verdict == "not run"


@pytest.mark.parametrize("vem, verdict", [(62.0, "holds"), (55.0, "fails")])
def test_claim_pfedvem_best(vem, verdict):
    methods = {"FedAvg": method(52.0, 52.2), "pFedMAP": method(58.0, 58.8), "pFedVEM": method(vem, 62.6),
               "pFedVEM (sampled only)": method(70.0)}  # its own variant is no rival
    c = pfedvem_best_under_drift({"pfedvem_table1_cifar100_n50": result(methods)})
    assert c.verdict == verdict, c
    assert pfedvem_best_under_drift({"pfedhn_x": result(methods)}).verdict == "not run"


def test_check_all_gives_one_verdict_per_claim():
    out = check_all({})
    assert len(out) == len(CLAIMS) and {c.verdict for c in out} == {"not run"}
    assert {c.paper for c in out} == {"fedl2p", "pfedhn", "fedselect", "pfedvem"}


# ----------------------------------------------------------------------------- CLI and notebooks (monkeypatched)

def test_cli_passes_the_selection_prints_the_summary_and_fails_on_a_failure(monkeypatch, tmp_path, capsys):
    seen = {}

    def fake(preset, **kw):
        seen.update(kw, preset=preset)
        return [oc.Outcome("a", oc.DONE, "", 61.0), oc.Outcome("b", oc.SKIPPED, "up to date"),
                oc.Outcome("c", oc.FAILED, "ValueError: boom", 2.0)]

    monkeypatch.setattr(rp, "reproduce", fake)
    argv = ["reproduce", "--preset", "smoke", "--paper", "fedselect", "--only", "s2", "--results", str(tmp_path),
            "--no-notebooks", "--quiet", "--set", "seeds=1"]
    assert main(argv) == 3  # a failed experiment: non-zero exit, the batch still ran to its end
    out = capsys.readouterr().out
    assert "reproduce: 1 done, 1 skipped, 0 not run, 1 failed" in out and "ValueError: boom" in out
    assert "  done     a (1m01s)" in out and " b " not in out  # skipped ones are only counted
    assert seen["preset"] == "smoke" and seen["paper"] == "fedselect" and seen["only"] == "s2"
    assert seen["notebooks"] is False and seen["progress"] is False and seen["overrides"] == ["seeds=1"]
    monkeypatch.setattr(rp, "reproduce", lambda preset, **kw: [oc.Outcome("a", oc.SKIPPED, "up to date")])
    assert main(["reproduce", "--preset", "smoke", "--quiet"]) == 0


def test_notebooks_get_only_the_parameters_they_declare(monkeypatch, tmp_path):
    import papermill

    import pflkit.notebooks.execute as nbs
    from pflkit.notebooks.session import figures_root

    calls = []
    monkeypatch.setattr(papermill, "inspect_notebook", lambda path: {"preset": {}, "results_root": {}})
    monkeypatch.setattr(nbs, "run_notebooks", lambda *a, **kw: calls.append((a, kw)))
    params = {"device": "cpu", "results_root": "/r", "data_root": "/d"}
    stale = tmp_path / "notebooks" / "fedl2p" / "02_label_shift" / "run"  # what its previous execution left
    stale.mkdir(parents=True)
    (tmp_path / "notebooks" / "fedl2p" / "01_method").mkdir()
    o = nr.run_notebook("fedl2p", "02_label_shift.ipynb", "smoke", tmp_path, params)
    assert not stale.parent.exists() and (tmp_path / "notebooks" / "fedl2p" / "01_method").exists()
    assert o.status == "done" and o.name == "notebooks/fedl2p/02_label_shift.ipynb"
    (preset, folder, out, sent), kw = calls[0]
    assert (preset, folder, sent) == ("smoke", "fedl2p", {"results_root": "/r"})
    assert kw == {"only_names": ["02_label_shift.ipynb"], "figures_dir": None}  # smoke: not the repo's figures/
    run_notebook_cpu = nr.run_notebook("fedl2p", "02_label_shift.ipynb", "cpu", tmp_path, params)
    assert run_notebook_cpu.status == "done" and calls[1][1]["figures_dir"] == figures_root()

    class CellError(Exception):  # what papermill raises: the failing cell's exception name and value
        ename, evalue = "DatasetNotFoundError", "dataset 'sun397' was not found under /data"

    def boom(*a, **kw):
        raise CellError("cell 3")

    monkeypatch.setattr(nbs, "run_notebooks", boom)
    o = nr.run_notebook("pfedvem", "x.ipynb", "smoke", tmp_path, params)
    assert (o.status, o.reason) == ("not run", "data missing: dataset 'sun397'")
    CellError.ename, CellError.evalue = "ValueError", "bad\n  value"
    o = nr.run_notebook("pfedvem", "x.ipynb", "smoke", tmp_path, params)
    assert (o.status, o.reason) == ("failed", "ValueError: bad value")


def test_batch_runs_the_selected_papers_notebooks_after_the_experiments(batch, monkeypatch):
    order = []
    monkeypatch.setattr(nr, "_safe_notebook_jobs", lambda outcomes: [("tiny", "a.ipynb"), ("other", "b.ipynb")])
    def run_one(cfg, *a, **kw):
        order.append(cfg.name)
        if cfg.name == "tiny_cifar100":  # stale each batch, yet nothing it writes changes
            return oc.Outcome(cfg.name, oc.NOT_RUN, "data missing: cifar100")
        return oc.Outcome(cfg.name, oc.DONE)

    monkeypatch.setattr(rp, "run_one", run_one)

    def notebook(folder, name, preset, work, params):
        order.append(f"{folder}/{name}")
        assert params["results_root"] == str(Path(batch["kw"]["work_dir"]).resolve())
        return oc.Outcome(f"notebooks/{folder}/{name}", oc.DONE)

    monkeypatch.setattr(rp, "run_notebook", notebook)
    inputs = {"text": "v1"}  # stands for the notebook's text (the real key also hashes the code and results)
    monkeypatch.setattr(nr, "_notebook_key", lambda folder, name, preset, code, compacts:
                        f"{inputs['text']} {folder}/{name} {[(c.name, c.exists() and c.stat().st_mtime_ns) for c in compacts]}")
    kw = {**batch["kw"], "notebooks": True}
    out = by_name(rp.reproduce("smoke", force=True, only="tiny_digits", **kw))
    assert order == ["tiny_digits", "tiny/a.ipynb"]  # only the notebooks of the selected papers, last
    assert out["notebooks/tiny/a.ipynb"].status == "done"
    status = json.loads((batch["kw"]["results_dir"] / "smoke" / "_status.json").read_text())
    assert not any(k.startswith("notebooks") for k in status)
    # second invocation: the experiment and the notebook are up to date, nothing runs
    out = by_name(rp.reproduce("smoke", only="tiny_digits", **kw))
    assert order == ["tiny_digits", "tiny/a.ipynb"] and {o.status for o in out.values()} == {"skipped"}
    inputs["text"] = "v2"  # the notebook changed: it runs again, the experiment does not
    out = by_name(rp.reproduce("smoke", only="tiny_digits", **kw))
    assert order[2:] == ["tiny/a.ipynb"] and out["tiny_digits"].status == "skipped"
    done = json.loads((Path(batch["kw"]["work_dir"]) / "notebooks" / nr.NOTEBOOKS_DONE).read_text())
    assert set(done) == {"tiny/a.ipynb"} and set(done["tiny/a.ipynb"]) == {"key", "seconds"}  # seconds: the estimate
    # the whole paper: tiny_cifar100 is tried again and not run; the notebook's inputs did not change
    out = by_name(rp.reproduce("smoke", **kw))
    assert order[3:] == ["tiny_cifar100"] and out["notebooks/tiny/a.ipynb"].status == "skipped"
    assert out["tiny_cifar100"].status == "not run"


def test_progress_estimate_uses_each_experiments_last_time(tmp_path):
    compact = tmp_path / "x.json"
    assert rp._estimate(compact, {"x": {"seconds": 4.0}}, "x") == 4.0
    assert rp._estimate(compact, {}, "x") is None
    compact.write_text(json.dumps({"timing": {"wall_seconds": 12.5}}))
    assert rp._estimate(compact, {"x": {"seconds": 4.0}}, "x") == 12.5
    compact.write_text(json.dumps({"timing": {"wall_seconds": 12.5, "total_seconds": 300.0}}))  # resumed
    assert rp._estimate(compact, {"x": {"seconds": 4.0}}, "x") == 300.0
    assert oc._duration(3725) == "1h02m05s" and oc._duration(65) == "1m05s" and oc._duration(4) == "4s"
    # a job without a known time weighs the median of the known ones; none known: the bar counts jobs
    assert rp._weights([None, 10.0, 30.0, None]) == [20.0, 10.0, 30.0, 20.0]
    assert rp._weights([None, None]) == [1.0, 1.0] and rp._weights([]) == []


def test_a_table_without_any_number_lists_its_rows_without_an_empty_matrix():
    from pflkit.report.reproduction import table_section

    stub = {"experiment": "x_fig", "paper": "x", "title": "A figure", "config": {"data": {"dataset": "digits"}}}
    text = table_section("Fig. 9", [stub], {"x_fig": {"status": "not run", "reason": "data missing: y"}})
    assert "| experiment" not in text and "`x_fig`: A figure. **Not run** (data missing: y)" in text


def test_notebook_key_follows_the_results_of_its_paper(tmp_path):
    compact = tmp_path / "fedselect_table1_s2.json"
    key = lambda code=None: nr._notebook_key("fedselect", "01_fedselect.ipynb", "smoke", code, [compact])  # noqa: E731
    missing = key()
    compact.write_text(json.dumps({"fingerprint": {"config": "a", "code": None}, "methods": {}}))
    first = key()
    assert first != missing and key() == first
    compact.write_text(json.dumps({"fingerprint": {"config": "b", "code": None}}))
    assert key() != first and key({"source": "x"}) != key()


def test_conclusion_is_written_from_the_verdicts():
    """A notebook's closing paragraph counts and names what holds, fails (with why) and was not run."""
    ok = cl.ClaimResult("a", "fedl2p", "A holds", cl.HOLDS, "p1", "o1", "r1")
    bad = cl.ClaimResult("b", "fedl2p", "B", cl.FAILS, "p2", "o2", "because of x")
    skip = cl.ClaimResult("c", "fedl2p", "C", cl.NOT_RUN, "p3", "-", "needs y")
    unsure = cl.ClaimResult("d", "fedl2p", "D", cl.INCONCLUSIVE, "p4", "o4", "straddles", "x: A - B -0.50 [-2.00, +1.00]")
    text = cl.conclusion([ok, bad, skip, unsure], "cpu")
    assert text.startswith("At the `cpu` preset, on the runs above, 1 of the paper's 4 checked claim(s) hold, 1 fail, "
                           "1 are inconclusive (the 95% interval straddles the claim's margin), 0 are budget-limited "
                           "(failing while the method was still learning) and 1 could not be checked.")
    assert "Fails: B: because of x (ours: o2; paper: p2)." in text and "Not checked here" in text and ": C." in text
    assert "Inconclusive: D: straddles (ours: o4; 95% interval: x: A - B -0.50 [-2.00, +1.00]; paper: p4)." in text
    assert "may hold at `paper`" in text and "may hold" not in cl.conclusion([ok], "paper")
    assert cl.conclusion([], "cpu") == "No claim of this paper is checked by pflkit."


def test_two_jobs_give_the_same_results_as_one(tmp_path):
    """--jobs 2 runs experiments in worker processes: the compact results equal a one-job batch's."""
    catalog = tmp_path / "catalog"
    write_tiny(catalog, "tiny_a")
    write_tiny(catalog, "tiny_b", epochs=2)
    per_client = {}
    for jobs in (1, 2):
        out = rp.reproduce("smoke", results_dir=tmp_path / f"r{jobs}", work_dir=tmp_path / f"w{jobs}",
                           catalog=catalog, notebooks=False, progress=False, jobs=jobs)
        assert sorted((o.name, o.status) for o in out) == [("tiny_a", "done"), ("tiny_b", "done")]
        per_client[jobs] = {n: {k: m["per_client"] for k, m in json.loads(
            (tmp_path / f"r{jobs}" / "smoke" / f"{n}.json").read_text())["methods"].items()} for n in ("tiny_a", "tiny_b")}
    assert per_client[1] == per_client[2]


def test_jobs_must_be_positive():
    with pytest.raises(ValueError, match="jobs must be >= 1, got 0"):
        rp.reproduce("smoke", jobs=0)
    with pytest.raises(SystemExit):
        main(["reproduce", "--jobs", "0"])


def test_the_batch_summary_names_a_finite_blow_up(batch, tmp_path, monkeypatch):
    """`run_one` reports a method that diverged with finite numbers (`pflkit.report.divergence`) in the
    batch's summary, as it does a non-finite one; the compact result keeps the run's own numbers."""
    import pflkit.run.runner

    folder = Path(batch["kw"]["work_dir"]) / "tiny_digits"
    res = json.loads((folder / "results.json").read_text())
    label = "FT (BN C)"
    res["rounds"][label] = {"seed0": [{"round": r + 1, "train_loss": 1.0 if r < 5 else 50.0} for r in range(30)]}
    best = max(m["acc_mean"] for k, m in res["methods"].items() if k != label)
    res["methods"][label]["acc_mean"] = best / 4
    monkeypatch.setattr(pflkit.run.runner, "run_experiment", lambda *a, **kw: res)
    cfg = resolve(batch["catalog"] / "tiny" / "tiny_digits.toml", "smoke")
    out = wf.run_one(cfg, tmp_path / "work", tmp_path / "tiny_digits.json", code=None)
    assert (out.status, out.reason) == (oc.DONE, f"status {label}: diverged")
    assert json.loads((tmp_path / "tiny_digits.json").read_text())["methods"][label]["status"] == "ok"


# ----------------------------------------------------------------------------- stages reused across experiments

def _tiny_pair(catalog: Path, b_epochs: int = 1) -> None:
    """tiny_a: Global + FT (BN C). tiny_b: the same Global, the same fine-tuning under another label
    (with ``b_epochs`` = 1) and FT (BN G), which tiny_a does not have."""
    write_tiny(catalog, "tiny_a")
    b = write_tiny(catalog, "tiny_b", epochs=b_epochs)
    text = b.read_text().replace('[methods."FT (BN C)"]', '[methods."FT C"]').replace('"FT (BN C)" =', '"FT C" =')
    b.write_text(text + '\n[methods."FT (BN G)"]\nalgorithm = "finetune"\nbn = "global"\nepochs = 1\nlr = 0.01\n'
                 'batch_size = 32\n')


def _batch(root: Path, catalog: Path, only: str, **kw) -> dict:
    rp.reproduce("smoke", only=only, results_dir=root / "results", work_dir=root / "work", catalog=catalog,
                 notebooks=False, progress=False, **kw)
    return json.loads((root / "results" / "smoke" / f"{only}.json").read_text())


def _numbers(res: dict) -> dict:
    return {k: (m["status"], m["per_client"], m["acc_mean"]) for k, m in res["methods"].items()}


def test_a_stage_another_run_finished_with_the_same_settings_is_taken_not_trained(tmp_path):
    catalog = tmp_path / "catalog"
    _tiny_pair(catalog)
    _batch(tmp_path / "shared", catalog, "tiny_a")
    b = _batch(tmp_path / "shared", catalog, "tiny_b")
    assert b["reused"] == {"Global": {"from": "tiny_a", "seeds": [0]}, "FT C": {"from": "tiny_a", "seeds": [0]}}
    fresh = _batch(tmp_path / "alone", catalog, "tiny_b", reuse=False)
    assert "reused" not in fresh
    assert _numbers(b) == _numbers(fresh)  # client for client: the key holds everything a stage depends on
    untimed = lambda h: {k: {s: [{f: v for f, v in r.items() if f != "seconds"} for r in rows]  # noqa: E731
                             for s, rows in seeds.items()} for k, seeds in h.items()}
    assert untimed(b["history"]) == untimed(fresh["history"])
    from pflkit.report.reproduction import build_report
    assert "Taken from `tiny_a`'s run (same settings, data and code, not trained again): `Global`, `FT C`." in \
        build_report(tmp_path / "shared" / "results", catalog=catalog)


def test_a_stage_is_taken_only_with_the_same_settings_code_and_data(tmp_path, monkeypatch):
    catalog = tmp_path / "catalog"
    _tiny_pair(catalog, b_epochs=2)  # tiny_b's fine-tuning differs: only the pretraining is the same
    _batch(tmp_path, catalog, "tiny_a")
    assert set(_batch(tmp_path, catalog, "tiny_b")["reused"]) == {"Global"}
    donor = tmp_path / "work" / "tiny_a"
    # a donor made by other code gives the stages whose behaviour (micro-run) is the same, and no other
    marker = json.loads((donor / wf.MARKER).read_text())
    other = {"pflkit": "0", "source": "other"}
    (donor / wf.MARKER).write_text(json.dumps({**marker, "code": other}))
    shutil.rmtree(tmp_path / "work" / "tiny_b")  # tiny_b starts afresh (force: its result is up to date)
    assert set(_batch(tmp_path, catalog, "tiny_b", force=True)["reused"]) == {"Global"}
    changed = {**marker["stages"], "Global": "0" * 16}
    (donor / wf.MARKER).write_text(json.dumps({**marker, "code": other, "stages": changed}))
    shutil.rmtree(tmp_path / "work" / "tiny_b")
    assert "reused" not in _batch(tmp_path, catalog, "tiny_b", force=True)
    (donor / wf.MARKER).write_text(json.dumps({**marker, "code": other, "stages": None}))
    shutil.rmtree(tmp_path / "work" / "tiny_b")
    assert "reused" not in _batch(tmp_path, catalog, "tiny_b", force=True)  # no fingerprints: nothing
    (donor / wf.MARKER).write_text(json.dumps(marker))
    # a donor that read other data files: the runner refuses the seeded folder and the run starts over
    run = json.loads((donor / "run.json").read_text())
    run["fingerprint"]["data"]["files"] = [{"bytes": 1, "sha256": "0" * 64}]
    (donor / "run.json").write_text(json.dumps(run))
    shutil.rmtree(tmp_path / "work" / "tiny_b")
    import pflkit.batch.reuse

    seeded, seed = [], pflkit.batch.reuse.seed_from_donors
    monkeypatch.setattr(pflkit.batch.reuse, "seed_from_donors", lambda *a, **kw: seeded.append(seed(*a, **kw)) or seeded[-1])
    again = _batch(tmp_path, catalog, "tiny_b", force=True)
    assert list(seeded[0]) == ["Global"] and "reused" not in again  # seeded, then refused by the runner
    assert _numbers(again) == _numbers(_batch(tmp_path / "alone", catalog, "tiny_b", reuse=False))


def test_one_experiments_stages_trained_in_two_part_runs_are_put_together(tmp_path):
    """Two part runs of one experiment (each with some of its methods: trained side by side) seed its own
    folder, each stage from the part that has it, and its numbers are the fresh run's, client for client."""
    catalog = tmp_path / "catalog"
    _tiny_pair(catalog)  # tiny_b: Global, FT C, FT (BN G)
    text = (catalog / "tiny" / "tiny_b.toml").read_text()
    part = text.replace('[methods."FT C"]', '[methods."FT B"]').replace('"FT C" =', '"FT B" =')
    (catalog / "tiny" / "tiny_part2.toml").write_text(part.split('[methods."FT B"]')[0] + '[methods."FT (BN G)"]'
                                                      + part.split('[methods."FT (BN G)"]')[1])
    _batch(tmp_path / "shared", catalog, "tiny_a")  # part 1: Global and the fine-tuning FT C is
    _batch(tmp_path / "shared", catalog, "tiny_part2")  # part 2: Global and FT (BN G)
    whole = _batch(tmp_path / "shared", catalog, "tiny_b")
    assert whole["reused"] == {"Global": {"from": "tiny_a", "seeds": [0]}, "FT C": {"from": "tiny_a", "seeds": [0]},
                               "FT (BN G)": {"from": "tiny_part2", "seeds": [0]}}
    assert _numbers(whole) == _numbers(_batch(tmp_path / "alone", catalog, "tiny_b", reuse=False))
    # a part that read other data files gives nothing, the rest still comes from the first part
    run = json.loads((tmp_path / "shared" / "work" / "tiny_part2" / "run.json").read_text())
    run["fingerprint"]["data"]["files"] = [{"bytes": 1, "sha256": "0" * 64}]
    (tmp_path / "shared" / "work" / "tiny_part2" / "run.json").write_text(json.dumps(run))
    shutil.rmtree(tmp_path / "shared" / "work" / "tiny_b")
    again = _batch(tmp_path / "shared", catalog, "tiny_b", force=True)
    assert set(again["reused"]) == {"Global", "FT C"} and _numbers(again) == _numbers(whole)


def test_stage_keys_follow_what_a_stage_starts_from():
    from pflkit.batch.reuse import stage_keys

    def fp(pre_lr=0.05, fedavg_lr=0.1, files="a"):
        methods = [{"label": "FedAvg", "algorithm": "fedavg", "lr": fedavg_lr},
                   {"label": "FT", "algorithm": "finetune", "lr": 0.01},
                   {"label": "LG", "algorithm": "lgfedavg", "lr": 0.01, "start_from": "FedAvg"}]
        return {"config": {"data": {"dataset": "digits"}, "model": {"name": "m"},
                           "pretrain": {"label": "Global", "algorithm": "fedavg", "lr": pre_lr}, "methods": methods},
                "data": {"name": "digits", "files": [{"bytes": 1, "sha256": files}]}}

    base = stage_keys(fp())
    renamed = fp()
    renamed["config"]["methods"][1]["label"] = "FT (BN C)"
    assert stage_keys(renamed)["FT (BN C)"] == base["FT"]  # a label is a name, not a setting
    other_pre = stage_keys(fp(pre_lr=0.1))  # the pretrained model changes: so does what starts from it
    assert (other_pre["Global"], other_pre["FT"]) != (base["Global"], base["FT"])
    assert (other_pre["FedAvg"], other_pre["LG"]) == (base["FedAvg"], base["LG"])  # they do not start from it
    other_up = stage_keys(fp(fedavg_lr=0.2))  # LG starts from FedAvg's model
    assert other_up["LG"] != base["LG"] and other_up["FT"] == base["FT"]
    assert set(stage_keys(fp(files="b")).values()).isdisjoint(base.values())  # other data files: nothing shared


def test_other_code_that_computes_the_same_stales_nothing_and_a_changed_stage_reruns_alone(tmp_path, monkeypatch):
    """`pflkit.batch.behaviour`: with another run-code digest, a result whose stages' micro-runs are unchanged is up
    to date; when one stage's behaviour changes, the batch reruns that stage only, resuming its work folder."""
    import pflkit.batch.behaviour as bh

    catalog = tmp_path / "catalog"
    write_tiny(catalog, "tiny_a")
    first = _batch(tmp_path, catalog, "tiny_a")
    assert set(first["fingerprint"]["stages"]) == {"Global", "FT (BN C)"}
    kw = dict(only="tiny_a", results_dir=tmp_path / "results", work_dir=tmp_path / "work", catalog=catalog,
              notebooks=False, progress=False)
    monkeypatch.setattr(rp, "code_version", lambda package=None: {"pflkit": "0", "source": "f" * 16})
    assert by_name(rp.reproduce("smoke", **kw))["tiny_a"].status == oc.SKIPPED
    seed = tmp_path / "work" / "tiny_a" / "seed0"
    before = {p.name: p.stat().st_mtime_ns for p in seed.glob("*.json")}
    real = bh.BehaviourCache.behaviour
    monkeypatch.setattr(bh.BehaviourCache, "behaviour", lambda self, *a, **k: {
        **real(self, *a, **k), "FT (BN C)": "0" * 16})
    out = by_name(rp.reproduce("smoke", **kw))["tiny_a"]
    assert out.status == oc.DONE
    after = {p.name: p.stat().st_mtime_ns for p in seed.glob("*.json")}
    assert after["global.json"] == before["global.json"] and after["ft-bn-c.json"] != before["ft-bn-c.json"]
    again = json.loads((tmp_path / "results" / "smoke" / "tiny_a.json").read_text())
    assert _numbers(again) == _numbers(first)
    assert again["fingerprint"]["stages"]["Global"] == first["fingerprint"]["stages"]["Global"]
    assert again["fingerprint"]["stages"]["FT (BN C)"] != first["fingerprint"]["stages"]["FT (BN C)"]
