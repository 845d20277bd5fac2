"""Rerun chosen stages of committed results and keep every other stage (`pflkit reproduce --stages`).

A change that moves one algorithm's numbers (say FT (BN C)'s start, `pflkit.algorithms.finetune`) stales
only that algorithm's stages (`pflkit.batch.behaviour`), but a compact result keeps no weights, so a stage that
starts from the pretrained model cannot be trained again alone. `restage_one` trains the stage together
with the stages it starts from (its upstream chain, `pflkit.batch.reuse.stage_upstreams`) in a work folder, and
splices the new stage into the committed result only when every upstream stage it trained again gives the
committed record back exactly: the same per-client accuracies and the same per-round history. Then the
new stage started from the very model the committed row's other stages started from, and nothing in the
row mixes two models.

An upstream that does not come back exactly (the row was made on other hardware: AVX2 and AVX512 kernels
round differently, and training amplifies it) leaves the committed result untouched, and the outcome says
so: that row must be rerun whole. A row the result says was made with AVX2 is rerun, on a CPU with AVX512,
in worker processes started on torch's, oneDNN's and MKL's AVX2 code paths (`AVX2_PATHS`); the check then
confirms or refutes that this gave the row's arithmetic back. The batch process itself keeps the native
paths: the stages' behavioural fingerprints (`pflkit.batch.behaviour`) are micro-runs on this machine's own.

The result records what was done in ``restaged``: the stages, the upstream stages verified, the hardware
and the seconds, shown in REPRODUCTION.md beside the row.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from functools import partial
from pathlib import Path

import torch

from pflkit.batch.behaviour import BehaviourCache, stage_fingerprints, untimed
from pflkit.batch.outcomes import DONE, FAILED, NOT_RUN, SKIPPED, Outcome, one_line
from pflkit.batch.pool import in_turn
from pflkit.batch.selection import select
from pflkit.batch.versions import code_version, config_hash
from pflkit.batch.work_folder import MARKER
from pflkit.data.base import DatasetNotFoundError
from pflkit.io import read_json, write_json
from pflkit.report.compact import compact_path, compact_result, config_digest
from pflkit.run.experiments import resolve

__all__ = ["stage_chain", "restage_one", "restage", "upstream_mismatch", "splice", "worker_paths",
           "retry_on_avx2"]

UNREPRODUCED = "did not reproduce"  # an outcome's reason when an upstream stage did not give the row back
# torch's, oneDNN's and MKL's switches to their AVX2 code paths: read once, when each library starts in a process
AVX2_PATHS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def stage_chain(upstreams: dict[str, str | None], labels) -> list[str]:
    """``labels`` and every stage they start from, directly or through others, in the file's stage order."""
    need, todo = set(), list(labels)
    while todo:
        label = todo.pop()
        if label not in upstreams:
            raise ValueError(f"no stage {label!r}; the stages are {', '.join(upstreams)}")
        if label not in need:
            need.add(label)
            if upstreams[label]:
                todo.append(upstreams[label])
    return [label for label in upstreams if label in need]


def _acc(method: dict) -> str:
    return "n/a" if method.get("acc_mean") is None else f"{method['acc_mean']:.2f}"


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def upstream_mismatch(committed: dict, new: dict, upstream: list[str]) -> str:
    """"" when every stage of ``upstream`` has the same per-client accuracies and per-round history in the
    compact results ``committed`` and ``new`` (the history less its timings, `pflkit.batch.behaviour.untimed`); else
    what differs first (``"Global: 9.00 -> 12.67"``)."""
    for label in upstream:
        old_m, new_m = committed["methods"][label], new["methods"][label]
        if not _same(old_m.get("per_client"), new_m.get("per_client")):
            return f"{label}: {_acc(old_m)} -> {_acc(new_m)}"
        old_h, new_h = (committed.get("history") or {}).get(label), (new.get("history") or {}).get(label)
        if not _same(untimed(old_h), untimed(new_h)):
            return f"{label}: the same accuracy ({_acc(old_m)}) by another training history"
    return ""


def splice(committed: dict, new: dict, labels: list[str], upstream: list[str], *, code: dict | None,
           stages: dict | None, seconds: float) -> dict:
    """``committed`` with the stages ``labels`` taken from the compact result ``new`` (method entry, history,
    analysis, engine), its fingerprint brought to ``code`` / ``stages`` and a ``restaged`` record added."""
    from pflkit.run.results import worst_status

    out = json.loads(json.dumps(committed))
    for label in labels:
        out["methods"][label] = {**new["methods"][label], "published": committed["methods"][label].get("published")}
        out.setdefault("history", {})[label] = (new.get("history") or {}).get(label)
        analysis = out.setdefault("analysis", {})
        if label in (new.get("analysis") or {}):
            analysis[label] = new["analysis"][label]
        else:
            analysis.pop(label, None)
        engines = out.setdefault("environment", {}).setdefault("engine_used", {})
        engines[label] = (new.get("environment") or {}).get("engine_used", {}).get(label, engines.get(label))
    out["status"] = worst_status(m["status"] for m in out["methods"].values())
    out["fingerprint"] = {**out.get("fingerprint", {}), "code": code, **({"stages": stages} if stages else {})}
    env = new.get("environment") or {}
    out["restaged"] = [*committed.get("restaged", []), {
        "stages": list(labels), "upstream_reproduced": list(upstream),
        "cpu_capability": env.get("cpu_capability"), "gpu": env.get("gpu"),
        "emulated": os.environ.get("ATEN_CPU_CAPABILITY") is not None,  # torch told to use fewer instructions
        "version": new.get("version", {}), "seconds": round(seconds, 1)}]
    return out


