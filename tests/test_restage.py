"""`pflkit reproduce --stages`: rerun some stages of a committed result, kept only when their upstream reproduces.

The batch tests run a tiny catalog (sklearn digits, 3 clients, one round, smoke sizes): a pretraining stage
and two fine-tuning stages that start from it, so they take seconds.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pflkit.batch import outcomes as oc
from pflkit.batch import selection as sel
from pflkit.batch import versions as ver
from pflkit.batch import reproduce as rp
from pflkit.batch.behaviour import BehaviourCache
from pflkit.cli import main
from pflkit.report.compact import config_digest
from pflkit.report.reproduction import build_report
from pflkit.batch.restage import (AVX2_PATHS, _run_group, other_settings_match, restage, retry_on_avx2,
                            stage_chain, upstream_mismatch, worker_paths)

from helpers_catalog import tiny_toml, write_toml  # noqa: E402

def write_catalog(folder: Path, rounds: int = 1, epochs: int = 1) -> Path:
    write_toml(folder / "tiny" / "tiny_ft.toml", tiny_toml(rounds=rounds, ft={"client": epochs, "global": 1}))
    return folder


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """One batch over the tiny catalog: the committed result every test starts from (a copy of its text)."""
    root = tmp_path_factory.mktemp("restage")
    catalog = write_catalog(root / "catalog")
    kw = dict(results_dir=root / "results", work_dir=root / "work", catalog=catalog, notebooks=False, progress=False)
    (outcome,) = rp.reproduce("smoke", **kw)
    assert outcome.status == oc.DONE, outcome
    return (root / "results" / "smoke" / "tiny_ft.json").read_text()


@pytest.fixture
def setup(committed, tmp_path):
    """A fresh results folder holding the committed result, and the kwargs `restage` needs."""
    results = tmp_path / "results"
    (results / "smoke").mkdir(parents=True)
    path = results / "smoke" / "tiny_ft.json"
    path.write_text(committed)
    kw = dict(results_dir=results, work_dir=tmp_path / "work", catalog=write_catalog(tmp_path / "catalog"))
    return path, kw


def _edit(path: Path, change) -> dict:
    res = json.loads(path.read_text())
    change(res)
    path.write_text(json.dumps(res))
    return res


def _stale(res: dict, label: str = "FT (BN C)") -> None:
    """The committed result as an older FT (BN C) left it: other numbers, another fingerprint."""
    res["methods"][label]["per_client"] = [[0.0 for _ in seed] for seed in res["methods"][label]["per_client"]]
    res["methods"][label]["acc_mean"] = 0.0
    res["fingerprint"]["stages"][label] = "an older fingerprint"


def test_stage_chain_follows_every_upstream_in_file_order():
    ups = {"Global": None, "FT (BN C)": "Global", "FT (BN G)": "Global", "L2P": "FT (BN G)", "Local": None}
    assert stage_chain(ups, ["L2P"]) == ["Global", "FT (BN G)", "L2P"]
    assert stage_chain(ups, ["Local", "FT (BN C)"]) == ["Global", "FT (BN C)", "Local"]
    with pytest.raises(ValueError, match="FT \\(BN X\\)"):
        stage_chain(ups, ["FT (BN X)"])


def test_upstream_mismatch_ignores_timings_and_names_what_differs():
    def result(acc, loss, seconds):
        return {"methods": {"Global": {"acc_mean": acc, "per_client": [[acc, acc]]}},
                "history": {"Global": {"seed0": [{"round": 1, "train_loss": loss, "seconds": seconds}]}}}
    assert upstream_mismatch(result(50.0, 1.5, 3.0), result(50.0, 1.5, 9.0), ["Global"]) == ""
    assert upstream_mismatch(result(50.0, 1.5, 3.0), result(51.0, 1.5, 3.0), ["Global"]) == "Global: 50.00 -> 51.00"
    assert "another training history" in upstream_mismatch(result(50.0, 1.5, 3.0), result(50.0, 1.4, 3.0), ["Global"])


def test_other_settings_may_differ_only_in_the_stages_rerun(setup):
    path, _ = setup
    config = json.loads(path.read_text())["config"]
    mine = json.loads(json.dumps(config))
    mine["methods"][0]["epochs"] += 1  # FT (BN C)
    assert mine["methods"][0]["label"] == "FT (BN C)"
    assert other_settings_match(config, mine, ["FT (BN C)"])
    assert not other_settings_match(config, mine, ["FT (BN G)"])
    mine["pretrain"]["rounds"] += 1
    assert not other_settings_match(config, mine, ["FT (BN C)"])


def test_a_stale_stage_is_rerun_and_every_other_stage_kept(setup):
    path, kw = setup
    fresh = json.loads(path.read_text())
    old = _edit(path, _stale)
    (outcome,) = restage(["FT (BN C)"], "smoke", **kw)
    assert outcome.status == oc.DONE, outcome
    assert "FT (BN C) 0.00 ->" in outcome.reason and "Global reproduced" in outcome.reason
    new = json.loads(path.read_text())
    # the rerun stage is what a whole run gives (every draw is seeded): it started from the same Global
    assert new["methods"]["FT (BN C)"]["per_client"] == fresh["methods"]["FT (BN C)"]["per_client"]
    assert new["methods"]["Global"] == old["methods"]["Global"]
    assert new["methods"]["FT (BN G)"] == old["methods"]["FT (BN G)"]
    assert new["history"]["FT (BN G)"] == old["history"]["FT (BN G)"]
    assert new["restaged"][-1]["stages"] == ["FT (BN C)"]
    assert new["restaged"][-1]["upstream_reproduced"] == ["Global"]
    # the batch now takes it as up to date, and a second restage skips it
    code = ver.code_version()
    outcomes, todo = sel.plan("smoke", sel.select(root=kw["catalog"]), kw["results_dir"], [], code, False,
                             BehaviourCache(kw["results_dir"], code))
    assert not todo and outcomes[0].reason == "up to date"
    (again,) = restage(["FT (BN C)"], "smoke", **kw)
    assert again.status == oc.SKIPPED
    assert "Rerun alone" in build_report(kw["results_dir"], catalog=kw["catalog"])


def test_an_upstream_that_does_not_reproduce_leaves_the_result_untouched(setup):
    path, kw = setup

    def other_global(res):
        _stale(res)
        res["methods"]["Global"]["per_client"][0][0] += 1.0
    _edit(path, other_global)
    before = path.read_bytes()
    (outcome,) = restage(["FT (BN C)"], "smoke", **kw)
    assert outcome.status == oc.FAILED and outcome.reason.startswith("Global: ")
    assert "rerun it whole" in outcome.reason
    assert path.read_bytes() == before


def test_a_changed_setting_of_the_stage_rerun_is_taken_any_other_refused(setup, tmp_path):
    path, kw = setup
    write_catalog(kw["catalog"], epochs=2)  # FT (BN C)'s own setting changed
    (outcome,) = restage(["FT (BN C)"], "smoke", **kw)
    assert outcome.status == oc.DONE, outcome
    res = json.loads(path.read_text())
    assert res["config"]["methods"][0]["epochs"] == 2
    assert config_digest(res["config"]) == res["fingerprint"]["config"]
    write_catalog(kw["catalog"], rounds=2, epochs=2)  # the upstream's setting changed: the row must be rerun whole
    before = path.read_bytes()
    (outcome,) = restage(["FT (BN C)"], "smoke", force=True, **kw)
    assert outcome.status == oc.NOT_RUN and "rerun it whole" in outcome.reason
    assert path.read_bytes() == before


def test_a_run_that_raises_is_one_failed_row_and_leaves_the_result(setup, monkeypatch):
    import pflkit.run.runner
    from pflkit.run.experiments import resolve
    from pflkit.batch.restage import restage_one

    path, kw = setup
    _edit(path, _stale)
    before = path.read_bytes()

    def broken(*args, **kwargs):
        raise RuntimeError("a stage crashed")
    monkeypatch.setattr(pflkit.run.runner, "run_experiment", broken)
    cfg = resolve(kw["catalog"] / "tiny" / "tiny_ft.toml", "smoke")
    outcome = restage_one(cfg, kw["work_dir"] / "tiny_ft", path, ["FT (BN C)"], code=ver.code_version())
    assert outcome.status == oc.FAILED and "a stage crashed" in outcome.reason
    assert path.read_bytes() == before


def test_a_stage_no_result_has_is_refused_before_any_work(setup, capsys):
    _, kw = setup
    with pytest.raises(ValueError, match="FT \\(BN Z\\)"):
        restage(["FT (BN Z)"], "smoke", **kw)
    # the command line: one line naming the label, nothing run (the package's catalog, an empty results folder)
    assert main(["reproduce", "--preset", "smoke", "--stages", "FT (BN Z)", "--only", "demo",
                 "--results", str(kw["results_dir"]), "--work", str(kw["work_dir"])]) == 2
    assert "FT (BN Z)" in capsys.readouterr().err
    assert not Path(kw["work_dir"]).exists()


def test_a_row_made_with_avx2_is_rerun_on_avx2_paths_only_where_the_cpu_has_more():
    avx2 = {"environment": {"cpu_capability": "AVX2"}}
    assert dict(worker_paths(avx2, "AVX512")) == AVX2_PATHS
    assert worker_paths(avx2, "AVX2") == ()
    assert worker_paths({"environment": {"cpu_capability": "AVX512"}}, "AVX512") == ()
    assert worker_paths({"environment": {}}, "AVX512") == ()


def test_only_an_unrecorded_row_that_did_not_reproduce_gets_a_try_on_avx2():
    failed = oc.Outcome("x", oc.FAILED, "Global: 1.00 -> 2.00 did not reproduce, so the committed row is kept")
    assert retry_on_avx2(failed, True, "AVX512")
    assert not retry_on_avx2(failed, False, "AVX512")  # its record says what it was made on
    assert not retry_on_avx2(failed, True, "AVX2")  # nothing other to try here
    assert not retry_on_avx2(oc.Outcome("x", oc.FAILED, "RuntimeError: out of memory"), True, "AVX512")
    assert not retry_on_avx2(oc.Outcome("x", oc.DONE, "FT (BN C) 1.00 -> 2.00 (Global reproduced)"), True, "AVX512")


def _capability() -> str:
    import torch

    return torch.backends.cpu.get_cpu_capability()


@pytest.mark.skipif(not _capability().startswith("AVX"), reason="an x86 CPU with AVX2 or more")
def test_workers_start_on_the_avx2_paths_and_this_process_keeps_its_own():
    mine, before = _capability(), {k: os.environ.get(k) for k in AVX2_PATHS}
    (theirs,) = _run_group(tuple(sorted(AVX2_PATHS.items())), [(_capability, "probe")], 1)
    assert theirs == "AVX2"
    assert _capability() == mine
    assert {k: os.environ.get(k) for k in AVX2_PATHS} == before  # put back as it was
