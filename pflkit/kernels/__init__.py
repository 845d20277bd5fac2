"""Custom ops with a pure-PyTorch reference and a Triton kernel, behind one dispatcher.

Ops (signatures and math: `pflkit.kernels.reference`; kernels: one file per op):

* `mixed_batch_norm`   beta-mixed batch norm, FedL2P Eq. 1-2      (`mixed_bn_triton.py`)
* `neumann_update`     Alg. 2 lines 3-4 over all tensors at once  (`neumann_triton.py`)
* `layerwise_sgd_step` Eq. 10, per-tensor learning rates          (`sgd_triton.py`)

Backend setting (per run: the config key and CLI flag ``kernels`` choose it, `pflkit.fl.loop.run_rounds`
enters it from ``Env.kernels`` for the stage it runs):

* ``"auto"`` (default): Triton for CUDA tensors when Triton imports and the op takes the
  inputs (e.g. not float64); the reference otherwise (CPU, MPS, Triton missing).
* ``"triton"``: always the Triton op, and a RuntimeError saying why when it cannot run it
  (no CUDA, Triton missing, or inputs it does not take: float64, running statistics that
  require grad, a Neumann update under autograd) rather than a silent fallback. Runs CUDA
  tensors, or CPU tensors when ``TRITON_INTERPRET=1`` (Triton's interpreter: slow, for
  tests; the variable must be set before anything imports triton).
* ``"reference"``: always the pure-PyTorch reference.

Whatever the setting, a graph built inside `differentiated_twice` (to be differentiated again, as
FedL2P's IFT hypergradient does) records the reference `mixed_batch_norm`.

The setting lives in a context variable: ``with use_backend("reference"): ...`` holds for
the block, in this thread and in the tasks it hands on with its context (the ``threads``
engine does), and never leaks into the next run of a notebook. Outside any block the
process default applies: ``PFLKIT_KERNELS`` at import, or `set_backend`. Importing this
package does not import Triton; `is_available` really runs each Triton op once.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import logging
import os

import torch

from pflkit.config import KERNEL_BACKENDS

from . import reference
from ._triton_common import interpreter_enabled, interpreter_usable, load_triton, triton_import_error

logger = logging.getLogger(__name__)

OPS = {"mixed_batch_norm": "mixed_bn_triton", "neumann_update": "neumann_triton",
       "layerwise_sgd_step": "sgd_triton"}
ENV_VAR = "PFLKIT_KERNELS"

__all__ = ["OPS", "mixed_batch_norm", "neumann_update", "layerwise_sgd_step", "set_backend",
           "get_backend", "use_backend", "is_available", "resolve", "validate_backend", "triton_importable",
           "differentiated_twice"]


def validate_backend(name: str) -> str:
    """Return ``name`` if it is a backend, else raise a ValueError naming it."""
    if not isinstance(name, str) or name not in KERNEL_BACKENDS:
        raise ValueError(f"kernels backend must be one of {KERNEL_BACKENDS}, got {name!r}")
    return name


def _initial_backend() -> str:
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in KERNEL_BACKENDS:
        raise ValueError(f"environment variable {ENV_VAR} must be one of {KERNEL_BACKENDS}, got {value!r}")
    return value


_default = _initial_backend()
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("pflkit_kernels", default=None)


def set_backend(name: str) -> None:
    """Select the process default, ``"auto"``, ``"triton"`` or ``"reference"``, used outside `use_backend` blocks."""
    global _default
    _default = validate_backend(name)


def get_backend() -> str:
    """The current setting (not the resolved implementation; see `resolve`)."""
    current = _current.get()
    return _default if current is None else current


@contextlib.contextmanager
def use_backend(name: str):
    """Context manager: the given backend inside the block (this context only), the previous one after it."""
    token = _current.set(validate_backend(name))
    try:
        yield
    finally:
        _current.reset(token)


_twice: contextvars.ContextVar[bool] = contextvars.ContextVar("pflkit_kernels_twice", default=False)


@contextlib.contextmanager
def differentiated_twice():
    """Context manager for building a graph that autograd differentiates again (``create_graph``):
    inside, `mixed_batch_norm` records the reference op whatever the setting.

    The Triton op's differentiable backward runs a nested autograd pass per BN layer. On an H200,
    FedL2P's IFT hypergradient of the CIFAR ResNet-18 (whose d_theta L_T graph holds those passes
    beside `pflkit.meta.conv_hvp`'s) did not finish within 50 s, where it takes 0.16 s with the
    reference op; LeNet's (the benchmark's and the digits smoke runs') and a chain of 24 Triton BN layers alone
    did finish.
    The cause was not isolated. `pflkit.meta.hypergrad` builds IFT's L_T and the exact MAML Hessian
    in this block. The other ops are not affected (`neumann_update` refuses autograd; `layerwise_sgd_step`'s
    backward launches kernels, no nested pass)."""
    token = _twice.set(True)
    try:
        yield
    finally:
        _twice.reset(token)


def triton_importable() -> bool:
    """True when ``import triton`` works (imports it on the first call)."""
    return load_triton() is not None


def _triton_module(op: str):
    return importlib.import_module(f"{__name__}.{OPS[op]}")


def _device_reason(device: torch.device | None) -> str | None:
    """Why Triton cannot run on ``device`` under the current setting, or None.

    Triton is only imported when it could run, so "auto" on CPU tensors never imports it.
    """
    if device is None:
        return "no tensors"
    # the interpreter runs CPU tensors for "triton"; "auto" never picks that slow path
    runnable = device.type == "cuda" or (device.type == "cpu" and get_backend() == "triton" and interpreter_enabled())
    if not runnable:
        if get_backend() == "auto":
            return f"{device.type} tensors (auto uses Triton for CUDA tensors only)"
        return f"{device.type} tensors need CUDA (or TRITON_INTERPRET=1 for CPU tensors)"
    if not triton_importable():
        return f"Triton is not importable ({triton_import_error()!r})"
    return None


def _pick(op: str, device: torch.device | None, args: tuple):
    """The module implementing ``op`` for these arguments under the current setting."""
    if get_backend() == "reference":
        return reference
    reason = _device_reason(device)
    module = None
    if reason is None:
        module = _triton_module(op)
        reason = module.unsupported_reason(*args)
    if reason is None:
        return module
    if get_backend() == "triton":
        raise RuntimeError(f"kernels backend 'triton': {op} cannot run with Triton: {reason}")
    _log_fallback(op, reason)
    return reference


@functools.lru_cache(maxsize=64)
def _log_fallback(op: str, reason: str) -> None:
    logger.debug("%s: using the PyTorch reference (%s)", op, reason)


def resolve(op: str, device: torch.device | str | None = None) -> str:
    """``"triton"`` or ``"reference"``: what a call of ``op`` on ``device`` would run now.

    Only the backend setting and the device are considered (not per-input limits such as
    dtype). Raises like the call would when the setting is "triton" and Triton cannot run.
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops are {sorted(OPS)}")
    device = torch.device(device) if device is not None else None
    if get_backend() == "reference":
        return "reference"
    reason = _device_reason(device)
    if reason is not None and get_backend() == "triton":
        raise RuntimeError(f"kernels backend 'triton': {op} cannot run with Triton: {reason}")
    return "reference" if reason else "triton"


