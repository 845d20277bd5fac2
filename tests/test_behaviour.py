"""`pflkit.batch.behaviour`: a stage goes stale when what it computes changes, not when its code's text does.

The package is copied to a temporary folder and edited there; each version computes the stage fingerprints
of one tiny experiment in its own process (it imports its own copy), so the test sees what a batch run by
that code would see.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pflkit
from pflkit.batch.behaviour import BehaviourCache, record_digest, stage_fingerprints, stale_stages
from pflkit.run.experiments import resolve

from helpers_catalog import tiny_toml  # noqa: E402

TINY = tiny_toml(title="digits, 3 clients", ft={"client": 1, "global": 1})

PROBE = """\
import json, sys
from pflkit.batch.behaviour import stage_fingerprints
from pflkit.run.experiments import resolve
from pflkit.batch.versions import code_version
path = sys.argv[1]
print(json.dumps({"code": code_version(), "stages": stage_fingerprints(resolve(path, "cpu"), path, code_version())}))
"""


def _probe(pkg_root: Path, toml: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(pkg_root), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(toml)], env=env, capture_output=True, text=True,
                         cwd=pkg_root)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer holds {old!r}: update the test's edit"
    path.write_text(text.replace(old, new, 1))


def test_an_arithmetic_change_stales_exactly_its_stages_and_a_moved_function_none(tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(Path(pflkit.__file__).parent, pkg / "pflkit", ignore=shutil.ignore_patterns("__pycache__"))
    toml = tmp_path / "tiny.toml"
    toml.write_text(TINY)
    base = _probe(pkg, toml)
    assert set(base["stages"]) == {"Global", "FT (BN C)", "FT (BN G)"}

    # a refactor: `prepare` (and what follows it up to `finetune`) moves to a module of its own; the run code's digest changes, no stage does
    ft = pkg / "pflkit" / "algorithms" / "finetune.py"
    original = ft.read_text()
    start, end = original.index("def prepare("), original.index("def finetune(")
    imports = original[:original.index("\nBN_CHOICES")]  # finetune.py's docstring and import block
    (pkg / "pflkit" / "algorithms" / "ft_prepare.py").write_text(imports + "\n\n" + original[start:end])
    moved_names = ", ".join(n for n in ("prepare", "personalization_client") if f"def {n}(" in original[start:end])
    ft.write_text(original[:start] + f"from pflkit.algorithms.ft_prepare import {moved_names}  # noqa: E402\n\n\n"
                  + original[end:])
    moved = _probe(pkg, toml)
    assert moved["code"] != base["code"]
    assert moved["stages"] == base["stages"]

    # an arithmetic change that only FT (BN C) reaches: its stage, and no other, goes stale
    _edit(ft, "lr=cfg.lr, epochs=cfg.epochs", 'lr=cfg.lr * (0.5 if cfg.bn == "client" else 1.0), epochs=cfg.epochs')
    changed = _probe(pkg, toml)
    assert stale_stages(base["stages"], changed["stages"]) == ["FT (BN C)"]


def test_a_stage_starting_from_a_changed_one_is_stale_too(tmp_path, monkeypatch):
    """The fingerprint chains the stage a method starts from: other pretraining behaviour stales every
    fine-tuning stage; without a micro-run (here: none recorded) the run code's digest stands in."""
    toml = tmp_path / "tiny.toml"
    toml.write_text(TINY)
    cfg, code = resolve(toml, "cpu"), {"pflkit": "0", "source": "a" * 16}
    cache = BehaviourCache(tmp_path, code)
    base = stage_fingerprints(cfg, toml, code, cache)
    cache.save()
    assert json.loads((tmp_path / "_behaviour.json").read_text())["code"] == "a" * 16
    entry = cache.entries["tiny"]
    assert all(entry["stages"].values())  # the micro-run ran: a digest per stage
    entry["stages"] = {**entry["stages"], "Global": "0" * 16}
    assert stale_stages(base, stage_fingerprints(cfg, toml, code, cache)) == list(base)
    entry["stages"] = dict.fromkeys(entry["stages"])  # no micro-run: the code digest decides
    fallback = stage_fingerprints(cfg, toml, code, cache)
    assert stale_stages(fallback, stage_fingerprints(cfg, toml, {**code, "source": "b" * 16}, cache)) == list(base)
    # a cache written by other code is not read
    assert BehaviourCache(tmp_path, {"pflkit": "0", "source": "c" * 16}).entries == {}


def test_record_digest_ignores_wall_time_not_numbers(tmp_path):
    seed = tmp_path / "seed0"
    seed.mkdir()
    rec = {"seconds": 1.0, "engine": "sequential", "per_client": [{"acc": 0.5, "loss": 0.25}],
           "history": [{"round": 1, "train_loss": 1.0, "seconds": 3.0}]}
    (seed / "ft.json").write_text(json.dumps(rec))
    d = record_digest([seed], "FT")
    (seed / "ft.json").write_text(json.dumps({**rec, "seconds": 9.0, "engine": "vectorized",
                                              "history": [{"round": 1, "train_loss": 1.0, "seconds": 7.0}]}))
    assert record_digest([seed], "FT") == d
    (seed / "ft.json").write_text(json.dumps({**rec, "per_client": [{"acc": 0.5, "loss": 0.25000000000000006}]}))
    assert record_digest([seed], "FT") != d
    assert record_digest([seed], "other") is None


@pytest.mark.parametrize("stored,now,stale", [(None, {"a": "1"}, ["a"]), ({"a": "1", "b": "2"}, {"a": "1", "b": "3"}, ["b"]),
                                               ({"a": "1"}, {"a": "1", "b": "2"}, ["b"])])
def test_stale_stages(stored, now, stale):
    assert stale_stages(stored, now) == stale
