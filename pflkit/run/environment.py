"""The run's environment: the machine and versions it ran on, the device, the model and the `Env`.

`make_env` is the run context every stage's phases receive (`pflkit.fl.algorithm.Env`): a factory for the
experiment's model on the resolved device; `initial_model` is the seeded start of every method trained
from scratch. `version_info`, `device_info` and `engine_info` are what results.json records about where
and how a run computed its numbers.
"""
from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Callable

import torch

import pflkit
from pflkit import kernels
from pflkit.fl.algorithm import Env
from pflkit.fl.federation import Federation
from pflkit.models import build_model
from pflkit.run.experiment_config import ExperimentConfig


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


def engine_info(trainer, runs: dict) -> dict:
    """results.json's ``environment`` entries on engines: the requested one and, per stage, those used
    (a trainer whose clients live elsewhere, `Trainer.in_process` false: its transport's name only)."""
    if not trainer.in_process:
        return {"engine": trainer.transport}
    used: dict[str, set] = {}
    for records, _ in runs.values():
        for label, rec in records.items():
            used.setdefault(label, set()).update(e for e in rec.get("engine", "").split("+") if e)
    return {"engine": trainer.engine, "engine_used": {label: "+".join(sorted(e)) for label, e in used.items()}}
