"""Numbers you can trust: bad inputs and faults, each a named case.

Every case reproduces a way a run could report a number that is not what it says (mixed
configurations, code in checkpoints, NaN scores, missing clients, silent divergence, runs
overwriting each other, unknown data) or fail late with a traceback, and pins the new behaviour.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pflkit.cli import default_out, main
from pflkit.run.experiments import resolve
from pflkit.fl.loop import _score, missing_clients, nonfinite_paths
from pflkit.io import CheckpointError, load_torch, locked_folder, save_torch
from pflkit.report.tables import format_table

SMOKE = ["--preset", "smoke", "--quiet"]

# the demo cut to what these cases need (seconds per run): FedAvg pretraining, then one fine-tuning
TINY = """
[experiment]
title = "digits, Dir(0.1): FedAvg then FT (BN C)"
[data]
dataset = "digits"
num_clients = 6
[data.partition]
alpha = 0.1
[model]
name = "digits_cnn"
[pretrain]
label = "Global"
algorithm = "fedavg"
rounds = 3
fraction = 0.5
lr = 0.05
momentum = 0.9
batch_size = 16
[methods."FT (BN C)"]
algorithm = "finetune"
bn = "client"
epochs = 1
lr = 0.01
batch_size = 16
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("experiments") / "tiny.toml"
    path.write_text(TINY)
    return str(path)


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.fixture
def demo(tiny):
    """argv for a run of the tiny experiment into ``out`` (the CLI's ``run`` command)."""
    return lambda out, *extra: ["run", tiny, *SMOKE, "--out", str(out), *extra]