def _with_methods(config: dict, methods: dict[str, dict], labels) -> dict:
    """A resolved configuration's dict with the method entries of ``labels`` taken from ``methods`` (by label)."""
    return {**config, "methods": [methods[m["label"]] if m["label"] in labels else m for m in config["methods"]]}


def other_settings_match(committed: dict, config: dict, labels) -> bool:
    """Whether the resolved configuration ``config`` (``ExperimentConfig.to_dict()``) is the committed one
    but for the settings of the methods ``labels`` (the stages being rerun: their own settings may change)."""
    ours = json.loads(json.dumps(config, default=str))
    theirs = {m["label"]: m for m in ours["methods"]}
    return config_digest(_with_methods(committed, theirs, labels)) == config_digest(ours)


def _sub_config(cfg, chain: list[str]):
    """``cfg`` with only the stages of ``chain`` (the pretraining stage kept only when in it)."""
    pretrain = cfg.pretrain if cfg.pretrain is not None and cfg.pretrain.label in chain else None
    return dataclasses.replace(cfg, pretrain=pretrain, methods=tuple(m for m in cfg.methods if m.label in chain))


def restage_one(cfg, folder: Path, compact: Path, labels, *, code: dict | None, stages: dict | None = None,
                data_root=None, download: bool = False):
    """Train the stages ``labels`` of experiment ``cfg`` again with their upstream chain in ``folder`` and
    splice them into the compact result ``compact`` when the chain reproduces it (module docstring).
    Returns a `pflkit.batch.outcomes.Outcome`; the committed result is written only when it is ``done`` (a run that
    raises comes back as ``failed`` with the error, or ``not run`` when its data are missing)."""
    # reuse and the runner load every algorithm and dataset: only a worker that reruns stages needs them
    from pflkit.batch.reuse import fingerprinted_config, stage_upstreams
    from pflkit.run.folder import RunMismatchError, holds_a_run
    from pflkit.run.runner import run_experiment

    if not compact.exists():
        return Outcome(cfg.name, NOT_RUN, "no committed result to rerun stages of")
    committed = read_json(compact)
    todo = [label for label in labels if label in committed.get("methods", {})]
    if not todo:
        return Outcome(cfg.name, SKIPPED, f"has none of {', '.join(labels)}")
    if not other_settings_match(committed.get("config", {}), cfg.to_dict(), todo):
        return Outcome(cfg.name, NOT_RUN, "settings other than those of the stages rerun changed since the "
                                          "committed result: rerun it whole")
    chain = stage_chain(stage_upstreams(fingerprinted_config(cfg)), todo)
    upstream = [label for label in chain if label not in todo]
    sub = _sub_config(cfg, chain)
    t0 = time.perf_counter()
    kwargs = dict(data_root=data_root, download=download, progress=False)
    marker = folder / MARKER
    key = {"config": config_hash(sub), "code": code, "stages": stages, "paths": os.environ.get("ATEN_CPU_CAPABILITY")}
    resume = holds_a_run(folder) and marker.exists() and read_json(marker) == json.loads(json.dumps(key))
    folder.mkdir(parents=True, exist_ok=True)
    write_json(marker, key)  # a stopped rerun resumes only with the same stages, settings and code
    try:
        try:
            results = run_experiment(sub, folder, resume=resume, overwrite=not resume, **kwargs)
        except RunMismatchError:  # the same settings, other data files: start over
            results = run_experiment(sub, folder, overwrite=True, **kwargs)
    except DatasetNotFoundError as e:
        return Outcome(cfg.name, NOT_RUN, f"data missing: {e.name}", time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - one failed row must not stop the batch; the committed result stays
        return Outcome(cfg.name, FAILED, one_line(e), time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    new = compact_result(results, folder, cfg_hash=config_hash(sub), code=code)
    differs = upstream_mismatch(committed, new, upstream)
    if differs:
        made = (committed.get("environment") or {}).get("cpu_capability")
        here = torch.backends.cpu.get_cpu_capability()
        hint = f" (it was made with {made}, this rerun used {here})" if made and made != here else ""
        return Outcome(cfg.name, FAILED, f"{differs} {UNREPRODUCED}, so the committed row is kept: "
                                         f"rerun it whole{hint}", seconds)
    result = splice(committed, new, todo, upstream, code=code, stages=stages, seconds=seconds)
    result["config"] = _with_methods(committed["config"], {m["label"]: m for m in new["config"]["methods"]}, todo)
    result["fingerprint"]["config"] = config_hash(cfg)
    if config_digest(result["config"]) != result["fingerprint"]["config"]:
        return Outcome(cfg.name, FAILED, "the spliced configuration is not the experiment's: left as it was", seconds)
    write_json(compact, result)
    moved = [f"{label} {_acc(committed['methods'][label])} -> {_acc(new['methods'][label])}"
             for label in todo]
    return Outcome(cfg.name, DONE, "; ".join(moved) + f" ({', '.join(upstream) or 'no upstream'} reproduced)",
                   seconds)


def restage(labels, preset: str = "cpu", *, paper: str | None = None, only: str | None = None,
            results_dir="results", work_dir=None, overrides=(), data_root=None, download: bool = False,
            force: bool = False, catalog: Path | None = None, jobs: int = 1) -> list:
    """`restage_one` for every selected experiment whose committed result holds one of ``labels``, ``jobs``
    at a time; a result whose stages' behavioural fingerprints already match this code is skipped (unless
    ``force``), so a stopped batch picks up where it stopped. Work folders: ``work_dir/_stages/<name>``."""
    labels = [str(label) for label in labels]
    if not labels or any(not label.strip() for label in labels):
        raise ValueError(f"--stages needs stage labels, got {labels!r}")
    selection = select(paper, only, catalog)
    committed = {name: read_json(compact_path(results_dir, preset, name)) for name in selection
                 if compact_path(results_dir, preset, name).exists()}
    held = {label for res in committed.values() for label in labels if label in res.get("methods", {})}
    unknown = [label for label in labels if label not in held]
    if unknown:
        raise ValueError(f"no committed result of the selection has the stage {unknown[0]!r}")
    code = code_version()
    cache, work = BehaviourCache(results_dir, code), Path(work_dir or Path("runs") / "reproduce" / preset) / "_stages"
    native, outcomes, groups = torch.backends.cpu.get_cpu_capability(), [], {}
    for name, res in committed.items():
        have = [label for label in labels if label in res.get("methods", {})]
        if not have:
            continue
        path = selection[name]
        cfg = resolve(path, preset, [*res.get("overrides", []), *overrides])
        stages = stage_fingerprints(cfg, path, code, cache, list(res.get("overrides", [])))
        stored = (res.get("fingerprint") or {}).get("stages") or {}
        if not force and all(stored.get(label) == stages.get(label) for label in have):
            outcomes.append(Outcome(name, SKIPPED, f"{', '.join(have)} up to date"))
            continue
        call = partial(restage_one, cfg, work / name, compact_path(results_dir, preset, name), have, code=code,
                       stages=stages, data_root=data_root, download=download)
        groups.setdefault(worker_paths(res, native), []).append((call, name))
    cache.save()
    # a row that does not say what it was made on, and does not reproduce on this CPU's own paths, may have been
    # made with AVX2: it is tried once more on those
    unrecorded = {name for name, res in committed.items() if not (res.get("environment") or {}).get("cpu_capability")}
    by_name = {name: call for calls in groups.values() for call, name in calls}
    retry, first = [], {}
    for paths, calls in groups.items():
        for o in _run_group(paths, calls, int(jobs)):
            if not paths and retry_on_avx2(o, o.name in unrecorded, native):
                retry.append((by_name[o.name], o.name))
                first[o.name] = o
            else:
                outcomes.append(o)
    for o in _run_group(tuple(sorted(AVX2_PATHS.items())), retry, int(jobs)) if retry else ():
        why = f"{o.reason}; on this CPU's own paths: {first[o.name].reason}" if o.status == FAILED else (
            f"{o.reason}, on the AVX2 paths (this CPU's own did not reproduce it)")
        outcomes.append(dataclasses.replace(o, reason=why, seconds=o.seconds + first[o.name].seconds))
    return outcomes


def _run_group(paths: tuple, calls, jobs: int):
    """The outcomes of ``calls``, in their order, in ``jobs`` spawned worker processes started on the code paths
    ``paths`` (none: this process's), even for one job (a fresh process reads them as it starts). Each worker
    has one intra-op thread, as the batch's workers on a machine with as many cores as jobs and the behavioural
    micro-runs: a reduction split over more threads rounds differently (an evaluation loss then differs in its
    last digit, and the upstream check fails on it)."""
    with _environment(dict(paths)):  # the workers start on these code paths, this process keeps its own
        return list(in_turn(calls, jobs, processes=True, ordered=True, threads=1, in_process=False))


def retry_on_avx2(outcome, unrecorded: bool, native: str) -> bool:
    """Whether a row rerun on this CPU's own code paths gets one more try on the AVX2 paths: its upstream did
    not reproduce, the result does not say what it was made on (``unrecorded``) and this CPU has AVX512."""
    return unrecorded and native.startswith("AVX512") and outcome.status == FAILED and UNREPRODUCED in outcome.reason


def worker_paths(committed: dict, native: str) -> tuple:
    """The environment (as sorted pairs) a worker rerunning ``committed`` needs: `AVX2_PATHS` when the row
    was made with AVX2 and this CPU (``native``, torch's capability) has more; else none."""
    made = (committed.get("environment") or {}).get("cpu_capability")
    return tuple(sorted(AVX2_PATHS.items())) if made == "AVX2" and native.startswith("AVX512") else ()


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