def _first_device(*lists) -> torch.device | None:
    for lst in lists:
        for t in lst:
            return t.device
    return None


def mixed_batch_norm(x: torch.Tensor, pt_mean: torch.Tensor, pt_var: torch.Tensor,
                     client_mean: torch.Tensor | None, client_var: torch.Tensor | None,
                     beta: float | torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                     training: bool, momentum: float = 0.1, eps: float = 1e-5, mode: str = "mixed") -> torch.Tensor:
    """Beta-mixed batch norm (FedL2P Eq. 1-2); see `reference.mixed_batch_norm`; the reference op
    inside `differentiated_twice`."""
    if get_backend() == "reference" or (_twice.get() and torch.is_grad_enabled()):
        return reference.mixed_batch_norm(x, pt_mean, pt_var, client_mean, client_var, beta, weight, bias,
                                          training, momentum, eps, mode)
    impl = _pick("mixed_batch_norm", x.device, (x, pt_mean, pt_var, client_mean, client_var, beta, weight, bias))
    return impl.mixed_batch_norm(x, pt_mean, pt_var, client_mean, client_var, beta, weight, bias, training,
                                 momentum, eps, mode)


def neumann_update(v, hv, p, psi: float):
    """Alg. 2 lines 3-4 for every tensor: ``(v - psi hv, p + v - psi hv)``; see `reference.neumann_update`."""
    v, hv, p = list(v), list(hv), list(p)
    impl = _pick("neumann_update", _first_device(v, hv, p), (v, hv, p, psi))
    return impl.neumann_update(v, hv, p, psi)


