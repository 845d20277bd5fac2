"""pFedHN's Table 2 (computational budgets, sec. 5.2) from a saved run.

A pure function of the ``results.json`` that `pflkit run pfedhn_table2_budget_*` writes: pFedHN is one
hypernetwork over every client, so its group accuracies are the means of its per-client accuracies over
each budget group (`pflkit.analysis.pfedhn.group_accuracy`); each baseline is declared once per group
(``clients = { group = g, of = 3 }``, labelled ``"<row> (S|M|L)"``) and its group accuracy is its own
mean over that group's clients. The paper's numbers come from the experiment's
``[published_detail.groups]``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pflkit.analysis.pfedhn import group_accuracy

__all__ = ["BUDGET_NAMES", "group_names", "budget_rows", "budget_table"]

BUDGET_NAMES = ("S", "M", "L")  # Table 2's columns: LeNet width 8 / 16 / 32


def group_names(num_groups: int) -> tuple[str, ...]:
    """The paper's S / M / L for three groups, else ``group 0``, ``group 1``, ..."""
    return BUDGET_NAMES if num_groups == 3 else tuple(f"group {g}" for g in range(num_groups))


def _row(label: str, group: str) -> str:
    """``"Per-FedAvg (HF) (S)"`` -> ``"Per-FedAvg (HF)"``: the table row of a method declared per group."""
    suffix = f" ({group})"
    return label[: -len(suffix)] if label.endswith(suffix) else label


def budget_rows(results: dict) -> dict[str, list]:
    """``{row: [accuracy (%) of each budget group]}`` (None where a method did not finish with ``ok``).

    A method with ``budget_widths`` (pFedHN) gives one row from its per-client accuracies, per seed
    then averaged over seeds; a method with a ``clients`` group fills its row's cell of that group.
    """
    cfg, methods = results["config"], results["methods"]
    rows: dict[str, list] = {}
    for m in cfg["methods"]:
        entry = methods[m["label"]]
        ok = entry["status"] == "ok"
        if m.get("clients"):
            g, of = m["clients"]["group"], m["clients"]["of"]
            cells = rows.setdefault(_row(m["label"], group_names(of)[g]), [None] * of)
            cells[g] = entry["acc_mean"] if ok else None
        elif m.get("budget_widths"):
            k = len(m["budget_widths"])
            per_seed = [group_accuracy(pc, k) for pc in entry["per_client"] if len(pc) >= k]
            rows[m["label"]] = [float(v) for v in np.mean(per_seed, axis=0)] if ok and per_seed else [None] * k
    return rows


def budget_table(results: dict, paper_header: str = "paper") -> pd.DataFrame:
    """Table 2: rows = methods, columns = (budget group, ``ours`` / ``paper_header``), accuracies in %."""
    rows = budget_rows(results)
    if not rows:
        raise ValueError(f"{results['config']['name']}: no method with budget groups (clients or budget_widths)")
    k = max(len(v) for v in rows.values())
    published = (results["config"].get("published_detail") or {}).get("groups") or {}
    columns = {}
    for g, name in enumerate(group_names(k)):
        columns[(name, "ours")] = {r: v[g] if g < len(v) else None for r, v in rows.items()}
        columns[(name, paper_header)] = {r: (published.get(r) or [None] * k)[g] for r in rows}
    table = pd.DataFrame(columns)
    table.columns = pd.MultiIndex.from_tuples(table.columns)
    return table
