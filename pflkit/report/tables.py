"""Tables from ``results.json``: our number beside the paper's, with the preset named."""
from __future__ import annotations

from typing import Iterable

import pandas as pd


def _cell(mean, std, status) -> str:
    """``mean±std``; a method that is not ``ok`` shows its status (``diverged``, ``incomplete``), never a number."""
    if status != "ok" or mean is None:
        return status if status != "ok" else "missing"
    return f"{mean:.2f}±{std:.2f}"


def results_table(results: dict) -> pd.DataFrame:
    """One row per method: ours (mean ± std over seeds), the paper's number, status, communication.

    Columns: ``method``, ``ours``, ``paper``, ``acc_mean``, ``acc_std``, ``acc_sem`` (standard error over
    seeds), ``seeds``, ``status``,
    ``MB/round``. The preset is in ``df.attrs["preset"]``.
    """
    rows = []
    for label, m in results["methods"].items():
        rows.append({
            "method": label,
            "ours": _cell(m["acc_mean"], m["acc_std"], m["status"]),
            "paper": "" if m.get("published") is None else f"{m['published']}",
            "acc_mean": m["acc_mean"], "acc_std": m["acc_std"], "acc_sem": m.get("acc_sem"),
            "seeds": len(m["per_seed"]), "status": m["status"],
            "MB/round": round(m.get("bytes_per_round", 0.0) / 2**20, 3),
        })
    df = pd.DataFrame(rows)
    cfg = results.get("config", {})
    df.attrs.update({"preset": cfg.get("preset"), "experiment": cfg.get("name"), "title": cfg.get("title")})
    return df


def format_table(results: dict, columns: Iterable[str] = ("method", "ours", "paper", "status", "MB/round"), *,
                 dataset: str | None = None, paper_header: str = "paper") -> str:
    """A plain-text table for terminals and notes, headed by experiment, dataset and preset.

    ``dataset``: how to name the data in the heading (e.g. a stand-in's label); ``paper_header``:
    the heading of the paper's column (``"paper (on CIFAR-10)"`` beside another dataset's numbers).
    Under the table, when the preset declares any (`pflkit.run.experiments`, ``deviations``), the
    settings at which this run differs from the paper's, with their values.
    """
    df = results_table(results).rename(columns={"paper": paper_header})
    on = f" on {dataset}" if dataset else ""
    head = f"{df.attrs.get('experiment')}{on} ({df.attrs.get('title') or ''}) - preset {df.attrs.get('preset')}"
    data = results.get("data")
    if data:  # the dataset really read, beside the title that names the paper's
        head += f"\ndata: {data.get('name')} ({data.get('source')})"
    note = "accuracy: mean over clients of per-client test accuracy (%), ± std over seeds"
    if df.attrs.get("preset") == "smoke":
        note += "\npreset smoke: tiny sizes, the accuracies are meaningless (they show the code runs)"
    deviations = results.get("config", {}).get("deviations") or []
    if deviations:
        note += (f"\ndeviations from the paper's settings at preset {df.attrs.get('preset')}: "
                 + ", ".join(deviations))
    cols = [paper_header if c == "paper" else c for c in columns]
    return f"{head}\n{df[cols].to_string(index=False)}\n{note}"


def compare_table(results_list: list[dict], key: str) -> pd.DataFrame:
    """Several results side by side (e.g. Table 2's alpha rows): index = ``config`` value at
    dotted ``key`` (e.g. ``data.partition.alpha``), columns = method labels, cells = mean accuracy."""
    rows = {}
    for res in results_list:
        value = res["config"]
        for part in key.split("."):
            value = value[part]
        rows[value] = {label: m["acc_mean"] for label, m in res["methods"].items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def _at(config: dict, key: str):
    """``config`` at the dotted ``key``; a numeric part indexes a list (``methods.0.epochs``)."""
    for part in key.split("."):
        config = config[int(part)] if isinstance(config, list) else config[part]
    return config


def ours_vs_paper(results_list: list[dict], keys: dict[str, str], digits: int = 1,
                  pretrained: str | None = None) -> pd.DataFrame:
    """Several results as one table: a row per result, indexed by ``keys`` (``{column: dotted config key}``,
    e.g. ``{"alpha": "data.partition.alpha"}``), a column per method, each cell ``ours (paper)`` in % (``—`` for
    a method that is not ok, ``n/a`` where the result has no such method; the paper's number only where the
    experiment file gives one). ``pretrained``: one column name for every result's pretraining stage (Table 1's
    rows pretrain with different algorithms, so each would otherwise get a column of its own)."""
    rows = []
    for res in results_list:
        row = {col: _at(res["config"], key) for col, key in keys.items()}
        first = (res["config"].get("pretrain") or {}).get("label")
        for label, m in res["methods"].items():
            label = pretrained if pretrained and label == first else label
            ours = f"{m['acc_mean']:.{digits}f}" if m.get("status") == "ok" and m.get("acc_mean") is not None else "—"
            paper = m.get("published")
            row[label] = ours if paper is None else f"{ours} ({paper:.{digits}f})"
        rows.append(row)
    frame = pd.DataFrame(rows).set_index(list(keys)).sort_index()
    return frame.fillna("n/a")