def layerwise_sgd_step(params, grads, eta: torch.Tensor, max_lr: float | None = None) -> list[torch.Tensor]:
    """Eq. 10 with per-tensor learning rates and the clamp + STE rule; see `reference.layerwise_sgd_step`."""
    params, grads = list(params), list(grads)
    impl = _pick("layerwise_sgd_step", _first_device(params, grads), (params, grads, eta, max_lr))
    return impl.layerwise_sgd_step(params, grads, eta, max_lr)


# ---------------------------------------------------------------------------------------------
# is_available: really run each Triton op once on a tiny input and compare with the reference.
# ---------------------------------------------------------------------------------------------

def _probe_device() -> torch.device | None:
    if torch.cuda.is_available() and not interpreter_enabled():
        return torch.device("cuda")
    if interpreter_usable():
        return torch.device("cpu")
    return None


def _probe(op: str, device: torch.device) -> bool:
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    mod = _triton_module(op)
    if op == "mixed_batch_norm":
        x, stats = rnd(2, 3, 5), (rnd(3), rnd(3).abs() + 0.5, rnd(3), rnd(3).abs() + 0.5)
        args = (x, *stats, 0.3, rnd(3), rnd(3), False)
        got, want = mod.mixed_batch_norm(*args), reference.mixed_batch_norm(*args)
        return bool(torch.allclose(got, want, atol=1e-4, rtol=1e-4))
    if op == "neumann_update":
        v, hv, p = [rnd(7)], [rnd(7)], [rnd(7)]
        got, want = mod.neumann_update(v, hv, p, 0.1), reference.neumann_update(v, hv, p, 0.1)
        return all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got[0] + got[1], want[0] + want[1]))
    params, grads, eta = [rnd(5), rnd(2, 3)], [rnd(5), rnd(2, 3)], rnd(2).abs()
    got, want = mod.layerwise_sgd_step(params, grads, eta), reference.layerwise_sgd_step(params, grads, eta)
    return all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))


_probe_cache: dict[tuple, bool] = {}


def is_available(op: str | None = None) -> bool:
    """True when the Triton version of ``op`` (all ops when None) runs and matches the reference.

    Tries it on a tiny input on the GPU, or on the CPU under ``TRITON_INTERPRET=1``; the answer
    is cached per (op, device type, interpreter setting). Never raises for a broken Triton.
    """
    if op is not None and op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops are {sorted(OPS)}")
    device = _probe_device()
    if not triton_importable() or device is None:
        return False
    ok = True
    for name in ([op] if op else list(OPS)):
        key = (name, device.type, interpreter_enabled())
        if key not in _probe_cache:
            try:
                with torch.no_grad():
                    _probe_cache[key] = _probe(name, device)
            except Exception as exc:  # a compiler / driver failure means "not available"
                logger.warning("Triton %s is not available: %r", name, exc)
                _probe_cache[key] = False
        ok = ok and _probe_cache[key]
    return ok
