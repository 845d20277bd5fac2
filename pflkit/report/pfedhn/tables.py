"""pFedHN's Tables 1 and 2 from saved or committed runs, and the sentences that read them: Table 1
(`accuracy_table`, `table1_reading`) and Table 2, the computational budgets of sec. 5.2 (`budget_table`,
`budget_reading`).

Table 2 is a pure function of the ``results.json`` that `pflkit run pfedhn_table2_budget_*` writes: pFedHN is one
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
from pflkit.data.datasets import dataset_name

__all__ = ["BUDGET_NAMES", "group_names", "budget_rows", "budget_table", "accuracy_table", "table1_reading",
           "budget_reading", "paper_label"]

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


def _scenario(res: dict) -> str:
    """A Table 1 column: the dataset's readable name and the number of clients (``CIFAR-10, 50 clients``)."""
    data = res["config"]["data"]
    return f"{dataset_name(data['dataset'])}, {data['num_clients']} clients"


# ---------------------------------------------------------------- Table 1


def accuracy_table(results: dict[str, dict], paper_header=lambda res: "paper") -> pd.DataFrame:
    """Table 1: rows = methods, columns = (scenario, ``ours`` / the paper / ``KiB/round``), accuracies in %.

    ``results`` maps an experiment name to its results (a run's or a committed one); the scenario is its
    dataset and client count. A method that did not finish with ``ok`` has no accuracy (NaN), so a failed
    method is never shown as a number. ``paper_header(res)`` names the paper's column (`Session.paper_header`).
    """
    columns: dict[tuple, dict] = {}
    for res in results.values():
        scenario = _scenario(res)
        for label, m in res["methods"].items():
            columns.setdefault((scenario, "ours"), {})[label] = m["acc_mean"] if m["status"] == "ok" else None
            columns.setdefault((scenario, paper_header(res)), {})[label] = m["published"]
            columns.setdefault((scenario, "KiB/round"), {})[label] = (m.get("bytes_per_round") or np.nan) / 2**10
    table = pd.DataFrame(columns).astype(float)
    table.columns = pd.MultiIndex.from_tuples(table.columns)
    return table


# ---------------------------------------------------------------- readings of Tables 1 and 2


def paper_label(results: dict, header: str = "paper") -> str:
    """The legend name of the paper's markers: ``header`` and, when this run read a subset of the dataset,
    that the paper's number is on the full dataset."""
    source = (results.get("data") or {}).get("source", "")
    return f"{header} (full dataset)" if "subset" in source and header == "paper" else header


def _ok_acc(results: dict) -> dict[str, float]:
    return {k: m["acc_mean"] for k, m in results["methods"].items()
            if m["status"] == "ok" and m["acc_mean"] is not None}


def table1_reading(results: dict[str, dict], method: str = "pFedHN") -> str:
    """One line per scenario of Table 1: where ``method`` ranks among the methods that finished, the best
    method here and in the paper, and how far ``method`` is from its published number."""
    lines = []
    for res in results.values():
        scenario = _scenario(res)
        acc = _ok_acc(res)
        paper = {k: m["published"] for k, m in res["methods"].items() if m.get("published") is not None}
        if method not in acc:
            lines.append(f"- {scenario}: {method} did not finish, so it has no number here.")
            continue
        order = sorted(acc, key=acc.get, reverse=True)
        best = order[0]
        line = (f"- {scenario}: {method} {acc[method]:.1f}%, rank {order.index(method) + 1} of {len(order)}; "
                f"best here {best} ({acc[best]:.1f}%)")
        if paper:
            top = max(paper, key=paper.get)
            line += f", best in the paper {top} ({paper[top]:.1f}%)"
            if method in paper:
                gap = acc[method] - paper[method]
                line += (f"; {method} is {abs(gap):.1f} points {'above' if gap > 0 else 'below'} its published "
                         f"{paper[method]:.1f}%")
        lines.append(line + ".")
    return "\n".join(lines)


def budget_reading(results: dict, method: str = "pFedHN") -> str:
    """Table 2 in one sentence per budget group: ``method`` against the best baseline of that group."""
    rows = budget_rows(results)
    if method not in rows:
        return f"{method} has no budget row in this run."
    names = group_names(len(rows[method]))
    lines = []
    for g, name in enumerate(names):
        ours = rows[method][g]
        others = {r: v[g] for r, v in rows.items() if r != method and g < len(v) and v[g] is not None}
        if ours is None or not others:
            lines.append(f"- budget {name}: nothing to compare ({method} or every baseline did not finish).")
            continue
        best = max(others, key=others.get)
        word = "above" if ours > others[best] else "below"
        lines.append(f"- budget {name}: {method} {ours:.1f}%, {abs(ours - others[best]):.1f} points {word} the best "
                     f"baseline, {best} ({others[best]:.1f}%).")
    return "\n".join(lines)