def read(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


# ------------------------------------------------------------------ 1. resume never mixes configurations


def test_resume_with_other_settings_is_refused_naming_the_keys(tmp_path, capsys, demo):
    out = tmp_path / "run"
    assert run_cli(capsys, *demo(out, "--set", "pretrain.rounds=2"))[0] == 0
    first = read(out)
    code, err = run_cli(capsys, *demo(out, "--set", "pretrain.rounds=2", "--set", "data.partition.alpha=100",
                                     "--set", "methods.*.lr=0.5", "--resume"))
    assert code == 2
    assert "data.partition.alpha (0.1 -> 100" in err and ".lr (" in err and "--overwrite" in err
    assert read(out) == first  # nothing was touched
    # the explicit way to start over
    assert run_cli(capsys, *demo(out, "--set", "pretrain.rounds=2", "--set", "data.partition.alpha=100",
                                 "--overwrite"))[0] == 0
    assert read(out)["config"]["data"]["partition"]["alpha"] == 100


def test_stopped_run_resumed_with_other_client_count_is_refused(tmp_path, capsys, demo):
    out = tmp_path / "run"
    assert run_cli(capsys, *demo(out, "--set", "pretrain.rounds=3"))[0] == 0
    (out / "seed0" / "global.json").unlink()  # as if stopped inside the pretraining stage
    code, err = run_cli(capsys, *demo(out, "--set", "pretrain.rounds=3", "--set", "data.num_clients=12",
                                      "--resume"))
    assert code == 2 and "data.num_clients (6 -> 12)" in err


def test_resume_with_the_same_settings_finishes_the_run(tmp_path, capsys, demo):
    a, b = tmp_path / "a", tmp_path / "b"
    args = ("--set", "pretrain.rounds=3")
    assert run_cli(capsys, *demo(a, *args))[0] == 0
    assert run_cli(capsys, *demo(b, *args))[0] == 0
    (b / "seed0" / "ft-bn-c.json").unlink()
    assert run_cli(capsys, *demo(b, *args, "--resume"))[0] == 0
    assert read(a)["methods"] == read(b)["methods"]


# ------------------------------------------------------------------ 2. checkpoints never execute code


class _Payload:
    """Unpickling this object would create ``marker``: what a crafted checkpoint could do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("victim", ["global.ckpt", "global.weights.pt"])
def test_crafted_checkpoint_is_refused_without_running_its_payload(tmp_path, capsys, victim, demo):
    out, marker = tmp_path / "run", tmp_path / "pwned"
    assert run_cli(capsys, *demo(out, "--set", "pretrain.rounds=2"))[0] == 0
    if victim == "global.ckpt":  # an unfinished stage whose checkpoint is resumed
        (out / "seed0" / "global.json").unlink()
    with open(out / "seed0" / victim, "wb") as f:
        pickle.dump({"round": 1, "state": _Payload(marker)}, f)
    code, err = run_cli(capsys, *demo(out, "--set", "pretrain.rounds=2", "--resume"))
    assert code == 2 and "refusing to load" in err and victim in err
    assert not marker.exists()


def test_checkpoints_of_tensors_and_plain_values_load(tmp_path):
    state = {"w": torch.randn(3), "n": 4, "x": 0.5, "hist": [{"round": 1}], "none": None, "t": (1, 2)}
    save_torch(tmp_path / "s.ckpt", state)
    back = load_torch(tmp_path / "s.ckpt")
    assert torch.equal(back["w"], state["w"]) and back["hist"] == [{"round": 1}] and back["t"] == (1, 2)
    with open(tmp_path / "bad.ckpt", "wb") as f:
        f.write(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="bad.ckpt"):
        load_torch(tmp_path / "bad.ckpt")


# ------------------------------------------------------------------ 3. keep-best never compares NaN


def test_keep_best_without_a_validation_split_is_rejected(capsys):
    code, err = run_cli(capsys, "demo", *SMOKE, "--set", "data.val_fraction=0")
    assert code == 2 and "data.val_fraction" in err and "keep_best" in err


def test_nan_validation_scores_are_never_selected():
    from pflkit.fl.algorithm import FLConfig

    cfg = FLConfig(select="val_acc")
    assert _score(cfg, {"acc": math.nan, "loss": math.nan}, []) is None
    assert _score(cfg, {"acc": 0.5, "loss": 1.0}, []) == 0.5
    assert _score(FLConfig(select="val_loss"), {"acc": 0.5, "loss": math.nan}, []) is None


# ------------------------------------------------------------------ 4. missing accuracies are not ok


def test_clients_without_test_samples_fail_before_training(tmp_path, capsys, demo):
    t0 = time.perf_counter()
    code, err = run_cli(capsys, *demo(tmp_path / "run", "--set", "data.num_clients=1000"))
    assert code == 2 and "data.num_clients=1000" in err and "no test samples" in err
    assert not (tmp_path / "run" / "seed0" / "global.json").exists() and time.perf_counter() - t0 < 30


def test_missing_clients_names_each_client_and_why():
    per_client = {0: {"acc": 0.5, "n": 3}, 1: {"acc": math.nan, "n": 0}, 2: {"acc": math.nan, "n": 4}}
    assert missing_clients(per_client) == [{"client": 1, "reason": "no test samples"},
                                           {"client": 2, "reason": "test accuracy is nan"}]


def test_a_method_with_a_client_without_accuracy_is_incomplete(tmp_path, capsys, monkeypatch, demo):
    """One client's evaluation yields NaN: the method is `incomplete`, names the client, and the CLI fails."""
    from pflkit.algorithms import ALGORITHMS

    algo = ALGORITHMS["finetune"]
    real = algo.evaluate

    def evaluate(state, client, client_state, cfg, env, split):
        m = real(state, client, client_state, cfg, env, split)
        return {**m, "acc": math.nan} if split == "test" and client.id == 2 else m

    monkeypatch.setitem(ALGORITHMS, "finetune", __import__("dataclasses").replace(algo, evaluate=evaluate))
    code = main(demo(tmp_path / "run", "--set", "pretrain.rounds=2"))
    res = read(tmp_path / "run")
    assert code == 3 and res["status"] == "incomplete"
    ft = res["methods"]["FT (BN C)"]
    assert ft["status"] == "incomplete" and ft["acc_mean"] is None
    assert ft["missing"] == [{"seed": 0, "client": 2, "reason": "test accuracy is nan"}]
    assert res["methods"]["Global"]["status"] == "ok"
    assert "incomplete" in format_table(res) and "diverge" not in format_table(res)


# ------------------------------------------------------------------ 5. divergence in weights and buffers


def test_infinite_batch_norm_statistics_mark_the_stage_diverged(tmp_path, capsys, demo):
    code, err = run_cli(capsys, *demo(tmp_path / "run", "--set", "pretrain.lr=1e6"))
    res = read(tmp_path / "run")
    assert code == 3 and res["methods"]["Global"]["status"] == "diverged"
    assert "running_var" in res["methods"]["Global"]["error"]
    assert all(m["status"] == "diverged" for m in res["methods"].values())


def test_nonfinite_paths_finds_every_bad_tensor():
    state = {"a": torch.ones(2), "b": [torch.tensor([1.0, math.inf])], "c": {"d": torch.tensor([math.nan])},
             "mask": torch.ones(2, dtype=torch.bool), "e": 1.5}
    assert nonfinite_paths(state) == ["state.b[0]", "state.c.d"]


# ------------------------------------------------------------------ 6. runs never overwrite each other


def test_a_locked_output_folder_refuses_a_second_run(tmp_path, capsys, demo):
    out = tmp_path / "run"
    with locked_folder(out):
        code, err = run_cli(capsys, *demo(out))
    assert code == 2 and "in use by another pflkit run" in err
    assert not (out / "results.json").exists()


def test_a_folder_holding_a_run_is_not_replaced_silently(tmp_path, capsys, demo):
    out = tmp_path / "run"
    assert run_cli(capsys, *demo(out, "--set", "pretrain.rounds=2"))[0] == 0
    before = (out / "results.json").read_bytes()
    code, err = run_cli(capsys, *demo(out, "--set", "pretrain.rounds=3"))
    assert code == 2 and "already holds a run" in err
    assert (out / "results.json").read_bytes() == before


def test_default_output_folder_depends_on_the_settings():
    cfg = resolve("demo", "smoke")
    plain = default_out(cfg, [])
    a, b = default_out(cfg, ["data.partition.alpha=100"]), default_out(cfg, ["data.partition.alpha=1"])
    assert plain == Path("runs/demo-smoke") and len({plain, a, b}) == 3
    assert default_out(cfg, ["x=1", "y=2"]) == default_out(cfg, ["y=2", "x=1"])


# ------------------------------------------------------------------ 7. which data


def _write_usps(path: Path, seed: int, n: int = 200) -> None:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 255, (n, 16, 16), dtype=np.uint8)
    y = np.arange(n) % 10
    np.savez(path, x_train=x, y_train=y, x_test=x[:60], y_test=y[:60])


