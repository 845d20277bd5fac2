"""One method of an experiment file, trained on a federation the caller chooses.

The runner trains every method of an experiment on the experiment's own federation. Some figures
need a method trained on part of it (pFedHN's 90 training and 10 novel clients, sec. 5.3; one
budget group of Table 2) or need the trained state itself (mix-and-match, Fig. 3), which
``results.json`` does not keep: `train_method` runs the same stage the runner would, on the given
federation, and returns its `StageResult`. The analyses of `pflkit.analysis` then work on what it
returns, without training anything themselves.

The runner itself trains a method on part of the federation when the experiment file says so
(`pflkit.run.experiments.MethodStage`: ``clients``, ``model``, ``start_from``): `pflkit.run.runner.method_setting`
gives the federation and the experiment that method sees.

Without any experiment file: `env_for_model` makes the run context (`Env`) from a model factory
or a model name, and `train_algorithm` trains one algorithm with the given settings, e.g. on a
federation of one's own (`pflkit.fl.federation.Federation.from_indices`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from pflkit.algorithms import get_algorithm
from pflkit.algorithms import pfedhn
from pflkit.config import ConfigError, one_of
from pflkit.run.experiments import check_device, check_kernels
from pflkit.fl.algorithm import Algorithm, Env
from pflkit.fl.engines import check_engine
from pflkit.fl.federation import Federation
from pflkit.fl.loop import StageResult, run_rounds
from pflkit.run.runner import initial_model, model_factory, resolve_device


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


def fit_novel_clients(trained: StageResult, novel: Federation, cfg, env, *, rounds: int | None = None,
                      init: str = "mean") -> StageResult:
    """pFedHN sec. 5.3: phi frozen, each novel client's embedding learned (`pfedhn.fit_novel_clients`).

    ``cfg.novel_fit`` picks fitting to convergence (the default) or a round budget; ``rounds`` (given)
    selects the budget with that many rounds.
    """
    if rounds is not None:
        cfg = dataclasses.replace(cfg, novel_fit="rounds", novel_rounds=rounds)
    return pfedhn.fit_novel_clients(trained.state, novel, cfg, env, init=init)


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
