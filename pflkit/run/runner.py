"""Run an experiment end to end and write its ``results.json``.

For each seed: build the federation (saved beside the results), optionally train
the pretraining stage (its global model is then tested on every client: the
tables' "Global" column, and the start of every method that fine-tunes it), then
train and test every method. Each finished stage is written to disk at once, so
``resume=True`` skips finished stages and continues the unfinished one from its
last round checkpoint: a resumed run ends with the numbers of an uninterrupted one.

A pretraining stage with its own data (``[pretrain.data]``) trains on its own
federation (``seed*/pretrain/``: federation, record, weights); ``new_head`` or
``algorithm = "none"`` also make it separate (`run_pretrain`). Its weights are then
carried to the experiment's model (`carry_weights`: body exactly, head kept or
re-initialized) and that model is tested on the clients: the "Global" record, whose
``pretraining`` entry keeps the stage's own summary. Shapes and classes are checked
before any training (`check_pretrain_fits`).

What a number rests on is checked and recorded: the output folder is locked for the
run; a folder that already holds a run is continued only with ``resume=True`` and
only when the stored fingerprint (resolved config and data files) matches, replaced
only with ``overwrite=True``; results.json records the device, versions, kernel
backends, the client-update engine (requested, and used per stage) and the data files
(path, size, sha256), those of the pretraining data and of any weights file the model
started from; a method is ``ok`` only when every client has a finite test accuracy (else
``incomplete``, naming the clients).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import pflkit
from pflkit import kernels
from pflkit.algorithms import get_algorithm
from pflkit.config import ConfigError
from pflkit.data.base import Dataset
from pflkit.data.datasets import DATASETS, check_dataset, dataset_digest, dataset_options, is_user_dataset, load_dataset
from pflkit.data.provenance import weights_record
from pflkit.run.experiments import NO_TRAINING, DataConfig, ExperimentConfig, StageConfig
from pflkit.fl.algorithm import Env
from pflkit.fl.engines import check_engine
from pflkit.fl.federate import federation_for
from pflkit.fl.federation import Federation
from pflkit.fl.loop import StageResult, nonfinite_paths, run_rounds
from pflkit.fl.train import get_state, set_state
from pflkit.io import load_torch, locked_folder, read_json, remove_orphans, save_torch, slug, write_json
from pflkit.models import build_model
from pflkit.run.pretraining import (carry_weights, check_imagenet_weights, check_pretrain_fits, client_data,
                                load_pretrain_data, load_start_weights, pretrain_provenance)

log = logging.getLogger(__name__)


def version_info() -> dict:
    """pflkit version and git commit (if run from a clone), torch, CUDA, Triton and Python versions."""
    commit = None
    try:
        root = Path(pflkit.__file__).resolve().parent.parent
        if (root / ".git").exists():  # an installed wheel is not in a clone: no commit to report
            commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                    timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    triton = None
    if kernels.triton_importable():
        import triton as _triton

        triton = getattr(_triton, "__version__", "unknown")
    return {"pflkit": pflkit.__version__, "git": commit, "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton, "python": platform.python_version()}


def resolve_device(name: str) -> torch.device:
    """``auto`` -> the first CUDA device when there is one, else the CPU; other names as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_info(cfg: ExperimentConfig) -> dict:
    """The device a run really used, its GPU's name, the CPU's vector instructions torch's kernels ran
    with (``cpu_capability``, e.g. AVX2 or AVX512: the same run rounds differently on the two, and
    training makes single-seed accuracies differ by points) and the kernel backend each custom op ran with."""
    device = resolve_device(cfg.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    with kernels.use_backend(cfg.kernels):
        used = {op: kernels.resolve(op, device) for op in kernels.OPS}
    return {"requested": cfg.device, "device": str(device), "gpu": gpu,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "kernels": cfg.kernels, "kernels_used": used}


def make_env(cfg: ExperimentConfig, fed: Federation, seed: int, engine: str = "sequential") -> Env:
    """The run context: a factory for the experiment's model on its device (``auto`` resolved).

    ``engine``: how `run_rounds` runs a round's client updates (`pflkit.fl.engines`).
    """
    return Env(model_fn=model_factory(cfg.model.name, fed, cfg.model.options), device=resolve_device(cfg.device),
               seed=seed, kernels=cfg.kernels, engine=engine)


def model_factory(name: str, fed: Federation, options: dict | None = None) -> Callable[[], torch.nn.Module]:
    """A function building a fresh model ``name`` (random init) for ``fed``'s classes and input shape."""
    shape, options = tuple(fed.x.shape[1:]), dict(options or {})

    def model_fn():
        return build_model(name, num_classes=fed.num_classes, input_shape=shape, **options)
    return model_fn


def initial_model(env: Env) -> torch.nn.Module:
    """The run's seeded initial model (every method trained from scratch starts here)."""
    env.seed_torch("init")
    return env.model_fn().to(env.device)


def _stage_record(result: StageResult) -> dict:
    per_client = {int(k): v for k, v in result.per_client.items()}
    return {"status": result.status, "error": result.error, "best_round": result.best_round,
            "seconds": result.seconds, "summary": result.summary, "missing": list(getattr(result, "missing", [])),
            "per_client": [per_client[k] for k in sorted(per_client)], "history": result.history,
            "engine": getattr(result, "engine", "")}


def keeps_a_state(result: StageResult) -> bool:
    """True when a stage left a state worth keeping: it did not diverge, or it diverged after keep-best had
    chosen a round whose server and client states are finite (`run_rounds` then returns those)."""
    if result.status != "diverged":
        return True
    return result.best_round is not None and not nonfinite_paths((result.state, result.client_states))


def train_locally(algo, cfg, fed, model, env, *, checkpoint=None, resume=False, desc=None, label=None) -> StageResult:
    """The default engine: pflkit's own round loop.

    ``label`` (the stage's name) is part of the engine's signature, not of the loop's: the runner passes it
    to every engine, and Flower's (`pflkit.flower.serve`) sends it to the nodes to name the stage's client
    states; this process's loop has no use for it."""
    return run_rounds(algo, cfg, fed, model, env, checkpoint=checkpoint, resume=resume, desc=desc)


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


def _run_stage(stage: StageConfig, fed, env, start_model, seed_dir: Path, resume: bool, progress: bool,
               train=train_locally) -> dict:
    """Train and test one stage with ``train`` (an engine), or read it back if a previous run finished it."""
    done = seed_dir / f"{slug(stage.label)}.json"
    if resume and done.exists():
        log.info("stage %s already finished: %s", stage.label, done)
        return read_json(done)
    algo = get_algorithm(stage.algorithm)
    result = train(algo, stage.config, fed, start_model, env, checkpoint=seed_dir / f"{slug(stage.label)}.ckpt",
                   resume=resume, desc=f"{stage.label} (seed {env.seed})" if progress else None, label=stage.label)
    if fed.unseen_ids and algo.fit_unseen is not None and result.status == "ok":
        result = algo.fit_unseen(result, fed, stage.config, env)  # pFedHN's novel clients (sec. 5.3)
        kept = seed_dir / f"{slug(stage.label)}{FINAL_STATES}"
        if kept.exists():  # `keeping_states` saved the states before the fit: keep the ones tested
            save_torch(kept, {"state": result.state, "client_states": result.client_states})
    record = _stage_record(result)
    if algo.report is not None and keeps_a_state(result) and result.client_states is not None:
        report = algo.report(result.state, fed, stage.config, env, result.client_states)
        if report is not None:  # an algorithm may report only when its config asks (pFedHN's arrays)
            write_json(seed_dir / f"{slug(stage.label)}.report.json", report)
    if algo.exports_global and result.status != "diverged":
        save_torch(seed_dir / f"{slug(stage.label)}.weights.pt", algo.global_model(result.state))
    write_json(done, record)
    (seed_dir / f"{slug(stage.label)}.ckpt").unlink(missing_ok=True)
    return record


def build_seed_federation(cfg: ExperimentConfig, dataset, seed: int) -> Federation:
    """The federation of one seed, exactly as every engine builds it."""
    return federation_for(cfg.data, dataset, seed)


def check_client_splits(fed: Federation, cfg: ExperimentConfig | None = None, *, data: DataConfig | None = None,
                        key: str = "data", splits=("train", "test")) -> None:
    """Every client needs training and test samples: else its accuracy would be NaN (before any training).

    ``data`` / ``key`` name other data settings (``pretrain.data``, whose clients need only ``splits=("train",)``).
    """
    data = data if data is not None else cfg.data
    for split in splits:
        empty = [c.id for c in fed.clients if c.num(split) == 0]
        if empty:
            shown = ", ".join(map(str, empty[:5])) + (", ..." if len(empty) > 5 else "")
            raise ConfigError(f"{key}.num_clients={data.num_clients}: {len(empty)} of {fed.num_clients} clients get "
                              f"no {split} samples from {data.dataset!r} (clients {shown}); use fewer clients"
                              + (f" or a larger {key}.test_fraction" if split == "test" else ""))


def _eval_config():
    """FedAvg with no round: tests the given global model on every client (`run_rounds` with rounds=0)."""
    return get_algorithm("fedavg").config(rounds=0, eval_every=0, keep_best=False)


def _pretraining_summary(rec: dict) -> dict:
    return {k: rec.get(k) for k in ("status", "error", "best_round", "seconds", "summary", "missing")}


def run_pretrain(cfg: ExperimentConfig, fed: Federation, env: Env, pre: Dataset | None, seed_dir: Path,
                 resume: bool, progress: bool, train=train_locally) -> tuple[dict, dict | None]:
    """The pretraining stage of one seed: (its record, the weights every fine-tuning method starts from).

    A plain stage (no own data, no new head, a training algorithm) trains on the clients and its
    global model is the start, as always. Otherwise the stage trains on its own federation (or the
    clients') in ``seed_dir/pretrain`` (``algorithm = "none"``: no training, its start model is the
    result), `carry_weights` moves the weights to the experiment's model, and that model is tested
    on every client (the record; ``pretraining`` holds the stage's own summary, ``history`` its rounds).
    """
    st = cfg.pretrain
    name = slug(st.label)
    done, weights = seed_dir / f"{name}.json", seed_dir / f"{name}.weights.pt"
    if not st.separate:
        rec = _run_stage(st, fed, env, load_start_weights(initial_model(env), st), seed_dir, resume, progress, train)
        return rec, load_torch(weights) if rec["status"] != "diverged" and weights.exists() else None
    if resume and done.exists():
        rec = read_json(done)
        return rec, load_torch(weights) if weights.exists() else None
    extra, earlier = {}, 0.0
    if st.algorithm == NO_TRAINING:
        source = get_state(load_start_weights(initial_model(env), st))
        extra["pretraining"] = {"weights": st.weights or f"{cfg.model.name} as built"}
    else:
        pre_dir = seed_dir / "pretrain"
        pre_dir.mkdir(exist_ok=True)
        pre_fed, pre_env = fed, env
        if st.data is not None:
            pre_fed = federation_for(st.data, pre, env.seed)
            check_client_splits(pre_fed, data=st.data, key="pretrain.data", splits=("train",))
            pre_fed.save(pre_dir / "federation.npz")
            pre_env = make_env(cfg, pre_fed, env.seed, env.engine)
        start = load_start_weights(initial_model(pre_env), st)
        rec = _run_stage(st, pre_fed, pre_env, start, pre_dir, resume, progress, train)
        trained = pre_dir / f"{name}.weights.pt"
        extra = {"pretraining": _pretraining_summary(rec), "history": rec["history"]}
        earlier = rec.get("seconds", 0.0)
        if rec["status"] == "diverged" or not trained.exists():
            return {**rec, "status": "diverged", "error": f"pretraining: {rec.get('error') or 'no weights'}",
                    "per_client": [], "summary": {"acc": math.nan}, **extra}, None
        source = load_torch(trained)
    state = carry_weights(source, initial_model(env), st.new_head, env)
    result = run_rounds(get_algorithm("fedavg"), _eval_config(), fed, set_state(initial_model(env), state), env,
                        desc=f"{st.label} (seed {env.seed}): test" if progress else None)
    record = {**_stage_record(result), **extra}
    record["seconds"] = earlier + result.seconds
    save_torch(weights, state)
    write_json(done, record)
    return record, state


def run_seed(cfg: ExperimentConfig, dataset, seed: int, out: Path, resume: bool, progress: bool,
             train=train_locally, pre: Dataset | None = None, engine: str = "sequential",
             federation: Federation | None = None):
    """All stages of one seed; returns ({label: stage record}, {"seen": ids, "unseen": ids}).

    ``pre``: the pretraining stage's own dataset (`load_pretrain_data`), when it has one.
    ``engine``: how the round loop runs client updates (`pflkit.fl.engines`; not the numbers).
    ``federation``: the caller's own clients (`Federation.from_indices`), the same for every seed.
    """
    seed_dir = out / f"seed{seed}"
    seed_dir.mkdir(parents=True, exist_ok=True)
    fed = federation.rebind(dataset) if federation is not None else build_seed_federation(cfg, dataset, seed)
    check_client_splits(fed, cfg)
    fed.save(seed_dir / "federation.npz")
    env = make_env(cfg, fed, seed, engine)
    records: dict[str, dict] = {}
    pretrained = None
    stages = ([cfg.pretrain] if cfg.pretrain is not None else []) + list(cfg.methods)
    for k, stage in enumerate(stages):
        if resume and _retry(seed_dir, stage):
            _forget(seed_dir, stages[k:])
            resume = False
        if stage is cfg.pretrain:
            records[stage.label], pretrained = run_pretrain(cfg, fed, env, pre, seed_dir, resume, progress, train)
        else:
            records[stage.label] = _run_method(cfg, stage, fed, env, pretrained, seed_dir, resume, progress, train)
    return records, {"seen": fed.seen_ids, "unseen": fed.unseen_ids}


def _forget(seed_dir: Path, stages) -> None:
    """Delete what an earlier run wrote for ``stages`` (records, reports, weights, checkpoints, kept states):
    they are trained again, and a run stopped during that retry must not read the old records back as
    finished on its next resume (they came from the weights of the stage being retried)."""
    for stage in stages:
        for folder in (seed_dir, seed_dir / "pretrain"):
            for path in folder.glob(f"{slug(stage.label)}.*"):
                if path.is_file():
                    path.unlink()


def _retry(seed_dir: Path, stage: StageConfig) -> bool:
    """True when a resumed run finds ``stage`` left ``incomplete`` (clients missing, e.g. a Flower node
    that died): it is trained again, and so is every later stage of the seed, which may start from its
    weights, so a run is never worse for being resumed. A diverged stage is kept (it would diverge again)."""
    records = [seed_dir / f"{slug(stage.label)}.json", seed_dir / "pretrain" / f"{slug(stage.label)}.json"]
    incomplete = any(p.exists() and read_json(p).get("status") == "incomplete" for p in records)
    if incomplete:
        log.warning("%s: stage %s was left incomplete; training it (and the stages after it) again",
                    seed_dir.name, stage.label)
    return incomplete


def method_setting(exp, stage, fed: Federation):
    """(federation, experiment) that method ``stage`` trains in: its client group of ``fed`` (`Federation.subset`)
    and ``exp`` with its model options, or ``fed`` and ``exp`` themselves (the same objects) when it has none.

    pFedHN Table 2 (sec. 5.2, App. B): each baseline is trained on one budget group with that group's LeNet.
    """
    clients, options = getattr(stage, "clients", None), getattr(stage, "model", None) or {}
    if clients is not None:
        fed = fed.subset(clients.ids(fed.num_clients))
    if options:
        exp = dataclasses.replace(exp, model=dataclasses.replace(exp.model, options={**exp.model.options, **options}))
    return fed, exp


def _run_method(cfg, stage, fed, env, pretrained, seed_dir: Path, resume: bool, progress: bool, train) -> dict:
    """One method of a seed, in its own setting (`method_setting`: its client group and
    model options, if the file gives them), from a fresh model, the pretrained one or the global model
    of the earlier method it names in ``start_from``."""
    fed_m, cfg_m = method_setting(cfg, stage, fed)
    env_m = env if fed_m is fed and cfg_m is cfg else make_env(cfg_m, fed_m, env.seed, env.engine)
    start_from = getattr(stage, "start_from", "")
    if start_from:
        path = seed_dir / f"{slug(start_from)}.weights.pt"
        weights, why = (load_torch(path) if path.exists() else None), f"{start_from} left no weights (diverged)"
    elif get_algorithm(stage.algorithm).needs_pretrained:
        weights, why = pretrained, "pretraining diverged"
    else:
        return _run_stage(stage, fed_m, env_m, initial_model(env_m), seed_dir, resume, progress, train)
    if weights is None:
        return {"status": "diverged", "error": why, "per_client": [], "summary": {"acc": math.nan}, "history": [],
                "seconds": 0.0}
    return _run_stage(stage, fed_m, env_m, set_state(initial_model(env_m), weights), seed_dir, resume, progress,
                      train)


def _percent(acc) -> float | None:
    """A client's test accuracy in %, None where it has none: a NaN in memory, a null once read back
    from a stage record on resume (JSON has no NaN), so None never reaches arithmetic."""
    return 100.0 * acc if acc is not None and math.isfinite(acc) else None


def _pool_acc(record: dict, ids: list[int]) -> float:
    return 100.0 * float(np.mean([record["per_client"][i]["acc"] for i in ids]))


STATUS_ORDER = ("diverged", "incomplete", "ok")  # the worst status of the parts is the status of the whole


def worst_status(statuses) -> str:
    statuses = set(statuses)
    return next((s for s in STATUS_ORDER if s in statuses), "ok")


def standard_error(values: list[float]) -> float | None:
    """Standard error of the mean over seeds, s / sqrt(n) with the sample deviation (None for one seed)."""
    return float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None


def _method_entry(label: str, algorithm: str, per_seed_records: list[dict], published,
                  pools: list[dict[str, list[int]]], seeds: list[int]) -> dict:
    """Summary of one method over seeds; with an unseen pool, acc_* are over seen clients.

    Accuracies are reported only when every seed is ``ok`` (each client has a finite test
    accuracy); ``missing`` then names each client without one and why, per seed. ``acc_std`` is the
    standard deviation over seeds, ``acc_sem`` the standard error of their mean (pFedVEM's tables).
    """
    ok = [(r, p) for r, p in zip(per_seed_records, pools) if r["status"] == "ok"]
    accs = [_pool_acc(r, p["seen"]) for r, p in ok]
    unseen = [_pool_acc(r, p["unseen"]) for r, p in ok if p["unseen"]]
    status = worst_status(r["status"] for r in per_seed_records)
    rounds = [r["history"] for r in per_seed_records]
    bytes_round = [np.mean([h["bytes_down"] + h["bytes_up"] for h in hist]) for hist in rounds if hist]
    return {
        "algorithm": algorithm, "status": status,
        "acc_mean": float(np.mean(accs)) if accs and status == "ok" else None,
        "acc_std": float(np.std(accs)) if accs and status == "ok" else None,
        "acc_sem": standard_error(accs) if status == "ok" else None,
        "per_seed": [_pool_acc(r, p["seen"]) if r["status"] == "ok" else None
                     for r, p in zip(per_seed_records, pools)],
        "unseen": None if not unseen or status != "ok" else {"acc_mean": float(np.mean(unseen)),
                                                             "acc_std": float(np.std(unseen)), "per_seed": unseen},
        "per_client": [[_percent(c.get("acc")) for c in r["per_client"]] for r in per_seed_records],
        "best_round": [r.get("best_round") for r in per_seed_records],
        "bytes_per_round": float(np.mean(bytes_round)) if bytes_round else 0.0,
        "missing": [{"seed": s, **m} for s, r in zip(seeds, per_seed_records) for m in r.get("missing", [])],
        "error": "; ".join(f"seed {s}: {r['error']}" for s, r in zip(seeds, per_seed_records) if r.get("error")),
        "published": published,
    }


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


def user_data_record(dataset, fp: dict, given: bool) -> dict:
    """results.json's ``data`` entries on a dataset of one's own: where it came from, its sample counts and
    the sha256 of its arrays (its ``files`` may be empty: then the arrays are all that identify it)."""
    if "arrays_sha256" not in fp["data"]:
        return {}
    origin = "run_experiment(dataset=...)" if given else "register_dataset"
    return {"origin": origin, "arrays_sha256": fp["data"]["arrays_sha256"],
            "samples": {"train": len(dataset.y_train), "test": len(dataset.y_test)}}


def federation_record(fed: Federation) -> dict:
    """results.json's ``federation`` of a run given its clients (`Federation.from_indices`)."""
    keys = ("scheme", "num_clients", "unseen", "task", "augment", "domains", "domain_names")
    return {"given": True, **{k: fed.recipe.get(k) for k in keys}, "indices_sha256": fed.digest(),
            "sizes": {s: fed.sizes(s).tolist() for s in ("train", "val", "test")}}


def check_data_setting(cfg: ExperimentConfig) -> None:
    """``data.dataset`` is a registered name and ``data.options`` its options: one-line `ConfigError`s
    before the output folder is touched (a dataset of one's own: `pflkit.data.register_dataset`)."""
    d = cfg.data
    if d.dataset not in DATASETS:
        raise ConfigError(f"data.dataset={d.dataset!r}: unknown dataset; known: {', '.join(DATASETS)} (add your own "
                          "with pflkit.data.register_dataset, or pass run_experiment(dataset=...))")
    known = dataset_options(d.dataset)
    for key, value in d.options.items():
        if key not in known:
            raise ConfigError(f"data.options.{key}={value!r}: not an option of dataset {d.dataset!r} "
                              f"(its options: {', '.join(known) or 'none'})")


def check_given_data(cfg: ExperimentConfig, dataset, federation, engine: str) -> None:
    """One-line `ConfigError`s, before any work, for a dataset or federation handed to `run_experiment`:
    its type, the config naming another dataset or client count, the Flower engine (which builds its
    clients from ``[data]`` on the nodes)."""
    if engine == "flower":
        raise ConfigError("run_experiment: a dataset or federation object works with the pflkit engine only; "
                          "the flower engine's nodes build their clients from [data] themselves")
    if dataset is not None:
        try:
            check_dataset(dataset)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"run_experiment(dataset=...): {e}") from None
        if dataset.meta.name != cfg.data.dataset or cfg.data.options:
            raise ConfigError(f"data.dataset={cfg.data.dataset!r}: the dataset given is {dataset.meta.name!r}; set "
                              f"data.dataset = {dataset.meta.name!r} and no data.options")
    if federation is not None:
        if not isinstance(federation, Federation):
            raise ConfigError(f"run_experiment(federation=...): a {type(federation).__name__}, not a Federation")
        if federation.num_clients != cfg.data.num_clients:
            raise ConfigError(f"data.num_clients={cfg.data.num_clients}: the federation given has "
                              f"{federation.num_clients} clients")
        for key in ("task", "augment"):
            if federation.recipe.get(key, "label" if key == "task" else "none") != getattr(cfg.data, key):
                raise ConfigError(f"data.{key}={getattr(cfg.data, key)!r}: the federation given was made with "
                                  f"{key}={federation.recipe.get(key)!r}")
        check_given_splits(cfg, federation)