def test_explicit_data_root_wins_and_the_file_is_recorded(tmp_path, monkeypatch):
    from pflkit.run.runner import run_experiment

    explicit, env_root = tmp_path / "explicit", tmp_path / "env"
    explicit.mkdir(), env_root.mkdir()
    _write_usps(explicit / "usps.npz", 0)
    _write_usps(env_root / "usps.npz", 1, n=300)
    monkeypatch.setenv("PFLKIT_DATA", str(env_root))
    spec = {"experiment": {"name": "usps-check"}, "data": {"dataset": "usps", "scheme": "iid", "num_clients": 2},
            "model": {"name": "mlp"}, "methods": {"Local": {"algorithm": "local", "rounds": 1}}}
    res = run_experiment(resolve(spec, "smoke"), tmp_path / "run", data_root=explicit, progress=False)
    (entry,) = res["data"]["files"]
    path = explicit / "usps.npz"
    assert entry["path"] == str(path.resolve()) and entry["bytes"] == path.stat().st_size
    assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_results_record_device_and_versions(tmp_path, capsys, demo):
    assert run_cli(capsys, *demo(tmp_path / "run", "--set", "pretrain.rounds=1"))[0] == 0
    res = read(tmp_path / "run")
    env, ver = res["environment"], res["version"]
    assert env["requested"] == "auto" and env["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # AVX2 and AVX512 round differently
    assert set(env["kernels_used"]) == {"mixed_batch_norm", "neumann_update", "layerwise_sgd_step"}
    assert ver["torch"] == torch.__version__ and "cuda" in ver and "triton" in ver


# ------------------------------------------------------------------ 8. late or raw failures, now up front


@pytest.mark.parametrize("argv, needle", [
    (["--set", "data.partition.alpha=-1"], "data.partition.alpha=-1"),
    (["--set", "device=gpu9"], "device='gpu9'"),
    (["--set", "data.num_clients=0"], "data.num_clients=0: must be >= 1"),
    (["--set", "data.data.num_clients=0"], "data.data: unknown setting"),
], ids=["negative-alpha", "unknown-device", "zero-clients", "doubled-prefix"])
def test_bad_settings_fail_before_any_work(argv, needle, capsys, tmp_path, demo):
    code, err = run_cli(capsys, *demo(tmp_path / "run", *argv))
    assert code == 2 and needle in err and "data.data.num_clients" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "results.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
@pytest.mark.parametrize("flag", [["--device", "cuda"], ["--kernels", "triton"]], ids=["device-cuda", "kernels-triton"])
def test_cuda_flags_without_cuda_fail_up_front_naming_the_flag(flag, capsys, tmp_path, monkeypatch, demo):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # tests switch the CPU interpreter on
    code, err = run_cli(capsys, *demo(tmp_path / "run", *flag))
    assert code == 2 and err.startswith(f"pflkit: error: {flag[0]}=") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_list_into_a_closed_pipe_prints_no_traceback():
    proc = subprocess.run(f"{sys.executable} -m pflkit.cli list | head -n 1", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.count("\n") == 1 and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


# ------------------------------------------------------------------ 9. small things that lose trust


def test_orphaned_temporary_files_are_removed_and_results_are_readable(tmp_path, capsys, demo):
    out = tmp_path / "run"
    assert run_cli(capsys, *demo(out, "--set", "pretrain.rounds=2"))[0] == 0
    orphans = [out / ".results.json.k2j3.tmp", out / "seed0" / ".global.ckpt.x9.tmp"]
    for p in orphans:
        p.write_text("half")
    assert run_cli(capsys, *demo(out, "--set", "pretrain.rounds=2", "--resume"))[0] == 0
    assert not any(p.exists() for p in orphans)
    mask = os.umask(0)
    os.umask(mask)
    for p in (out / "results.json", out / "seed0" / "global.weights.pt"):
        assert p.stat().st_mode & 0o777 == 0o666 & ~mask


def test_a_resumed_finished_run_reports_the_time_it_took(tmp_path, capsys, demo):
    out = tmp_path / "run"
    assert run_cli(capsys, *demo(out, "--set", "pretrain.rounds=3"))[0] == 0
    first = read(out)["timing"]
    assert run_cli(capsys, *demo(out, "--set", "pretrain.rounds=3", "--resume"))[0] == 0
    again = read(out)["timing"]
    assert again["total_seconds"] >= sum(v for st in first["stages"].values() for v in st.values())
    assert again["wall_seconds"] < first["wall_seconds"]


# ------------------------------------------------------------------ random kills (slow)


def _comparable(res: dict) -> dict:
    """results.json without what legitimately differs between two runs (times, engine paths)."""
    rounds = {k: {s: [{c: v for c, v in row.items() if c != "seconds"} for row in rows] for s, rows in per.items()}
              for k, per in res["rounds"].items()}
    return {"methods": res["methods"], "rounds": rounds, "status": res["status"]}


@pytest.mark.slow
def test_random_kills_then_resume_give_the_uninterrupted_results(tmp_path):
    """A bounded number of kill -9 at random moments (mid-round, mid-checkpoint, mid-write), then resume."""
    cmd = [sys.executable, "-m", "pflkit.cli", "demo", *SMOKE, "--set", "pretrain.rounds=6"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ref, out = tmp_path / "ref", tmp_path / "killed"
    subprocess.run(cmd + ["--out", str(ref)], check=True, env=env, capture_output=True, timeout=600)
    rng = random.Random(0)
    for kill in range(6):
        proc = subprocess.Popen(cmd + ["--out", str(out)] + (["--resume"] if out.exists() else []), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(3.0, 9.0))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done = subprocess.run(cmd + ["--out", str(out), "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert _comparable(read(out)) == _comparable(read(ref))


def test_standard_error_over_seeds_by_hand():
    from pflkit.run.results import standard_error

    assert standard_error([50.0]) is None
    # values 1, 2, 3: sample sd 1, so the standard error is 1 / sqrt(3)
    assert standard_error([1.0, 2.0, 3.0]) == pytest.approx(1 / math.sqrt(3))
