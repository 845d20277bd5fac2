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
