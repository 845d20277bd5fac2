"""Train one method (a stage): as a run's stage, or on a federation the caller chooses.

A run's stages (`run_stage`): a trainer (`pflkit.run.trainer.Trainer`) trains the stage, or a resumed run
reads its finished record back; its record, report, exported weights and kept states are written beside
it. `run_method` starts a method from a fresh model, the pretrained one or an earlier method's weights, in
its own setting (`method_setting`: a client group and model options, `pflkit.run.experiment_config.MethodStage`;
pFedHN Table 2, sec. 5.2). A resumed run trains a stage left ``incomplete`` and every later one again
(`retry`, `forget`).

Outside a run: some figures need a method trained on part of the federation (pFedHN's novel clients,
sec. 5.3) or the trained state itself (mix-and-match, Fig. 3), which ``results.json`` does not keep:
`train_method` trains the stage the runner would, on the given federation, and returns its `StageResult`.
Without any experiment file, `env_for_model` makes the run context (`Env`) from a model factory or name
and `train_algorithm` trains one algorithm with the given settings (e.g. on
`pflkit.fl.federation.Federation.from_indices`).
"""
from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Callable

import torch

from pflkit.algorithms import get_algorithm
from pflkit.config import ConfigError, one_of
from pflkit.fl.algorithm import Algorithm, Env
from pflkit.fl.engines import check_engine
from pflkit.fl.federation import Federation
from pflkit.fl.loop import StageResult, run_rounds
from pflkit.fl.train import set_state
from pflkit.io import load_torch, read_json, save_torch, slug, write_json
from pflkit.run.environment import initial_model, make_env, model_factory, resolve_device
from pflkit.run.experiment_config import StageConfig, check_device, check_kernels
from pflkit.run.folder import FINAL_STATES, keeps_a_state

log = logging.getLogger(__name__)


def method_config(exp, label: str, **changes):
    """(algorithm, config) of method ``label`` of a resolved experiment (its pretraining stage included),
    with the given config fields replaced."""
    stages = {m.label: m for m in exp.methods}
    if exp.pretrain is not None:
        stages.setdefault(exp.pretrain.label, exp.pretrain)
    if label not in stages:
        raise ValueError(f"experiment {exp.name!r} has no method {label!r}; methods: {list(stages)}")
    stage = stages[label]
    return get_algorithm(stage.algorithm), dataclasses.replace(stage.config, **changes)


def train_method(exp, label: str, fed: Federation, env, *, model=None, desc: str | None = None,
                 **changes) -> StageResult:
    """Train and test method ``label`` of experiment ``exp`` on ``fed`` (a fresh model from ``env``
    unless ``model`` is given); returns the `StageResult` with its final states."""
    algo, cfg = method_config(exp, label, **changes)
    return run_rounds(algo, cfg, fed, model if model is not None else initial_model(env), env, desc=desc)


def env_for_model(model: str | Callable[[], torch.nn.Module], fed: Federation | None = None, *, seed: int = 0,
                  device: str = "auto", kernels: str = "auto", engine: str = "sequential", **options) -> Env:
    """A run context without an experiment config.

    Args:
        model: a function building a fresh module (random init), or a name of `pflkit.models`
            built for ``fed``'s classes and input shape with ``options``.
        fed: the federation a named model is built for (not needed with a function).
        seed, device, kernels, engine: as an experiment's (``device="auto"``: CUDA when present).

    The settings are checked first (one-line `ConfigError`s); a function is called once, under a
    forked RNG, to check that it builds a module.
    """
    check_device(device)
    one_of("kernels", kernels, {"auto", "triton", "reference"})
    check_kernels(kernels, device)
    check_engine(engine)
    if isinstance(model, str):
        if fed is None:
            raise ConfigError(f"model={model!r}: a named model needs the federation it is built for (fed=...)")
        model_fn = model_factory(model, fed, options)
    elif callable(model):
        if options:
            raise ConfigError(f"{sorted(options)[0]}: model options go with a model name, not a model function")
        model_fn = model
    else:
        raise ConfigError(f"model={model!r}: a model name or a function returning a torch.nn.Module")
    with torch.random.fork_rng(devices=[]):
        built = model_fn()
    if not isinstance(built, torch.nn.Module):
        raise ConfigError(f"model: the model function returned a {type(built).__name__}, not a torch.nn.Module")
    return Env(model_fn=model_fn, device=resolve_device(device), seed=seed, kernels=kernels, engine=engine)


def train_algorithm(algorithm: str | Algorithm, fed: Federation, env: Env, *, model: torch.nn.Module | None = None,
                    desc: str | None = None, **settings) -> StageResult:
    """Train and test one algorithm on ``fed`` without an experiment file: ``settings`` are its config's
    fields (checked first), ``model`` the start (default: ``env``'s seeded initial model, as the runner's)."""
    algo = get_algorithm(algorithm) if isinstance(algorithm, str) else algorithm
    cfg = algo.make_config(settings)
    return run_rounds(algo, cfg, fed, model if model is not None else initial_model(env), env, desc=desc)


def stage_record(result: StageResult) -> dict:
    """A stage's record (``seed*/<slug>.json``): status, timing, per-client test metrics in client order, history."""
    per_client = {int(k): v for k, v in result.per_client.items()}
    return {"status": result.status, "error": result.error, "best_round": result.best_round,
            "seconds": result.seconds, "summary": result.summary, "missing": list(getattr(result, "missing", [])),
            "per_client": [per_client[k] for k in sorted(per_client)], "history": result.history,
            "engine": getattr(result, "engine", "")}


def run_stage(stage: StageConfig, fed, env, start_model, seed_dir: Path, resume: bool, progress: bool,
              train) -> dict:
    """Train and test one stage with ``train`` (a `Trainer`'s), or read it back if a previous run finished it."""
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
    record = stage_record(result)
    if algo.report is not None and keeps_a_state(result) and result.client_states is not None:
        report = algo.report(result.state, fed, stage.config, env, result.client_states)
        if report is not None:  # an algorithm may report only when its config asks (pFedHN's arrays)
            write_json(seed_dir / f"{slug(stage.label)}.report.json", report)
    if algo.exports_global and result.status != "diverged":
        save_torch(seed_dir / f"{slug(stage.label)}.weights.pt", algo.global_model(result.state))
    write_json(done, record)
    (seed_dir / f"{slug(stage.label)}.ckpt").unlink(missing_ok=True)
    return record


def forget(seed_dir: Path, stages) -> None:
    """Delete what an earlier run wrote for ``stages`` (records, reports, weights, checkpoints, kept states):
    they are trained again, and a run stopped during that retry must not read the old records back as
    finished on its next resume (they came from the weights of the stage being retried)."""
    for stage in stages:
        for folder in (seed_dir, seed_dir / "pretrain"):
            for path in folder.glob(f"{slug(stage.label)}.*"):
                if path.is_file():
                    path.unlink()


def retry(seed_dir: Path, stage: StageConfig) -> bool:
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


def run_method(cfg, stage, fed, env, pretrained, seed_dir: Path, resume: bool, progress: bool, train) -> dict:
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
        return run_stage(stage, fed_m, env_m, initial_model(env_m), seed_dir, resume, progress, train)
    if weights is None:
        return {"status": "diverged", "error": why, "per_client": [], "summary": {"acc": math.nan}, "history": [],
                "seconds": 0.0}
    return run_stage(stage, fed_m, env_m, set_state(initial_model(env_m), weights), seed_dir, resume, progress,
                      train)
