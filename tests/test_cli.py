import json

import pytest

from pflkit.cli import main


def test_list_shows_the_demo(capsys):
    assert main(["list"]) == 0
    assert "demo" in capsys.readouterr().out


def test_run_demo_smoke_writes_results(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "demo", "--preset", "smoke", "--out", str(out), "--quiet"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res) >= {"config", "status", "methods", "rounds", "timing", "version"}
    assert res["status"] == "ok" and res["config"]["preset"] == "smoke"
    assert set(res["methods"]) >= {"Global", "FT (BN C)", "FT (BN G)", "FT (BN I)"}
    for m in res["methods"].values():
        assert 0 <= m["acc_mean"] <= 100 and len(m["per_client"][0]) == res["config"]["data"]["num_clients"]
    assert (out / "methods.png").exists() and (out / "seed0" / "federation.npz").exists()
    assert "FT (BN C)" in capsys.readouterr().out


def test_resumed_run_reports_the_same_numbers(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    args = ["run", "demo", "--preset", "smoke", "--quiet", "--set", "pretrain.rounds=4"]
    assert main(args + ["--out", str(a)]) == 0
    assert main(args + ["--out", str(b)]) == 0
    # simulate a run stopped after pretraining: drop a finished method stage, then resume
    (b / "seed0" / "ft-bn-g.json").unlink()
    assert main(args + ["--out", str(b), "--resume"]) == 0
    ra, rb = (json.loads((p / "results.json").read_text()) for p in (a, b))
    assert ra["methods"] == rb["methods"]


@pytest.mark.parametrize("argv, needle", [
    (["run", "demo", "--set", "pretrain.rounds=-1"], "rounds"),
    (["run", "demo", "--set", "nonsense"], "key=value"),
    (["run", "nope"], "not found"),
])
def test_bad_input_is_a_clear_error(argv, needle, capsys):
    assert main(argv + ["--quiet"]) == 2
    assert needle in capsys.readouterr().err


def test_diverged_run_is_marked_not_crashed(tmp_path):
    out = tmp_path / "nan"
    code = main(["run", "demo", "--preset", "smoke", "--quiet", "--out", str(out), "--set", "pretrain.lr=1e38",
                 "--set", "pretrain.rounds=3"])
    assert code == 3
    text = (out / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    res = json.loads(text)
    assert res["status"] == "diverged"
    assert res["methods"]["Global"]["status"] == "diverged" and res["methods"]["Global"]["acc_mean"] is None
    assert res["methods"]["FT (BN C)"]["status"] == "diverged"  # nothing to fine-tune


def test_a_finite_blow_up_exits_like_a_nan(tmp_path, monkeypatch, capsys):
    """A run whose numbers stay finite while its training loss explodes and its model is broken
    (`pflkit.report.divergence`) is reported `diverged` with exit status 3, like a non-finite one."""
    import pflkit.run.runner

    out = tmp_path / "run"
    assert main(["run", "demo", "--preset", "smoke", "--quiet", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    first = res["rounds"]["Global"]["seed0"][0]
    res["rounds"]["Global"]["seed0"] = [{**first, "round": r + 1, "train_loss": 1.5 * (1 if r < 5 else 100)}
                                        for r in range(30)]
    res["methods"]["Global"]["acc_mean"] = 10.0  # under half of the best method's
    monkeypatch.setattr(pflkit.run.runner, "run_experiment", lambda *a, **k: res)
    capsys.readouterr()
    assert main(["run", "demo", "--preset", "smoke", "--quiet", "--out", str(out), "--resume"]) == 3
    captured = capsys.readouterr()
    assert "Global: finite divergence: seed 0: training loss 1.5" in captured.err
    assert "diverged" in next(line for line in captured.out.splitlines() if "Global" in line)


def test_engine_choice_is_recorded_and_a_resume_may_change_it(tmp_path, one_intra_op_thread):
    """The engine does not change the numbers: not fingerprinted, so --resume may switch it.

    At one intra-op thread (the threads engine's), so that the comparison can be exact.
    """
    a, b = tmp_path / "a", tmp_path / "b"
    args = ["run", "demo", "--preset", "smoke", "--quiet", "--set", "pretrain.rounds=2"]
    assert main(args + ["--out", str(a), "--engine", "threads"]) == 0
    assert main(args + ["--out", str(b), "--engine", "sequential"]) == 0
    (b / "seed0" / "ft-bn-g.json").unlink()
    assert main(args + ["--out", str(b), "--resume", "--engine", "threads"]) == 0
    ra, rb = (json.loads((p / "results.json").read_text()) for p in (a, b))
    assert ra["environment"]["engine"] == "threads" and ra["engine"] == "pflkit"
    assert ra["environment"]["engine_used"]["Global"] == "threads"
    assert rb["environment"]["engine_used"]["Global"] == "sequential"  # read back from the first run's record
    assert ra["methods"] == rb["methods"]


def test_a_bad_engine_is_refused_before_any_work(tmp_path, capsys):
    from pflkit.config import ConfigError
    from pflkit.run.experiments import resolve
    from pflkit.run.runner import run_experiment

    with pytest.raises(ConfigError, match=r"^engine='vmap': expected one of auto, sequential, threads, vectorized$"):
        run_experiment(resolve("demo", "smoke"), tmp_path / "out", engine="vmap")
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        main(["run", "demo", "--engine", "vmap"])
    assert "invalid choice: 'vmap'" in capsys.readouterr().err


def test_the_quickstart_twice_shows_the_finished_run(tmp_path, monkeypatch, capsys):
    """`pflkit demo --out demo && pflkit demo && pflkit demo`: three exits 0 in the folder holding `demo/`,
    the third printing the second's results; other settings in a finished run's folder are still refused."""
    monkeypatch.chdir(tmp_path)
    args = ["demo", "--preset", "smoke", "--quiet", "--set", "pretrain.rounds=2"]
    assert main(args + ["--out", "demo"]) == 0
    capsys.readouterr()
    assert main(args) == 0
    second = capsys.readouterr().out
    [out] = (tmp_path / "runs").iterdir()
    stored = (out / "results.json").read_bytes()
    assert main(args) == 0
    third = capsys.readouterr().out
    assert (out / "results.json").read_bytes() == stored  # shown, not run again
    table = second.split("results:")[0]
    assert "FT (BN C)" in table and third.startswith(table)
    assert "finished run" in third and "--overwrite" in third and f"runs/{out.name}/results.json" in third
    assert main(args + ["--out", str(out), "--seed", "5"]) == 2
    assert "already holds a run" in capsys.readouterr().err
