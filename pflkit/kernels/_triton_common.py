"""Plumbing shared by pflkit's Triton kernels (private; not a public API).

* Triton is imported lazily (`load_triton`): importing pflkit never imports it, and a
  missing or broken install only turns the Triton backend off.
* `lazy_jit`: kernels are jitted on first launch, once per mode (compiled or Triton's CPU
  interpreter, ``TRITON_INTERPRET=1``). For each mode the module's ``@lazy_jit`` functions
  (kernels and the device helpers they call) are jitted together into a private copy of
  the module namespace, with ``tl`` bound to ``triton.language``, so a kernel always calls
  helpers of its own mode. Triton's own library functions (``tl.sum``, ``tl.zeros``) are
  jitted when triton is *imported*, so the interpreter only works when
  ``TRITON_INTERPRET=1`` was set before that import (`interpreter_usable` checks it).
* `MultiTensorPlan`: the bookkeeping of the multi-tensor kernels. A list of tensors is
  cut into fixed-size tiles; tile ``t`` belongs to tensor ``tile_tensor[t]`` and is its
  ``tile_index[t]``-th tile. One launch with one program per tile covers every tensor of
  the list; the tensors' addresses travel in an int64 table that the kernel casts back to
  pointers, so no tensor is copied into a flat buffer first.
"""
from __future__ import annotations

import functools
import math
import os
import sys
import types

import torch

_TRITON: dict = {}


def load_triton():
    """The ``triton`` module, or None when it cannot be imported (reason: `triton_import_error`)."""
    if "module" not in _TRITON:
        try:  # Triton is optional: CPU-only and macOS installs do not ship it.
            import triton
            import triton.language  # noqa: F401

            _TRITON["module"], _TRITON["error"] = triton, None
        except Exception as exc:  # ImportError, or a broken install failing at import time
            _TRITON["module"], _TRITON["error"] = None, exc
    return _TRITON["module"]


def triton_import_error() -> Exception | None:
    load_triton()
    return _TRITON["error"]


def interpreter_enabled() -> bool:
    """True when ``TRITON_INTERPRET`` asks for Triton's CPU interpreter (parsed as Triton does)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def interpreter_usable() -> bool:
    """True when the interpreter is requested and Triton's library was imported for it."""
    triton = load_triton()
    if triton is None or not interpreter_enabled():
        return False
    return type(triton.language.zeros).__name__ == "InterpretedFunction"


def _check_library_mode(triton, interpret: bool) -> None:
    library_interpreted = type(triton.language.zeros).__name__ == "InterpretedFunction"
    if library_interpreted != interpret:
        raise RuntimeError(
            f"TRITON_INTERPRET is {'set' if interpret else 'unset'} now but was "
            f"{'set' if library_interpreted else 'unset'} when triton was imported; Triton's library "
            "functions follow the setting at import time. Set TRITON_INTERPRET=1 before anything imports "
            "triton (torchvision does), e.g. at the top of tests/conftest.py.")


class LazyKernel:
    """A Triton function (kernel or device helper) jitted on first use, once per mode."""

    def __init__(self, fn):
        self.fn = fn
        functools.update_wrapper(self, fn)

    def jitted(self):
        """The ``triton.jit`` version of this function for the current interpreter setting."""
        triton = load_triton()
        if triton is None:
            raise RuntimeError(f"Triton is not importable: {triton_import_error()!r}")
        interpret = interpreter_enabled()
        _check_library_mode(triton, interpret)
        return _namespace(triton, self.fn.__module__, interpret)[self.fn.__name__]

    def __getitem__(self, grid):
        return self.jitted()[grid]


_NAMESPACES: dict[tuple[str, bool], dict] = {}