def check_given_splits(cfg: ExperimentConfig, fed: Federation) -> None:
    """Every client of a given federation has test samples, and validation samples when a stage trained on it
    keeps its best state by a validation score (else that score would be NaN)."""
    no_test = [c.id for c in fed.clients if c.num("test") == 0]
    if no_test:
        raise ConfigError(f"run_experiment(federation=...): clients {no_test[:5]} have no test samples; every "
                          "client is tested")
    no_val = [c.id for c in fed.clients if c.num("val") == 0]
    own = [cfg.pretrain] if cfg.pretrain is not None and cfg.pretrain.data is None else []
    for st in own + list(cfg.methods):
        c = st.config
        if no_val and getattr(c, "keep_best", False) and c.eval_every and c.select in ("val_acc", "val_loss"):
            raise ConfigError(f"run_experiment(federation=...): clients {no_val[:5]} have no validation samples, but "
                              f"stage {st.label!r} keeps its best state by {c.select}; give val index sets or set "
                              "its keep_best = false")


def check_federation_fits(federation: Federation | None, dataset) -> None:
    """The federation given was made over this dataset: the same name and number of pooled samples."""
    if federation is None:
        return
    n = len(dataset.y_train) + len(dataset.y_test)
    if federation.recipe.get("dataset") != dataset.meta.name or len(federation.y) != n:
        raise ConfigError(f"run_experiment(federation=...): made over {federation.recipe.get('dataset')!r} with "
                          f"{len(federation.y)} samples, but the run's dataset is {dataset.meta.name!r} with {n}")


