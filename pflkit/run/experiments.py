"""Experiments: one TOML file per table row or figure, three presets, typed overrides.

An experiment file (``pflkit/catalog/<paper>/<name>.toml``) names the data, the
partition, the model, an optional pretraining stage and the methods whose
personalized accuracy the table reports, plus the paper's published numbers.
``[experiment]`` names the ``paper``, ``table`` and ``title``; two more keys there document
a result and are read by the reproduction report only (`pflkit.report.reproduction`), so
they are not part of the configuration or its digest: ``stands_in_for`` (the paper's
dataset a stand-in replaces) and ``finding`` (what investigating the result found, shown
under its row).
``[presets.smoke|cpu|paper]`` tables hold overrides that change sizes only,
never the algorithm; where a scale-down truly needs another setting, the preset
table declares it: ``deviations = ["pretrain.momentum", ...]`` (the ``smoke`` /
``cpu`` tables declare what differs from ``paper``; each key is checked here, carried
on the config with the preset's value and printed under every table; it is not an
override). Keys of overrides (presets and ``--set``) are dotted
paths: ``data.num_clients``, ``data.partition.alpha``, ``model.options.width``,
``pretrain.rounds``, ``methods."FT (BN C)".epochs`` or ``methods.*.epochs``
(every method that has the field), ``seed``, ``seeds``.

The settings themselves, and the checks of each value, are `pflkit.run.experiment_config`'s.

`resolve` turns file + preset + overrides into a frozen `ExperimentConfig`,
checking every key and value before any data is loaded.
"""
from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path
from typing import Any

from pflkit.config import KERNEL_BACKENDS, ConfigError, coerce, from_dict, one_of, parse_override, require
from pflkit.run.experiment_config import (NO_TRAINING, NORMALIZE, ClientGroup, DataConfig, ExperimentConfig,
                                          MethodStage, ModelConfig, NoTrainingConfig, PretrainDataConfig,
                                          PretrainStage, StageConfig, check_device, check_keep_best, check_kernels,
                                          check_methods)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PRESETS = ("smoke", "cpu", "paper")


def experiments_dir() -> Path:
    """The experiment catalog, ``pflkit/catalog/<paper>/*.toml``, shipped inside the package.

    It is package data (``[tool.setuptools.package-data]`` in pyproject.toml), so a wheel or
    ``pip install git+...`` has it as well as an editable clone. (Not named ``experiments``:
    that is this module.)
    """
    from importlib import resources

    here = Path(str(resources.files("pflkit") / "catalog"))
    if not here.is_dir():
        raise FileNotFoundError(
            f"no experiment catalog at {here}; this pflkit install lacks its package data "
            "(reinstall from a wheel or a clone: `pip install .`)"
        )
    return here


def list_experiments(root: Path | None = None) -> dict[str, Path]:
    """Every experiment by name (the file stem, unique across papers)."""
    root = root or experiments_dir()
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.toml")):
        if path.stem in found:
            raise ConfigError(f"experiment name {path.stem!r} is defined twice: {found[path.stem]} and {path}")
        found[path.stem] = path
    return found


