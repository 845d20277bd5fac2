"""pflkit messages and payloads <-> Flower records.

pflkit's phases exchange plain Python structures: nested dicts (string or integer
keys), lists, tuples and dataclasses of tensors and scalars, None included
(FedAvg's state dict, FedL2P's ``{"weights", "lam"}``, pFedHN's ``{"theta",
"width"}``, FedSelect's sparse values with packed bit masks, pFedVEM's
posteriors). Flower moves `RecordDict` objects whose records hold either named
arrays (`ArrayRecord`) or flat scalars (`ConfigRecord`). `to_record` splits a
structure into the two: every tensor / ndarray goes into one ArrayRecord under a
numbered key, and the structure around them (containers, scalars, dtypes) is one
JSON string in a ConfigRecord. `from_record` reverses it exactly: same types,
dtypes (bfloat16 too), shapes, values, and the same aliasing (a tensor referenced
twice is sent once and comes back as one tensor).

The JSON skeleton uses tagged objects for containers (``{"t": "dict", ...}``) and
plain JSON for scalars, so it never needs pickle: a node cannot make another one
run code. Dataclasses are rebuilt only from ``pflkit`` modules for that reason.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

ARRAYS, TREE = "arrays", "tree"
_NUMPY_UNSUPPORTED = {torch.bfloat16: torch.int16}  # sent as the same bits under an integer dtype


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _Encoder:
    """One pass over a structure: tensors into ``arrays``, the rest into a JSON-able tree."""

    def __init__(self):
        self.arrays: dict[str, Array] = {}
        self.seen: dict[int, str] = {}  # id(tensor) -> key: aliasing survives the trip
        self.keep: list = []  # keep encoded objects alive so their ids stay unique

    def array_key(self, obj, make) -> str:
        key = self.seen.get(id(obj))
        if key is None:
            key = self.seen[id(obj)] = str(len(self.arrays))
            self.arrays[key] = make()
            self.keep.append(obj)
        return key

    def tensor(self, t: torch.Tensor) -> dict:
        def make():
            data = t.detach().cpu().contiguous()
            if data.dtype in _NUMPY_UNSUPPORTED:
                data = data.view(_NUMPY_UNSUPPORTED[data.dtype])
            return Array(data.numpy())

        node = {"t": "tensor", "k": self.array_key(t, make), "dtype": _dtype_name(t.dtype)}
        if t.requires_grad:
            node["grad"] = True
        return node

    def __call__(self, obj: Any, path: str = "$"):
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, np.ndarray):
            return {"t": "ndarray", "k": self.array_key(obj, lambda: Array(obj))}
        if isinstance(obj, np.generic):
            return {"t": "npscalar", "dtype": str(obj.dtype), "v": obj.item()}
        if isinstance(obj, torch.dtype):
            return {"t": "dtype", "v": _dtype_name(obj)}
        if isinstance(obj, torch.Size):
            return {"t": "size", "v": list(obj)}
        if isinstance(obj, dict):
            return {"t": "dict", "v": [[self(k, f"{path}.key"), self(v, f"{path}[{k!r}]")] for k, v in obj.items()]}
        if isinstance(obj, (list, tuple)):
            tag = "list" if isinstance(obj, list) else "tuple"
            return {"t": tag, "v": [self(v, f"{path}[{i}]") for i, v in enumerate(obj)]}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            cls = type(obj)
            fields = {f.name: self(getattr(obj, f.name), f"{path}.{f.name}") for f in dataclasses.fields(obj)}
            return {"t": "dataclass", "cls": f"{cls.__module__}:{cls.__qualname__}", "v": fields}
        raise TypeError(f"to_record: cannot send {type(obj).__name__} at {path}; pflkit messages hold tensors, "
                        "arrays, scalars, strings, None and dicts / lists / tuples / dataclasses of them")


def to_record(obj: Any) -> RecordDict:
    """A structure of tensors and scalars as a RecordDict (``"arrays"`` + ``"tree"``).

    Raises:
        TypeError: naming the path of a value that cannot travel (a module, a function, ...).
    """
    enc = _Encoder()
    tree = enc(obj)
    return RecordDict({ARRAYS: ArrayRecord(enc.arrays), TREE: ConfigRecord({TREE: json.dumps(tree)})})


def _dataclass(name: str) -> type:
    module, _, qualname = name.partition(":")
    if module != "pflkit" and not module.startswith("pflkit."):
        raise TypeError(f"from_record: refusing to build {name}: only pflkit dataclasses travel")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not dataclasses.is_dataclass(obj):
        raise TypeError(f"from_record: {name} is not a dataclass")
    return obj


class _Decoder:
    def __init__(self, arrays: ArrayRecord):
        self.arrays = arrays
        self.cache: dict[str, Any] = {}

    def tensor(self, node: dict) -> torch.Tensor:
        key = node["k"]
        if key not in self.cache:
            dtype = getattr(torch, node["dtype"])
            t = torch.from_numpy(np.array(self.arrays[key].numpy()))  # a writable copy torch can own
            if dtype in _NUMPY_UNSUPPORTED:
                t = t.view(dtype)
            self.cache[key] = t.requires_grad_(True) if node.get("grad") else t
        return self.cache[key]

    def __call__(self, node):
        if not isinstance(node, dict):
            return node
        tag, v = node["t"], node.get("v")
        if tag == "tensor":
            return self.tensor(node)
        if tag == "ndarray":
            if node["k"] not in self.cache:
                self.cache[node["k"]] = np.array(self.arrays[node["k"]].numpy())
            return self.cache[node["k"]]
        if tag == "npscalar":
            return np.dtype(node["dtype"]).type(v)
        if tag == "dtype":
            return getattr(torch, v)
        if tag == "size":
            return torch.Size(v)
        if tag == "dict":
            return {self(k): self(x) for k, x in v}
        if tag == "list":
            return [self(x) for x in v]
        if tag == "tuple":
            return tuple(self(x) for x in v)
        if tag == "dataclass":
            cls = _dataclass(node["cls"])
            values = {k: self(x) for k, x in v.items()}
            init = {f.name for f in dataclasses.fields(cls) if f.init}
            obj = cls(**{k: x for k, x in values.items() if k in init})
            for k, x in values.items():
                if k not in init:
                    object.__setattr__(obj, k, x)
            return obj
        raise ValueError(f"from_record: unknown node tag {tag!r}")


def from_record(record: RecordDict) -> Any:
    """The structure `to_record` packed into ``record``."""
    if TREE not in record or ARRAYS not in record:
        raise ValueError(f"from_record: expected records {ARRAYS!r} and {TREE!r}, got {sorted(record)}")
    return _Decoder(record[ARRAYS])(json.loads(record[TREE][TREE]))


def put(target: RecordDict, key: str, obj: Any) -> RecordDict:
    """Store ``obj`` inside an existing RecordDict (a message's content, ``Context.state``) under ``key``."""
    rec = to_record(obj)
    target[f"{key}.{ARRAYS}"] = rec[ARRAYS]
    target[f"{key}.{TREE}"] = rec[TREE]
    return target


def get(source: RecordDict, key: str, default: Any = KeyError) -> Any:
    """The object `put` stored under ``key`` (``default`` if absent; KeyError if no default)."""
    if f"{key}.{TREE}" not in source:
        if default is KeyError:
            raise KeyError(f"no pflkit object {key!r} in the record (has {sorted(source)})")
        return default
    return from_record(RecordDict({ARRAYS: source[f"{key}.{ARRAYS}"], TREE: source[f"{key}.{TREE}"]}))


def has(source: RecordDict, key: str) -> bool:
    return f"{key}.{TREE}" in source


def drop(target: RecordDict, key: str) -> None:
    """Remove what `put` stored under ``key`` (no error if absent)."""
    for part in (ARRAYS, TREE):
        if f"{key}.{part}" in target:
            del target[f"{key}.{part}"]


def tensors_in(obj) -> list[torch.Tensor]:
    """Every tensor inside nested dicts / lists / tuples (depth first, repeats included)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_in(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_in(v)]
    return []


def record_nbytes(record: RecordDict) -> int:
    """Tensor bytes in a RecordDict's ArrayRecords (what `pflkit.fl.engines.nbytes` counts, each tensor once)."""
    total = 0
    for rec in record.values():
        for arr in rec.values() if isinstance(rec, ArrayRecord) else ():
            total += int(np.prod(arr.shape, dtype=np.int64)) * np.dtype(arr.dtype).itemsize
    return total