def run_experiment(cfg: ExperimentConfig, out: str | Path, *, data_root=None, download: bool = False,
                   resume: bool = False, overwrite: bool = False, progress: bool = True, train=train_locally,
                   engine: str = "auto", keep_states: bool = False, dataset: Dataset | None = None,
                   federation: Federation | None = None) -> dict:
    """Run every seed of ``cfg`` into ``out`` and write ``out/results.json`` (atomically).

    ``train`` is the engine that trains one stage (`train_locally`: pflkit's loop; the Flower
    server passes its own, with ``engine="flower"``). With pflkit's loop, ``engine`` says how a
    round's client updates run: ``"auto"``, ``"sequential"``, ``"threads"`` or ``"vectorized"``
    (`pflkit.fl.engines`). It does not change the numbers beyond float rounding, so it is not
    part of the fingerprint that ``resume`` checks; results.json's ``environment`` records the
    requested engine and the one each stage used. ``download`` lets a missing dataset be
    downloaded into the cache. ``keep_states`` keeps each stage's final server and client states
    (`keeping_states`, `load_final_states`); it does not change the numbers either.
    Data of one's own: ``dataset`` (a `Dataset`, named by ``data.dataset``; or register it with
    `pflkit.data.register_dataset`) replaces loading ``data.dataset``, and ``federation``
    (`Federation.from_indices` over that dataset, ``data.num_clients`` clients) replaces the
    partition of ``[data]`` for every seed; results.json's ``data`` and ``federation`` say so.
    ``out`` is locked while the run lasts; a folder holding an earlier run needs ``resume``
    (same settings, checked) or ``overwrite``. Returns the results dict (keys: config, engine,
    status, methods, rounds, timing, version, environment, data).
    Accuracies in ``methods`` are percentages (mean over clients of each client's test
    accuracy; ``acc_std`` is the standard deviation over seeds).
    """
    out = Path(out)
    if keep_states:
        train = keeping_states(train)
    if engine != "flower":
        check_engine(engine)  # a one-line error before any work
    given = dataset is not None
    if given or federation is not None:
        check_given_data(cfg, dataset, federation, engine)
    if not given:
        check_data_setting(cfg)
    with locked_folder(out), kernels.use_backend(cfg.kernels):
        remove_orphans(out)
        t0 = time.perf_counter()
        if engine == "flower" and cfg.pretrain is not None and cfg.pretrain.data is not None:
            raise ConfigError(f"pretrain.data: the {engine} engine cannot build the pretraining stage's own "
                              "federation yet; run this experiment with the pflkit engine")
        own = [m.label for m in cfg.methods if getattr(m, "extra_dict", dict)()]
        unseen_fit = [m.label for m in cfg.methods if get_algorithm(m.algorithm).fit_unseen is not None]
        if engine == "flower" and cfg.data.unseen_clients and unseen_fit:
            raise ConfigError(f"data.unseen_clients={cfg.data.unseen_clients}: the {engine} engine cannot fit "
                              f"{unseen_fit[0]}'s unseen clients yet; run this experiment with the pflkit engine")
        if engine == "flower" and own:
            raise ConfigError(f"methods.{own[0]}: the {engine} engine cannot train a method on a client group, "
                              "with its own model or from another method yet; run it with the pflkit engine")
        check_imagenet_weights(cfg)  # a missing ImageNet file fails here, before any data is read
        if not given:
            dataset = load_dataset(cfg.data.dataset, data_root, download=download, **cfg.data.options)
        check_federation_fits(federation, dataset)
        pre = load_pretrain_data(cfg, data_root, download, load=load_dataset)
        t_data = time.perf_counter() - t0
        check_pretrain_fits(cfg, dataset, pre)
        fp = fingerprint(cfg, dataset, pre, given=given, federation=federation)
        prepare_folder(out, fp, resume=resume, overwrite=overwrite)
        environment = device_info(cfg)
        seeds = [cfg.seed + k for k in range(cfg.seeds)]
        used = client_data(cfg, dataset, pre)
        loop_engine = "sequential" if engine == "flower" else engine  # the loop's evaluation-only stages
        runs = {s: run_seed(cfg, used, s, out, resume, progress, train, pre, loop_engine, federation) for s in seeds}
        results = _results(cfg, runs, seeds, engine)
        environment.update(engine_info(engine, runs))
        stage_seconds = sum(v for st in results["timing"]["stages"].values() for v in st.values())
        results["timing"].update({"total_seconds": t_data + stage_seconds, "data_seconds": t_data,
                                  "wall_seconds": time.perf_counter() - t0})
        results.update({"environment": environment,
                        "data": {"name": dataset.meta.name, "source": dataset.meta.source,
                                 "files": data_files(dataset), "fingerprint": fingerprint_hash(fp),
                                 **user_data_record(dataset, fp, given)}})
        if federation is not None:
            results["federation"] = federation_record(federation)
        results.update(pretrain_provenance(cfg, pre))
        write_json(out / "results.json", results)
    return results