def _literal(text: str) -> Any:
    """A ``--set`` value as TOML would read it (numbers, booleans, lists), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _split_key(key: str) -> list[str]:
    """Split a dotted key, honouring double quotes: methods."FT (BN C)".epochs."""
    parts, cur, quoted = [], "", False
    for ch in key:
        if ch == '"':
            quoted = not quoted
        elif ch == "." and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    if quoted or any(p == "" for p in parts):
        raise ConfigError(f"{key!r}: malformed key")
    return parts


def apply_override(raw: dict, key: str, value: Any) -> None:
    """Set a dotted ``key`` in the raw experiment dict (``methods.*`` = every method)."""
    parts = _split_key(key)
    if parts[0] == "methods" and len(parts) >= 3 and parts[1] == "*":
        methods = raw.get("methods", {})
        hit = False
        for label, m in methods.items():
            if _field_allowed(m, parts[2:]):
                _set(m, parts[2:], value)
                hit = True
        if not hit:
            raise ConfigError(f"{key}: no method has a setting {'.'.join(parts[2:])!r}")
        return
    if parts[0] == "methods" and len(parts) >= 2 and parts[1] not in raw.get("methods", {}):
        raise ConfigError(f"{key}: no method labelled {parts[1]!r}; methods: {list(raw.get('methods', {}))}")
    if parts[0] == "pretrain" and "pretrain" not in raw:
        raise ConfigError(f"{key}: this experiment has no pretraining stage")
    _set(raw, parts, value)


def _field_allowed(method: dict, path: list[str]) -> bool:
    from pflkit.algorithms import ALGORITHMS

    algo = ALGORITHMS.get(method.get("algorithm", ""))
    return algo is not None and len(path) == 1 and path[0] in {f.name for f in dataclasses.fields(algo.config)}


def _set(d: dict, parts: list[str], value: Any) -> None:
    for p in parts[:-1]:
        d = d.setdefault(p, {})
        if not isinstance(d, dict):
            raise ConfigError(f"{'.'.join(parts)}: {p!r} is not a table")
    d[parts[-1]] = value


def _stage(label: str, raw: dict, prefix: str) -> StageConfig:
    from pflkit.algorithms import ALGORITHMS

    raw = dict(raw)
    name = raw.pop("algorithm", None)
    raw.pop("label", None)
    if name not in ALGORITHMS:
        raise ConfigError(f"{prefix}algorithm={name!r}: unknown; known: {', '.join(sorted(ALGORITHMS))}")
    return StageConfig(label, name, from_dict(ALGORITHMS[name].config, raw, prefix))


def _method_stage(label: str, raw: dict) -> MethodStage:
    """``[methods."label"]`` -> a `MethodStage`: the algorithm's settings and `METHOD_KEYS`, each checked on
    its own (how they fit the rest of the experiment: `check_methods`)."""
    raw = dict(raw)
    prefix = f"methods.{label}."
    extra = {k: raw.pop(k) for k in METHOD_KEYS if k in raw}
    base = _stage(label, raw, prefix)
    clients = extra.get("clients")
    if clients is not None:
        require(isinstance(clients, dict) and set(clients) == {"group", "of"}, f"{prefix}clients", clients,
                "must be a table { group = G, of = N }: the G-th (from 0) of N equal contiguous client groups")
        group, of = (coerce(clients[k], int, f"{prefix}clients.{k}") for k in ("group", "of"))
        require(of >= 1, f"{prefix}clients.of", of, "must be >= 1")
        require(0 <= group < of, f"{prefix}clients.group", group, f"must be in [0, {of})")
        clients = ClientGroup(group, of)
    model = extra.get("model", {})
    require(isinstance(model, dict), f"{prefix}model", model, "must be a table of model options, e.g. { width = 8 }")
    start = coerce(extra.get("start_from", ""), str, f"{prefix}start_from")
    return MethodStage(base.label, base.algorithm, base.config, clients=clients, model=dict(model), start_from=start)


METHOD_KEYS = ("clients", "model", "start_from")  # [methods.X] settings outside the algorithm's
PRETRAIN_KEYS = ("data", "new_head", "weights", "normalize")  # [pretrain] settings outside the algorithm's


def _pretrain_stage(raw: dict) -> PretrainStage:
    """``[pretrain]`` -> a `PretrainStage`, every key checked (one-line errors naming ``pretrain.KEY``)."""
    from pflkit.algorithms import ALGORITHMS

    raw = dict(raw)
    label = coerce(raw.pop("label", "Global"), str, "pretrain.label")
    extra = {k: raw.pop(k) for k in PRETRAIN_KEYS if k in raw}
    name = raw.get("algorithm")
    if name == NO_TRAINING:
        raw.pop("algorithm")
        if raw:
            raise ConfigError(f"pretrain.{sorted(raw)[0]}: algorithm 'none' trains nothing and takes no training "
                              f"settings; its settings: label, {', '.join(k for k in PRETRAIN_KEYS if k != 'data')}")
        require("data" not in extra, "pretrain.data", extra.get("data"),
                "algorithm 'none' trains nothing, so it reads no pretraining data")
        base = StageConfig(label, NO_TRAINING, NoTrainingConfig())
    else:
        if name in ALGORITHMS:
            fields = {f.name for f in dataclasses.fields(ALGORITHMS[name].config) if f.init}
            unknown = sorted(set(raw) - fields - {"algorithm"})
            if unknown:
                raise ConfigError(f"pretrain.{unknown[0]}: unknown setting; known: label, "
                                  f"{', '.join(PRETRAIN_KEYS)} and {name}'s: {', '.join(sorted(fields))}")
        elif name is not None and name not in ALGORITHMS:
            raise ConfigError(f"pretrain.algorithm={name!r}: unknown; known: {', '.join(sorted(ALGORITHMS))}, "
                              f"{NO_TRAINING} (no training: the stage is only a source of weights)")
        base = _stage(label, raw, "pretrain.")
    data = extra.get("data")
    if data is not None:
        require(isinstance(data, dict), "pretrain.data", data, "must be a table of [data] settings")
        data = from_dict(PretrainDataConfig, data, "pretrain.data.")
    new_head = coerce(extra.get("new_head", False), bool, "pretrain.new_head")
    weights = coerce(extra.get("weights", ""), str, "pretrain.weights")
    if weights:
        require(Path(weights).expanduser().is_file(), "pretrain.weights", weights, "no such file")
    normalize = coerce(extra.get("normalize", "pretrain"), str, "pretrain.normalize")
    one_of("pretrain.normalize", normalize, set(NORMALIZE))
    require(data is not None or "normalize" not in extra, "pretrain.normalize", normalize,
            "only applies with [pretrain.data] (the clients' images are normalized like the pretraining data's)")
    return PretrainStage(base.label, base.algorithm, base.config, data=data, new_head=new_head, weights=weights,
                         normalize=normalize)


def _spec_path(spec: str | Path) -> Path:
    """The TOML file an experiment argument names: a name wins over a folder of the same name.

    The argument is read as a path only when it ends in ``.toml`` or is an existing file, so
    ``pflkit demo`` still runs the built-in ``demo`` inside a directory that holds a ``demo/``
    run folder (e.g. after ``pflkit demo --out demo``).
    """
    path = Path(spec)
    if path.suffix == ".toml" or path.is_file():
        if not path.is_file():
            raise ConfigError(f"experiment file {str(spec)!r} not found")
        return path
    known = list_experiments()
    if str(spec) not in known:
        raise ConfigError(f"experiment {str(spec)!r} not found; known: {', '.join(sorted(known))}")
    return known[str(spec)]


def resolve(spec: dict | str | Path, preset: str = "cpu", overrides: list[str] | dict | None = None) -> ExperimentConfig:
    """File (or dict) + preset + overrides -> a validated `ExperimentConfig`.

    ``overrides``: ``["key=value", ...]`` (the CLI's ``--set``) or a ``{key: value}`` dict.
    """
    if isinstance(spec, (str, Path)):
        path = _spec_path(spec)
        with open(path, "rb") as f:
            raw = tomllib.load(f)
        raw.setdefault("experiment", {}).setdefault("name", path.stem)
    else:
        raw = copy.deepcopy(spec)
    one_of("preset", preset, set(PRESETS))
    presets = raw.pop("presets", {})
    unknown = set(presets) - set(PRESETS)
    require(not unknown, "presets", sorted(unknown), f"preset names must be among {PRESETS}")
    table = dict(presets.get(preset, {}))
    declared = table.pop("deviations", [])
    require(isinstance(declared, list) and all(isinstance(k, str) for k in declared),
            f"presets.{preset}.deviations", declared, "must be a list of dotted keys")
    for key, value in table.items():
        apply_override(raw, key, value)
    if isinstance(overrides, dict):
        items = list(overrides.items())
    else:
        items = [(k, _literal(v)) for k, v in (parse_override(o) for o in (overrides or []))]
    for key, value in items:
        apply_override(raw, key, value)
    cfg = _build(raw, preset)
    return dataclasses.replace(cfg, deviations=tuple(f"{k}={_declared_value(cfg, k)}" for k in declared))


def _declared_value(cfg: ExperimentConfig, key: str) -> str:
    """The value of a declared deviation ``key`` in ``cfg`` (``methods.*``: each method that has it)."""
    parts = _split_key(key)
    tree = cfg.to_dict()
    if parts[0] == "methods" and len(parts) >= 2:
        tree["methods"] = {m["label"]: m for m in tree["methods"]}
        if parts[1] == "*":
            found = {label: v for label, m in tree["methods"].items()
                     if (v := _lookup(m, parts[2:])) is not _MISSING}
            if found and parts[2:]:
                values = list(found.values())
                return f"{values[0]}" if all(v == values[0] for v in values) else f"{found}"
            parts = []  # -> the error below
    whole = {"data": 2, "model": 2, "pretrain": 2, "methods": 3}  # a whole section is not one setting
    value = _lookup(tree, parts) if parts and len(parts) >= whole.get(parts[0], 1) else _MISSING
    if value is _MISSING or parts[0] in ("deviations", "published", "published_detail", "name", "paper", "table",
                                          "title", "preset"):
        raise ConfigError(f"deviations: {key!r} is not a setting of this experiment")
    return f"{value}"


_MISSING = object()


def _lookup(tree: Any, parts: list[str]) -> Any:
    for p in parts:
        if not isinstance(tree, dict) or p not in tree:
            return _MISSING
        tree = tree[p]
    return tree


def published_detail(tree: Any, key: str = "published_detail") -> dict:
    """``[published_detail]``: the paper's numbers that are not one accuracy per method (Table 2's three
    budget groups, Table 6's ARIs), as nested tables of numbers or lists of numbers; checked up front."""
    require(isinstance(tree, dict), key, tree, "must be a table")
    for k, v in tree.items():
        if isinstance(v, dict):
            published_detail(v, f"{key}.{k}")
        else:
            values = v if isinstance(v, list) else [v]
            require(all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values), f"{key}.{k}", v,
                    "must be a number or a list of numbers")
    return dict(tree)


