"""The run folder: its fingerprint, the rules for resuming or replacing a run in it, and the kept states.

A folder holds one run. `fingerprint` is what its numbers depend on (the resolved config less
`NOT_FINGERPRINTED`, the data files, a dataset's or federation's own digest, a weights file);
`prepare_folder` records it in ``run.json`` and refuses, with one-line `ConfigError`s, to continue a
run of other settings or to replace a run unless told to. With ``keep_states`` each stage's final
server and client states are saved beside its record (`keeping_states`), and read back by
`load_final_states` / `load_stage`, so figures and analyses need not train again.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from pflkit.config import ConfigError
from pflkit.data.datasets import dataset_digest, is_user_dataset
from pflkit.data.provenance import weights_record
from pflkit.fl.federation import Federation
from pflkit.fl.loop import StageResult, nonfinite_paths
from pflkit.io import load_torch, read_json, save_torch, slug, write_json
from pflkit.run.experiment_config import ExperimentConfig


class RunMismatchError(ConfigError):
    """``resume`` into a folder whose run was made with other settings or data (the message names them)."""


RUN_FILE = "run.json"
# settings that do not change the numbers a run gives (up to float tolerance) and may differ on resume


NOT_FINGERPRINTED = ("seeds", "published", "published_detail", "title", "device", "kernels", "deviations")


def fingerprint(cfg: ExperimentConfig, dataset, pre=None, *, given: bool = False,
                federation: Federation | None = None) -> dict:
    """What a run's numbers depend on: the resolved config (less `NOT_FINGERPRINTED`), the data read,
    the pretraining stage's own data (``pre``) and its ``weights`` file, when it has them.

    A dataset of one's own (``given`` to `run_experiment`, or registered with
    `pflkit.data.register_dataset`) may have no files: its arrays' sha256 (`dataset_digest`) is
    part of it too, so is a ``federation`` of one's own (its index sets' sha256)."""
    config = {k: v for k, v in cfg.to_dict().items() if k not in NOT_FINGERPRINTED}

    def files(ds):
        return [{"bytes": f["bytes"], "sha256": f["sha256"]} for f in data_files(ds)]

    def data(ds, user: bool):
        return {"name": ds.meta.name, "files": files(ds), **({"arrays_sha256": dataset_digest(ds)} if user else {})}

    fp = {"config": config, "data": data(dataset, given or is_user_dataset(dataset.meta.name))}
    if pre is not None:
        fp["pretrain_data"] = data(pre, is_user_dataset(pre.meta.name))
    if federation is not None:
        fp["federation"] = {"given": True, "indices_sha256": federation.digest()}
    if cfg.pretrain is not None and cfg.pretrain.weights:
        rec = weights_record(Path(cfg.pretrain.weights).expanduser(), "pretrain.weights")
        fp["pretrain_weights"] = {"bytes": rec["bytes"], "sha256": rec["sha256"]}
    return fp


def fingerprint_hash(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True, default=str).encode()).hexdigest()


def data_files(dataset) -> list[dict]:
    """The files a dataset was read from (path, bytes, sha256), as its loader recorded them."""
    return [dict(f) for f in dataset.meta.files]


def _flatten(d, prefix: str = "") -> dict:
    if isinstance(d, dict):
        return {k: v for key, val in d.items() for k, v in _flatten(val, f"{prefix}{key}.").items()}
    if isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
        return {k: v for i, val in enumerate(d) for k, v in _flatten(val, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): d}


def config_differences(old: dict, new: dict) -> list[str]:
    """Dotted keys whose values differ, as ``key (old -> new)``."""
    a, b = _flatten(old), _flatten(new)
    return [f"{k.removeprefix('config.')} ({a.get(k, '<unset>')!r} -> {b.get(k, '<unset>')!r})"
            for k in sorted(set(a) | set(b)) if a.get(k, "<unset>") != b.get(k, "<unset>")]


def holds_a_run(out: Path) -> bool:
    """True when ``out`` has files of an earlier run (its record, results or a seed folder)."""
    return (out / RUN_FILE).exists() or (out / "results.json").exists() or any(out.glob("seed*"))


def clear_run(out: Path) -> None:
    """Delete the files pflkit wrote into ``out`` (never anything else a user keeps there)."""
    for p in out.glob("seed*"):
        if p.is_dir():
            shutil.rmtree(p)
    for name in (RUN_FILE, "results.json", "methods.png", "flower-failures.log"):
        (out / name).unlink(missing_ok=True)


def prepare_folder(out: Path, fp: dict, *, resume: bool, overwrite: bool) -> None:
    """Refuse to mix two configurations, or to replace a run, unless told to; then record ``fp``.

    Raises:
        ConfigError: ``out`` holds a run and neither flag is given, or ``resume`` with a run of
            other settings (the message names every differing key).
    """
    run_file = out / RUN_FILE
    if overwrite:
        clear_run(out)
    elif holds_a_run(out):
        if not resume:
            raise ConfigError(f"--out {out} already holds a run; continue it with --resume, replace it with "
                              "--overwrite, or choose another --out")
        if not run_file.exists():
            raise ConfigError(f"--resume: {out} holds no {RUN_FILE}, so its settings cannot be checked; "
                              "start over with --overwrite")
        stored, current = read_json(run_file)["fingerprint"], json.loads(json.dumps(fp, default=str))
        if fingerprint_hash(stored) != fingerprint_hash(current):
            diff = config_differences(stored, current)
            raise RunMismatchError(f"--resume: the run in {out} was made with other settings: {'; '.join(diff[:8])}"
                                   f"{' ...' if len(diff) > 8 else ''}. Resume with the same settings, or start "
                                   "over with --overwrite")
    write_json(run_file, {"fingerprint": fp, "hash": fingerprint_hash(fp)})


def keeps_a_state(result: StageResult) -> bool:
    """True when a stage left a state worth keeping: it did not diverge, or it diverged after keep-best had
    chosen a round whose server and client states are finite (`run_rounds` then returns those)."""
    if result.status != "diverged":
        return True
    return result.best_round is not None and not nonfinite_paths((result.state, result.client_states))


FINAL_STATES = ".final.pt"


def final_states_path(run_dir, label: str, seed: int = 0) -> Path:
    """Where a run made with ``keep_states`` keeps a stage's final states: ``seed{seed}/<slug>.final.pt``."""
    return Path(run_dir) / f"seed{seed}" / f"{slug(label)}{FINAL_STATES}"


