"""Plumbing shared by pflkit's Triton kernels (private; not a public API).

Two things live here:

* `lazy_jit`: Triton decides at *decoration* time whether a kernel is compiled or run by
  its CPU interpreter (``TRITON_INTERPRET=1``). Decorating lazily and keying the cache on
  the current setting makes the choice at *launch* time, so importing a kernel module
  before a test sets the variable does not freeze the wrong mode. Because of this, a
  kernel must not call other ``@jit`` helpers (their mode could differ); the kernels in
  this package are written self-contained for that reason.
* `MultiTensorPlan`: the bookkeeping of the multi-tensor kernels. A list of tensors is
  cut into fixed-size tiles; tile ``t`` belongs to tensor ``tile_tensor[t]`` and starts
  at element ``tile_start[t]`` of it. One launch with one program per tile then covers
  every tensor of the list; the tensors' addresses travel in an int64 table that the
  kernel casts back to pointers, so no tensor is copied into a flat buffer first.
"""
from __future__ import annotations

import functools
import math

import torch

try:  # Triton is optional: CPU-only and macOS installs do not ship it.
    import triton
    import triton.language as tl

    TRITON_IMPORT_ERROR: Exception | None = None
except Exception as exc:  # ImportError, or a broken install failing at import time
    triton = None
    tl = None
    TRITON_IMPORT_ERROR = exc


def interpreter_enabled() -> bool:
    """True when Triton would run kernels in its CPU interpreter (``TRITON_INTERPRET``)."""
    if triton is None:
        return False
    return bool(triton.knobs.runtime.interpret)


class LazyKernel:
    """A Triton kernel decorated on first launch, once per interpreter setting."""

    def __init__(self, fn):
        self.fn = fn
        self._built: dict[bool, object] = {}
        functools.update_wrapper(self, fn)

    def _kernel(self):
        if triton is None:
            raise RuntimeError(f"Triton is not importable: {TRITON_IMPORT_ERROR!r}")
        mode = interpreter_enabled()
        if mode not in self._built:
            # triton.jit reads the interpreter knob now, i.e. for the current mode.
            self._built[mode] = triton.jit(self.fn)
        return self._built[mode]

    def __getitem__(self, grid):
        return self._kernel()[grid]


def lazy_jit(fn) -> LazyKernel:
    """Decorator: like ``triton.jit`` but the compile/interpret choice is made per launch."""
    return LazyKernel(fn)


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(int(n), 1))))


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


@functools.lru_cache(maxsize=64)
def num_programs_target(device_index: int) -> int:
    """About four resident programs per SM keeps a GPU busy; 8 when no GPU is visible."""
    if torch.cuda.is_available():
        return 4 * torch.cuda.get_device_properties(device_index).multi_processor_count
    return 8


def programs_target(device: torch.device) -> int:
    if device.type == "cuda":
        return num_programs_target(device.index if device.index is not None else torch.cuda.current_device())
    return 8


class MultiTensorPlan:
    """Tile map of a list of tensor sizes (see the module docstring).

    Attributes (all on ``device``):
        tile_tensor: int32 (T,), the tensor each tile belongs to.
        tile_start: int64 (T,), the tile's first element inside its tensor.
        numels: int64 (L,), each tensor's number of elements.
        flat_start: int64 (L,), each tensor's offset in a flat buffer of all of them.
        tensor_tile_start, tensor_tiles: int32 (L,), each tensor's first tile and tile count.
    """

    def __init__(self, numels: tuple[int, ...], block: int, device: torch.device):
        tiles = [cdiv(n, block) for n in numels]
        tile_tensor, tile_start, first = [], [], []
        for i, k in enumerate(tiles):
            first.append(len(tile_tensor))
            tile_tensor.extend([i] * k)
            tile_start.extend(range(0, k * block, block))
        flat = [0]
        for n in numels[:-1]:
            flat.append(flat[-1] + n)
        self.block = block
        self.num_tiles = len(tile_tensor)
        self.total = sum(numels)
        self.tile_tensor = torch.tensor(tile_tensor, dtype=torch.int32, device=device)
        self.tile_start = torch.tensor(tile_start, dtype=torch.int64, device=device)
        self.numels = torch.tensor(numels, dtype=torch.int64, device=device)
        self.flat_start = torch.tensor(flat, dtype=torch.int64, device=device)
        self.tensor_tile_start = torch.tensor(first, dtype=torch.int32, device=device)
        self.tensor_tiles = torch.tensor(tiles, dtype=torch.int32, device=device)


@functools.lru_cache(maxsize=256)
def _plan(numels: tuple[int, ...], block: int, device: torch.device) -> MultiTensorPlan:
    return MultiTensorPlan(numels, block, device)


def plan_for(tensors, block: int) -> MultiTensorPlan:
    """The cached tile map of ``tensors`` (depends only on their sizes and device)."""
    return _plan(tuple(t.numel() for t in tensors), block, tensors[0].device)


def pointer_table(*lists) -> torch.Tensor:
    """int64 (len(lists), L) table of data pointers, built on the host and copied once."""
    device = lists[0][0].device
    rows = [[t.data_ptr() for t in lst] for lst in lists]
    return torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)


def check_same_device(name: str, tensors) -> None:
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"{name}: all tensors must be on one device, got {sorted(map(str, devices))}")


def group_by_dtype(tensors) -> dict[torch.dtype, list[int]]:
    """Indices of ``tensors`` grouped by dtype (one launch per group: pointers are typed)."""
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return groups


def split_flat(flat: torch.Tensor, like) -> list[torch.Tensor]:
    """Views of a flat buffer shaped like the tensors of ``like``."""
    parts = torch.split(flat, [t.numel() for t in like])
    return [part.view(t.shape) for part, t in zip(parts, like)]