def _build(raw: dict, preset: str) -> ExperimentConfig:
    known = {"experiment", "data", "model", "pretrain", "methods", "published", "published_detail", "seed", "seeds",
             "kernels", "device"}
    extra = sorted(set(raw) - known)
    require(not extra, extra[0] if extra else "", raw.get(extra[0]) if extra else None, "unknown top-level setting")
    meta = raw.get("experiment", {})
    data = from_dict(DataConfig, raw.get("data", {}), "data.")
    model = from_dict(ModelConfig, raw.get("model", {}), "model.")
    pretrain = None
    if "pretrain" in raw:
        require(isinstance(raw["pretrain"], dict), "pretrain", raw["pretrain"], "must be a table")
        pretrain = _pretrain_stage(raw["pretrain"])
    methods = tuple(_method_stage(label, m) for label, m in raw.get("methods", {}).items())
    require(bool(methods) or pretrain is not None, "methods", None, "an experiment needs at least one method")
    check_methods(methods, data, model, pretrain is not None)
    seed = coerce(raw.get("seed", 0), int, "seed")
    seeds = coerce(raw.get("seeds", 1), int, "seeds")
    require(seeds >= 1, "seeds", seeds, "must be >= 1")
    kernels = coerce(raw.get("kernels", "auto"), str, "kernels")
    one_of("kernels", kernels, set(KERNEL_BACKENDS))
    device = coerce(raw.get("device", "auto"), str, "device")
    check_device(device)
    check_kernels(kernels, device)
    if pretrain is not None and pretrain.algorithm != NO_TRAINING:
        check_keep_best(pretrain.data or data, (pretrain,), "pretrain.data" if pretrain.data else "data")
    check_keep_best(data, methods)
    return ExperimentConfig(
        name=meta.get("name", "experiment"), paper=meta.get("paper", ""), table=meta.get("table", ""),
        title=meta.get("title", ""), preset=preset, data=data, model=model, pretrain=pretrain, methods=methods,
        published=dict(raw.get("published", {})), published_detail=published_detail(raw.get("published_detail", {})),
        seed=seed, seeds=seeds, kernels=kernels,
        device=device,
    )
