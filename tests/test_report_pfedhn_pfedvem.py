"""pFedHN Table 2 and pFedVEM Table 1 / trust as pure functions of saved results."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from pflkit.io import write_json
from pflkit.report.pfedhn.tables import budget_rows, budget_table, group_names
from pflkit.report.pfedvem.figures import table1, trust_frame


def _entry(per_client, status="ok"):
    flat = [sum(pc) / len(pc) for pc in per_client]
    return {"status": status, "acc_mean": sum(flat) / len(flat) if status == "ok" else None,
            "per_client": per_client, "per_seed": flat, "published": None}


def budget_results() -> dict:
    """Six clients in three budget groups; pFedHN over all of them, FedAvg and LG-FedAvg per group."""
    methods = [{"label": "pFedHN", "algorithm": "pfedhn", "budget_widths": [8, 16, 32]}]
    entries = {"pFedHN": _entry([[10, 20, 30, 50, 60, 80], [20, 30, 40, 60, 70, 90]])}
    for g, name in enumerate("SML"):
        for row in ("FedAvg", "Per-FedAvg (HF)"):
            label = f"{row} ({name})"
            methods.append({"label": label, "algorithm": "x", "clients": {"group": g, "of": 3}})
            entries[label] = _entry([[10.0 * g, 10.0 * g + 2]], status="diverged" if label == "FedAvg (L)" else "ok")
    detail = {"groups": {"FedAvg": [1.0, 2.0, 3.0], "pFedHN": [4.0, 5.0, 6.0]}}
    return {"config": {"name": "t2", "methods": methods, "published_detail": detail}, "methods": entries}


def test_budget_rows_from_per_client_and_per_group_results():
    rows = budget_rows(budget_results())
    assert rows["pFedHN"] == pytest.approx([20.0, 45.0, 75.0])  # group means per seed, then over seeds
    assert rows["FedAvg"] == [1.0, 11.0, None]  # a method that did not finish has no number
    assert rows["Per-FedAvg (HF)"] == [1.0, 11.0, 21.0]  # the row keeps its own parentheses


def test_budget_table_puts_the_papers_numbers_beside_ours():
    t = budget_table(budget_results(), paper_header="paper (on CIFAR-10)")
    assert list(t.columns) == [(g, c) for g in "SML" for c in ("ours", "paper (on CIFAR-10)")]
    assert t.loc["FedAvg", ("M", "paper (on CIFAR-10)")] == 2.0 and t.loc["pFedHN", ("L", "ours")] == 75.0
    assert pd.isna(t.loc["Per-FedAvg (HF)", ("S", "paper (on CIFAR-10)")])
    assert group_names(2) == ("group 0", "group 1")
    with pytest.raises(ValueError, match="no method with budget groups"):
        budget_table({"config": {"name": "x", "methods": [{"label": "a"}]}, "methods": {"a": _entry([[1]])}})


def test_pfedvem_table1_mean_sem_sd_over_seeds():
    results = {"methods": {"pFedVEM": {**_entry([[50.0], [60.0], [70.0]]), "published": 62.6},
                           "FedAvg": {**_entry([[40.0]]), "per_seed": [40.0, None], "status": "diverged"}}}
    t = table1(results)
    assert t.loc["pFedVEM", "ours (%)"] == 60.0 and t.loc["pFedVEM", "SD"] == pytest.approx(10.0)
    assert t.loc["pFedVEM", "SEM"] == pytest.approx(10.0 / math.sqrt(3)) and t.loc["pFedVEM", "paper (%)"] == 62.6
    assert t.loc["FedAvg", "seeds"] == 1 and math.isnan(t.loc["FedAvg", "SD"])
    assert (t.loc["FedAvg", "of"], t.loc["FedAvg", "status"]) == (2, "diverged")  # one of two seeds counted
    assert (t.loc["pFedVEM", "of"], t.loc["pFedVEM", "status"]) == (3, "ok")


def test_trust_frame_reads_the_runs_report(tmp_path):
    report = {"n_train": [10, 20], "rho2": [0.1, 0.2], "trace_per_dim": [0.01, 0.02], "dist2_per_dim": [0.09, 0.18],
              "tau_share": [2 / 3, 1 / 3]}
    write_json(tmp_path / "seed3" / "pfedvem.report.json", report)
    results = {"config": {"seed": 2, "seeds": 2},
               "methods": {"pFedVEM": _entry([[10.0, 20.0], [50.0, 100.0]])}}
    frame = trust_frame(tmp_path, results, seed=3)
    assert list(frame["test acc"]) == [0.5, 1.0] and list(frame["Tr(Sigma)/D"]) == [0.01, 0.02]
    assert frame.index.name == "client" and "trust tau_j (share)" in frame
    with pytest.raises(FileNotFoundError, match="no trust report"):
        trust_frame(tmp_path, results)  # seed 2 has none