def keeping_states(train):
    """``train`` (an engine that trains one stage) that also saves the stage's final server state and
    client states, weights-only, as ``<stage>.final.pt`` beside its checkpoint (a diverged stage: keep-best's
    states, when it had chosen a round, `keeps_a_state`): figures and analyses then read the trained states
    instead of training again."""
    def run(algo, cfg, fed, model, env, *, checkpoint=None, **kwargs):
        result = train(algo, cfg, fed, model, env, checkpoint=checkpoint, **kwargs)
        if checkpoint is not None and keeps_a_state(result):
            path = Path(checkpoint).with_suffix(FINAL_STATES)
            save_torch(path, {"state": result.state, "client_states": result.client_states})
        return result
    return run


def load_final_states(run_dir, label: str, seed: int = 0) -> dict:
    """``{"state", "client_states"}`` of a stage of a run made with ``keep_states`` (weights-only load)."""
    path = final_states_path(run_dir, label, seed)
    if not path.exists():
        raise FileNotFoundError(f"no final states at {path}: run the experiment with keep_states=True "
                                f"(`pflkit run ... --keep-states`) and let {label!r} finish")
    return load_torch(path)


def load_stage(run_dir, label: str, seed: int = 0) -> StageResult:
    """Stage ``label`` of a finished run made with ``keep_states``, as `run_rounds` returned it: its record
    (``seed{seed}/<slug>.json``: status, test metrics per client in client order, history) with its final
    server and client states (`load_final_states`)."""
    record = read_json(Path(run_dir) / f"seed{seed}" / f"{slug(label)}.json")
    kept = load_final_states(run_dir, label, seed)
    return StageResult(status=record["status"], state=kept["state"], client_states=kept["client_states"],
                       history=record["history"], per_client=dict(enumerate(record["per_client"])),
                       best_round=record["best_round"], seconds=record["seconds"], error=record["error"],
                       missing=record["missing"], engine=record.get("engine", ""))
