"""results.json's numbers: every seed's stage records aggregated per method.

A method's accuracy is the mean over its clients of each client's test accuracy, in percent, averaged
over seeds (``acc_std``: standard deviation over seeds, ``acc_sem``: standard error of their mean, as
pFedVEM's tables); it is reported only when every seed is ``ok``. A run's status is the worst of its
methods' (`STATUS_ORDER`).
"""
from __future__ import annotations

import math

import numpy as np

from pflkit.run.environment import version_info
from pflkit.run.experiment_config import ExperimentConfig


def _percent(acc) -> float | None:
    """A client's test accuracy in %, None where it has none: a NaN in memory, a null once read back
    from a stage record on resume (JSON has no NaN), so None never reaches arithmetic."""
    return 100.0 * acc if acc is not None and math.isfinite(acc) else None


def _pool_acc(record: dict, ids: list[int]) -> float:
    return 100.0 * float(np.mean([record["per_client"][i]["acc"] for i in ids]))


STATUS_ORDER = ("diverged", "incomplete", "ok")  # the worst status of the parts is the status of the whole


def worst_status(statuses) -> str:
    statuses = set(statuses)
    return next((s for s in STATUS_ORDER if s in statuses), "ok")


def standard_error(values: list[float]) -> float | None:
    """Standard error of the mean over seeds, s / sqrt(n) with the sample deviation (None for one seed)."""
    return float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None


def _method_entry(label: str, algorithm: str, per_seed_records: list[dict], published,
                  pools: list[dict[str, list[int]]], seeds: list[int]) -> dict:
    """Summary of one method over seeds; with an unseen pool, acc_* are over seen clients.

    Accuracies are reported only when every seed is ``ok`` (each client has a finite test
    accuracy); ``missing`` then names each client without one and why, per seed. ``acc_std`` is the
    standard deviation over seeds, ``acc_sem`` the standard error of their mean (pFedVEM's tables).
    """
    ok = [(r, p) for r, p in zip(per_seed_records, pools) if r["status"] == "ok"]
    accs = [_pool_acc(r, p["seen"]) for r, p in ok]
    unseen = [_pool_acc(r, p["unseen"]) for r, p in ok if p["unseen"]]
    status = worst_status(r["status"] for r in per_seed_records)
    rounds = [r["history"] for r in per_seed_records]
    bytes_round = [np.mean([h["bytes_down"] + h["bytes_up"] for h in hist]) for hist in rounds if hist]
    return {
        "algorithm": algorithm, "status": status,
        "acc_mean": float(np.mean(accs)) if accs and status == "ok" else None,
        "acc_std": float(np.std(accs)) if accs and status == "ok" else None,
        "acc_sem": standard_error(accs) if status == "ok" else None,
        "per_seed": [_pool_acc(r, p["seen"]) if r["status"] == "ok" else None
                     for r, p in zip(per_seed_records, pools)],
        "unseen": None if not unseen or status != "ok" else {"acc_mean": float(np.mean(unseen)),
                                                             "acc_std": float(np.std(unseen)), "per_seed": unseen},
        "per_client": [[_percent(c.get("acc")) for c in r["per_client"]] for r in per_seed_records],
        "best_round": [r.get("best_round") for r in per_seed_records],
        "bytes_per_round": float(np.mean(bytes_round)) if bytes_round else 0.0,
        "missing": [{"seed": s, **m} for s, r in zip(seeds, per_seed_records) for m in r.get("missing", [])],
        "error": "; ".join(f"seed {s}: {r['error']}" for s, r in zip(seeds, per_seed_records) if r.get("error")),
        "published": published,
    }


def _pools(stage, pools: list[dict], num_clients: int) -> list[dict]:
    """The seen / unseen pools a method is scored on: the seed's, or, for a method on a client group
    (a federation of its own, no unseen clients), every one of the group's renumbered clients."""
    clients = getattr(stage, "clients", None)
    if clients is None:
        return pools
    return [{"seen": list(range(len(clients.ids(num_clients)))), "unseen": []} for _ in pools]


def run_results(cfg: ExperimentConfig, runs: dict, seeds: list[int], transport: str) -> dict:
    """results.json's content from each seed's stage records; ``transport``: whose round loop ran the
    stages (`pflkit.run.trainer.Trainer.transport`: ``"pflkit"`` or ``"flower"``)."""
    per_seed = {s: r[0] for s, r in runs.items()}
    stages = ([cfg.pretrain] if cfg.pretrain else []) + list(cfg.methods)
    pools = [runs[s][1] for s in seeds]
    methods = {st.label: _method_entry(st.label, st.algorithm, [per_seed[s][st.label] for s in seeds],
                                       cfg.published.get(st.label), _pools(st, pools, cfg.data.num_clients), seeds)
               for st in stages}
    for st in cfg.methods:  # a method on a client group: the original ids its per_client entries are of
        if getattr(st, "clients", None) is not None:
            methods[st.label]["clients"] = st.clients.ids(cfg.data.num_clients)
    return {
        "config": cfg.to_dict(),
        "engine": transport,  # whose round loop
        "status": worst_status(m["status"] for m in methods.values()),
        "methods": methods,
        "rounds": {st.label: {f"seed{s}": per_seed[s][st.label]["history"] for s in seeds} for st in stages},
        "timing": {"stages": {st.label: {f"seed{s}": per_seed[s][st.label].get("seconds", 0.0) for s in seeds}
                              for st in stages}},
        "version": version_info(),
    }
