"""Every tensor of a run is made on the run's device: a check that works without a GPU.

What it catches: a factory call (``torch.zeros``, ``torch.tensor``, ``torch.randperm``, ...)
inside pflkit that names no device. Such a tensor lands on torch's default device (the CPU),
which on a CUDA run means state off the GPU, a host-device copy in the hot path, or a crash
when it meets CUDA tensors. On a CPU-only machine the run's device *is* the CPU, so nothing
fails by itself; this test makes the omission visible.

How (the approach, and why not ``torch.set_default_device("meta")``): a `TorchFunctionMode`
records every factory call made directly by pflkit code without an explicit ``device``
(or a device context such as ``with torch.device("meta")``) while one smoke experiment per
paper trains and tests, and the test fails listing each offending ``file:line``. Setting the
default device to ``meta`` was tried first: it stops at the first offender only, and it also
breaks legitimate things that are not pflkit's doing (modules built by the model factory get
meta parameters that cannot be moved to the CPU; torch's own helpers). A call that builds
from an existing tensor (``torch.as_tensor(t)``, ``*_like``, ``t.new_*``) inherits that
tensor's device and is not a factory call here.

Where the line is (what may create device-less CPU tensors):

* data loading and federation building (`pflkit.data`, `build_federation`, everything the
  runner does before a stage starts): pooled datasets live on the CPU and batches are moved
  to the run's device as they are taken;
* model construction (``env.model_fn()``, run by torch's ``nn.Module`` code, not recorded):
  modules are built on the CPU, so a seed gives the same initial weights on every device,
  then moved once with ``.to(env.device)``.

Everything from the first phase of a stage to the last test evaluation (the algorithms,
the round loop, local training, aggregation, meta-learning, kernels) is checked, including
host-side draws from CPU generators, which must say ``device="cpu"`` (they would otherwise
break for a user who sets ``torch.set_default_device("cuda")``).
"""
from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import pflkit
import pflkit.run.runner as runner
from pflkit.config import ConfigError
from pflkit.data.base import Dataset
from pflkit.run.experiments import list_experiments, resolve
from pflkit.run.trainer import Trainer, train_locally

PFLKIT_DIR = Path(pflkit.__file__).resolve().parent
ALLOWED = (PFLKIT_DIR / "data",)  # data loading: CPU tensors, moved to the device as batches are taken
# frames of torch's dispatch machinery between a call and its mode (none for most factories)
PLUMBING = tuple(str(Path(torch.__file__).resolve().parent / f) for f in ("overrides.py", "utils/_device.py"))

FACTORIES = {
    torch.zeros, torch.ones, torch.empty, torch.full, torch.eye, torch.arange, torch.linspace, torch.logspace,
    torch.rand, torch.randn, torch.randint, torch.randperm, torch.normal, torch.scalar_tensor, torch.empty_strided,
    torch.tensor, torch.as_tensor, torch.asarray,
}
FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}  # device-less only when not built from a tensor


@functools.lru_cache(maxsize=None)
def _pflkit_file(filename: str) -> str | None:
    """``pflkit/fl/loop.py`` for a checked pflkit source file; None for anything else."""
    path = Path(filename).resolve()
    if not path.is_relative_to(PFLKIT_DIR) or any(path.is_relative_to(a) for a in ALLOWED):
        return None
    return path.relative_to(PFLKIT_DIR.parent).as_posix()


def _building_a_module(frame) -> bool:
    """True inside an ``nn.Module.__init__`` (model construction: built on the CPU, moved once)."""
    while frame is not None:
        if frame.f_code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), torch.nn.Module):
            return True
        frame = frame.f_back
    return False


class DevicelessFactories(TorchFunctionMode):
    """Records ``file:line: torch.fn`` of each factory call made by pflkit code without a device.

    Only the immediate caller is judged: a torch function that pflkit calls and that makes
    tensors internally is torch's business, and module constructors are model construction.
    """

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None and not (
                func in FROM_DATA and args and isinstance(args[0], torch.Tensor)):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(PLUMBING):
                frame = frame.f_back
            where = _pflkit_file(frame.f_code.co_filename) if frame is not None else None
            if where is not None and not _building_a_module(frame):
                key = f"{where}:{frame.f_lineno}: torch.{func.__name__}"
                self.calls[key] = self.calls.get(key, 0) + 1
        return func(*args, **kwargs)

    def report(self) -> str:
        return "\n".join(f"  {k} ({n} calls)" for k, n in sorted(self.calls.items()))


def recording_engine(recorder: DevicelessFactories):
    """pflkit's own stage engine, with ``recorder`` active from the first phase to the last test."""
    def train(*args, **kwargs):
        with recorder:
            return train_locally(*args, **kwargs)
    return train


