"""One experiment, rebuilt identically on the server and on every client.

Flower's ServerApp and ClientApps are separate programs (threads, Ray actors or
machines). Each rebuilds what it needs from the same *settings*: the resolved
pflkit experiment as a JSON string plus a data folder. Settings are flat
string / number pairs, so they fit Flower's run config (``[tool.flwr.app.config]``,
``flwr run --run-config``) and the ConfigRecord of every message.

A `Runtime` is the experiment of one seed in one process: config, dataset,
federation (built by pflkit's own partitioners, exactly as `pflkit.run.runner.run_seed` does, so
that partition ``i`` on Flower is client ``i`` of a pflkit run) and the `Env`. It is
read-only data derived from the settings, cached per process so that a Ray actor
serving many virtual clients loads the dataset once; per-client state that changes
lives in Flower's ``Context.state``, never here.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from functools import lru_cache

import torch

from pflkit.config import ConfigError, to_dict
from pflkit.fl.federate import federation_for
from pflkit.run.experiment_config import ExperimentConfig, StageConfig
from pflkit.run.experiments import resolve

log = logging.getLogger(__name__)


def experiment_to_raw(cfg: ExperimentConfig) -> dict:
    """A resolved experiment as the raw dict `pflkit.run.experiments.resolve` reads (presets applied)."""

    def stage(s: StageConfig) -> dict:
        return {"algorithm": s.algorithm, **to_dict(s.config)}

    raw = {"experiment": {"name": cfg.name, "paper": cfg.paper, "table": cfg.table, "title": cfg.title},
           "data": to_dict(cfg.data), "model": to_dict(cfg.model),
           "methods": {m.label: {**stage(m), **m.extra_dict()} for m in cfg.methods},
           "published": dict(cfg.published),
           "published_detail": dict(cfg.published_detail), "seed": cfg.seed, "seeds": cfg.seeds, "kernels": cfg.kernels, "device": cfg.device}
    if cfg.pretrain is not None:
        raw["pretrain"] = {"label": cfg.pretrain.label, **stage(cfg.pretrain), **cfg.pretrain.extra_dict()}
    if cfg.deviations:  # the preset's declarations travel too, so Flower runs record them
        raw["presets"] = {cfg.preset: {"deviations": [d.split("=", 1)[0] for d in cfg.deviations]}}
    return raw


def settings_for(cfg: ExperimentConfig, data_root=None, **extra) -> dict:
    """The flat settings that carry ``cfg`` to Flower apps (run config / message header)."""
    return {"experiment-json": json.dumps(experiment_to_raw(cfg)), "preset": cfg.preset,
            "data-root": "" if data_root is None else str(data_root), **extra}


def _overrides(text: str) -> list[str]:
    # run config values are scalars: several --set overrides in one string, separated by ";"
    return [o.strip() for o in text.split(";") if o.strip()]


def experiment_from_settings(settings) -> ExperimentConfig:
    """The experiment named by settings: ``experiment-json`` (exact), else ``experiment`` + ``preset`` + ``overrides``."""
    preset = str(settings.get("preset", "cpu"))
    if settings.get("experiment-json"):
        return resolve(json.loads(settings["experiment-json"]), preset)
    name = settings.get("experiment")
    if not name:
        raise ConfigError("Flower run config: set `experiment` (a pflkit experiment name or .toml path)")
    return resolve(str(name), preset, _overrides(str(settings.get("overrides", ""))))


def stages(cfg: ExperimentConfig) -> list[StageConfig]:
    return ([cfg.pretrain] if cfg.pretrain is not None else []) + list(cfg.methods)


def find_stage(cfg: ExperimentConfig, label: str) -> StageConfig:
    for s in stages(cfg):
        if s.label == label:
            return s
    raise ValueError(f"experiment {cfg.name!r} has no stage labelled {label!r}")


@dataclass
class Runtime:
    cfg: ExperimentConfig
    fed: object
    env: object
    seed: int


@lru_cache(maxsize=4)
def _dataset(experiment_json: str, preset: str, data_root: str):
    from pflkit.data.datasets import load_dataset

    cfg = experiment_from_settings({"experiment-json": experiment_json, "preset": preset})
    return cfg, load_dataset(cfg.data.dataset, data_root or None, **cfg.data.options)


@lru_cache(maxsize=4)
def runtime(experiment_json: str, preset: str, data_root: str, seed: int) -> Runtime:
    """The (cached) experiment of ``seed`` in this process."""
    from pflkit.run.environment import make_env

    cfg, dataset = _dataset(experiment_json, preset, data_root)
    fed = federation_for(cfg.data, dataset, seed)
    return Runtime(cfg, fed, make_env(cfg, fed, seed), seed)


def set_threads(num: int | float | None) -> None:
    """Match torch's intra-op threads to the CPUs this client was given (no oversubscription)."""
    if num is None:
        ray = sys.modules.get("ray")  # a Ray actor has imported it; importing it here would cost seconds
        try:  # inside a Ray actor: the CPUs Ray reserved for it
            if ray is not None and ray.is_initialized():
                num = ray.get_runtime_context().get_assigned_resources().get("CPU")
        except Exception:  # noqa: BLE001 - not in Ray: leave torch's default
            num = None
    if num is None:
        num = os.environ.get("OMP_NUM_THREADS")
    if num:
        n = max(1, int(float(num)))
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