def engine_info(engine: str, runs: dict) -> dict:
    """results.json's ``environment`` entries on engines: the requested one and, per stage, those used."""
    if engine == "flower":
        return {"engine": engine}
    used: dict[str, set] = {}
    for records, _ in runs.values():
        for label, rec in records.items():
            used.setdefault(label, set()).update(e for e in rec.get("engine", "").split("+") if e)
    return {"engine": engine, "engine_used": {label: "+".join(sorted(e)) for label, e in used.items()}}


def _pools(stage, pools: list[dict], num_clients: int) -> list[dict]:
    """The seen / unseen pools a method is scored on: the seed's, or, for a method on a client group
    (a federation of its own, no unseen clients), every one of the group's renumbered clients."""
    clients = getattr(stage, "clients", None)
    if clients is None:
        return pools
    return [{"seen": list(range(len(clients.ids(num_clients)))), "unseen": []} for _ in pools]


def _results(cfg: ExperimentConfig, runs: dict, seeds: list[int], engine: str) -> dict:
    """results.json's content from each seed's stage records."""
    per_seed = {s: r[0] for s, r in runs.items()}
    stages = ([cfg.pretrain] if cfg.pretrain else []) + list(cfg.methods)
    pools = [runs[s][1] for s in seeds]
    methods = {st.label: _method_entry(st.label, st.algorithm, [per_seed[s][st.label] for s in seeds],
                                       cfg.published.get(st.label), _pools(st, pools, cfg.data.num_clients), seeds)
               for st in stages}
    for st in cfg.methods:  # a method on a client group: the original ids its per_client entries are of
        if getattr(st, "clients", None) is not None:
            methods[st.label]["clients"] = st.clients.ids(cfg.data.num_clients)
    return {
        "config": cfg.to_dict(),
        "engine": "flower" if engine == "flower" else "pflkit",  # whose round loop
        "status": worst_status(m["status"] for m in methods.values()),
        "methods": methods,
        "rounds": {st.label: {f"seed{s}": per_seed[s][st.label]["history"] for s in seeds} for st in stages},
        "timing": {"stages": {st.label: {f"seed{s}": per_seed[s][st.label].get("seconds", 0.0) for s in seeds}
                              for st in stages}},
        "version": version_info(),
    }