def shrink_dataset(dataset: Dataset, per_class: int) -> Dataset:
    """The first ``per_class`` samples of every class of each split (what a device check needs)."""
    def keep(y):
        y = y.numpy()
        return np.sort(np.concatenate([np.flatnonzero(y == c)[:per_class] for c in np.unique(y)]))

    tr, te = keep(dataset.y_train), keep(dataset.y_test) if len(dataset.y_test) else np.zeros(0, np.int64)

    def take(x, idx):  # lazy image folders decode the kept samples into a tensor
        return x[torch.as_tensor(idx, dtype=torch.long)]

    return dataclasses.replace(
        dataset, x_train=take(dataset.x_train, tr), y_train=dataset.y_train[tr], x_test=take(dataset.x_test, te),
        y_test=dataset.y_test[te], groups_train={k: np.asarray(v)[tr] for k, v in dataset.groups_train.items()},
        groups_test={k: np.asarray(v)[te] for k, v in dataset.groups_test.items()})


# One smoke experiment per paper (the one that covers most of its methods), shrunk to one
# round per stage and a few samples per class: every phase still runs (init, client update,
# aggregate, validation, test), for every method of the experiment.
SHRINK = ["pretrain.rounds=1", "methods.*.rounds=1", "methods.*.meta_iters=1", "methods.*.eval_every=1"]
CASES = {
    "demo": 20,  # FedAvg, FT (BN C/G/I), FedL2P on the embedded digits: needs no data folder
    "fedl2p_table5_digits_c3": 12,  # BNNet / LRNet variants over digit domains
    "fedl2p_table8_digits_c3": 12,  # FOMAML+ and IFT hypergradients; L2P via table 2's
    "pfedhn_table1_c10_n10": 12,  # Local, Per-FedAvg FO/HF, FedPer, pFedMe, LG-FedAvg, pFedHN(-PC)
    "fedselect_table1_s2": None,  # every FedSelect baseline and variant (smoke: 5 samples per class)
    "pfedvem_cifar10_n50": 12,  # Local, FedAvg, pFedMe, FedPer, pFedHN, pFedMAP, pFedVEM
}


def _overrides(name: str, extra: list[str]) -> list[str]:
    """SHRINK + extra, keeping only keys the experiment has (resolve rejects unknown keys)."""
    out = []
    for item in SHRINK + list(extra):
        try:
            resolve(name, "smoke", out + [item])
        except ConfigError:
            continue
        out.append(item)
    return out


def run_recorded(name: str, device: str, tmp_path, data_root=None, per_class=None, extra=(), monkeypatch=None):
    """Run ``name`` at the smoke preset, shrunk, on ``device``; returns (results, recorder)."""
    cfg = resolve(name, "smoke", [f"device={device}", *_overrides(name, list(extra))])
    if per_class is not None:
        load = runner.load_dataset
        monkeypatch.setattr(runner, "load_dataset", lambda *a, **k: shrink_dataset(load(*a, **k), per_class))
    recorder = DevicelessFactories()
    results = runner.run_experiment(cfg, tmp_path / name, data_root=data_root, progress=False,
                                    trainer=Trainer(train=recording_engine(recorder)))
    return results, recorder


def test_recorder_catches_a_deviceless_factory_call():
    """The check itself: a device-less call from pflkit code is recorded, an explicit one is not."""
    from pflkit.fl import aggregate

    recorder = DevicelessFactories()
    with recorder:
        aggregate.weighted_mean([{"w": torch.ones(2)}], [1.0])  # pflkit code, whatever it creates
        torch.zeros(3)  # made by this test, not by pflkit: not recorded
    assert not any("tests/" in k for k in recorder.calls)
    fake = compile("import torch\nx = torch.zeros(2)\ny = torch.ones(2, device='cpu')\n",
                   str(PFLKIT_DIR / "fl" / "_fake_module.py"), "exec")
    with recorder:
        exec(fake, {})
    assert "pflkit/fl/_fake_module.py:2: torch.zeros" in recorder.calls
    assert not any(k.startswith("pflkit/fl/_fake_module.py:3") for k in recorder.calls)


@pytest.mark.parametrize("name", list(CASES))
def test_smoke_run_creates_no_tensor_off_the_run_device(name, tmp_path, request, monkeypatch):
    """One smoke experiment per paper: every stage finishes and no pflkit factory call lacks a device."""
    assert name in list_experiments(), f"experiment {name!r} is gone; pick another of its paper"
    data_root = None if name == "demo" else request.getfixturevalue("shared_data")
    results, recorder = run_recorded(name, "cpu", tmp_path, data_root, CASES[name], monkeypatch=monkeypatch)
    assert results["status"] == "ok", {k: m["status"] for k, m in results["methods"].items()}
    assert not recorder.calls, (f"{name}: tensors made without a device inside the run (they land on the CPU "
                                f"whatever the run's device; pass device=...):\n{recorder.report()}")