def _namespace(triton, module_name: str, interpret: bool) -> dict:
    """A copy of the module's globals with every LazyKernel replaced by its jitted clone.

    The clones share the code objects of the originals but resolve globals in the copy,
    so a kernel jitted for the interpreter calls the interpreter's helpers and vice versa.
    ``triton.jit`` reads the interpreter setting when it decorates, i.e. now.
    """
    key = (module_name, interpret)
    if key not in _NAMESPACES:
        module = sys.modules[module_name]
        ns = dict(vars(module))
        ns["tl"], ns["triton"] = triton.language, triton
        for name, obj in vars(module).items():
            if isinstance(obj, LazyKernel):
                f = obj.fn
                clone = types.FunctionType(f.__code__, ns, f.__name__, f.__defaults__, f.__closure__)
                clone.__qualname__, clone.__module__ = f.__qualname__, f.__module__
                clone.__doc__, clone.__annotations__ = f.__doc__, dict(f.__annotations__)
                # triton.jit reads TRITON_INTERPRET now; make it match the requested mode.
                ns[name] = _jit_in_mode(triton, clone, interpret)
        _NAMESPACES[key] = ns
    return _NAMESPACES[key]


def _jit_in_mode(triton, fn, interpret: bool):
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        return triton.jit(fn)
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


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

    Attributes (index tensors on ``device``):
        tile_tensor: int32 (T,), the tensor each tile belongs to.
        tile_index: int32 (T,), the tile's index inside its tensor (it starts at element
            ``tile_index * block``; a product with the constexpr block lets the compiler
            prove alignment and vectorize).
        numels: int64 (L,), each tensor's number of elements.
        flat_start: int64 (L,), each tensor's offset in a flat buffer of all of them,
            rounded up to ``align`` elements (16 bytes) so views of it stay aligned.
        tensor_tile_start, tensor_tiles: int32 (L,), each tensor's first tile and tile count.
        total: the flat buffer's length (padding included).
    """

    def __init__(self, numels: tuple[int, ...], block: int, align: int, device: torch.device):
        tiles = [cdiv(n, block) for n in numels]
        tile_tensor, tile_index, first, flat = [], [], [], []
        offset = 0
        for i, (n, k) in enumerate(zip(numels, tiles)):
            first.append(len(tile_tensor))
            tile_tensor.extend([i] * k)
            tile_index.extend(range(k))
            flat.append(offset)
            offset += cdiv(n, align) * align
        self.block, self.align = block, align
        self.num_tiles = len(tile_tensor)
        self.total = offset
        self.sizes = list(numels)
        self.tile_tensor = torch.tensor(tile_tensor, dtype=torch.int32, device=device)
        self.tile_index = torch.tensor(tile_index, dtype=torch.int32, device=device)
        self.numels = torch.tensor(numels, dtype=torch.int64, device=device)
        self.flat_start = torch.tensor(flat, dtype=torch.int64, device=device)
        self.flat_start_list = flat
        self.tensor_tile_start = torch.tensor(first, dtype=torch.int32, device=device)
        self.tensor_tiles = torch.tensor(tiles, dtype=torch.int32, device=device)


@functools.lru_cache(maxsize=256)
def _plan(numels: tuple[int, ...], block: int, align: int, device: torch.device) -> MultiTensorPlan:
    return MultiTensorPlan(numels, block, align, device)


def plan_for(tensors, block: int) -> MultiTensorPlan:
    """The cached tile map of ``tensors`` (depends only on their sizes, dtype size and device)."""
    align = max(1, 16 // tensors[0].element_size())
    return _plan(tuple(t.numel() for t in tensors), block, align, tensors[0].device)


def all_aligned(*lists) -> bool:
    """True when every tensor starts on a 16-byte boundary (lets kernels assume it)."""
    return all(t.data_ptr() % 16 == 0 for lst in lists for t in lst)


def pointer_table(*lists) -> torch.Tensor:
    """int64 (len(lists), L) table of data pointers, built on the host and copied once."""
    device = lists[0][0].device
    rows = [[t.data_ptr() for t in lst] for lst in lists]
    return torch.tensor(rows, dtype=torch.int64, device="cpu").to(device, non_blocking=True)


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


def split_flat(flat: torch.Tensor, like, plan: MultiTensorPlan) -> list[torch.Tensor]:
    """Views of a flat buffer laid out by ``plan``, shaped like the tensors of ``like``."""
    return [flat[start:start + t.numel()].view(t.shape) for start, t in zip(plan.flat_start_list, like)]
