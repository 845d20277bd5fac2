"""FedSelect's and pFedVEM's notebook tables and readings as pure functions of (committed) results."""
from __future__ import annotations

import pandas as pd
import pytest

from pflkit.report.fedselect.figures import (accuracy_vs_p_reading, layer_mask_reading, mask_frame, mask_reading,
                                     personal_share, table1_frame, table1_reading)
from pflkit.report.pfedvem.figures import trust_from_analysis, trust_reading, trust_takeaway, trust_terms


def _m(acc, published=None, mb=1.0, status="ok"):
    return {"acc_mean": acc, "published": published, "bytes_per_round": mb * 2 ** 20, "status": status}


def fedselect_results(iou=0.1, shares=(0.03, 0.03, 0.03)) -> dict:
    methods = {"FedAvg": _m(30.0, 33.0, 4.0), "LG-FedAvg": _m(70.0, 60.0, 0.1), "FedRep": _m(60.0),
               "FedSelect (0.25)": _m(50.0, 84.0), "FedSelect (0.50)": _m(65.0, 86.0, 3.0),
               "FedSelect/code (0.50)": _m(68.0)}
    analysis = {"FedSelect (0.50)": {"seeds": [{"seed": 0, "personal_share": list(shares), "mask_iou": iou}]},
                "FedRep": {"seeds": [{"seed": 0, "personal_share": [0.01] * 3, "mask_iou": 1.0}]}}
    return {"methods": methods, "analysis": analysis, "rounds": {}}


def test_table1_frame_reads_the_mask_report_and_traffic():
    t = table1_frame({2: fedselect_results(shares=(0.02, 0.04, 0.03))})
    assert t.loc["FedSelect (0.50)", "personal % s=2"] == pytest.approx(3.0)
    assert t.loc["FedSelect (0.50)", "MiB/round s=2"] == 3.0 and t.loc["FedAvg", "paper s=2"] == 33.0
    assert pd.isna(t.loc["FedAvg", "personal % s=2"])  # no mask report: no share invented
    assert personal_share({"methods": {}, "rounds": {"X": {"seed0": [{"client_personal_share": 0.5}]}}}, "X") == [0.5]


def test_table1_reading_counts_the_fedselect_rows_that_beat_each_rival():
    text = table1_reading({2: fedselect_results()})
    assert "**LG-FedAvg** (70.0%)" in text and "FedAvg in 2 of 2" in text and "LG-FedAvg in 0 of 2" in text


def test_mask_reading_states_a_share_that_does_not_vary_and_plots_it_not():
    flat = mask_reading({2: fedselect_results(shares=(0.03, 0.03, 0.03))})
    assert "same on every client" in flat and "FedSelect (0.50): 3%" in flat and "0.10-0.10" in flat
    varied = mask_reading({2: fedselect_results(shares=(0.01, 0.05, 0.03))})
    assert "same on every client" not in varied
    frame = mask_frame({2: fedselect_results(iou=0.2)})
    assert frame.loc["FedSelect (0.50)", "mask IoU s=2"] == 0.2 and "FedAvg" not in frame.index


def test_accuracy_vs_p_reading_names_the_best_rate_and_the_papers():
    text = accuracy_vs_p_reading({4: fedselect_results()})
    assert "spans 15.0 points" in text and "best at $p = 0.5$" in text and "paper: 2.0 points" in text


def test_layer_mask_reading_counts_whole_and_split_tensors():
    text = layer_mask_reading(pd.Series({"a": 1.0, "b": 0.0, "c": 0.25, "d": 0.5}))
    assert "1 end wholly personal (a)" in text and "1 wholly shared (b)" in text and "2 split" in text
    assert "from 0.25 to 0.50" in text


def vem_results() -> dict:
    report = {"seed": 1, "n_train": [10, 20, 30, 40], "rho2": [0.0101, 0.0102, 0.0104, 0.0106],
              "trace_per_dim": [0.01, 0.01, 0.0099, 0.0099], "dist2_per_dim": [1e-4, 2e-4, 5e-4, 7e-4],
              "tau_share": [0.26, 0.255, 0.247, 0.238]}
    return {"config": {"seed": 1, "seeds": 1},
            "methods": {"pFedVEM": {"per_client": [[50.0, 60.0, 70.0, 80.0]]}},
            "analysis": {"pFedVEM": {"seeds": [report]}}}


def test_trust_from_analysis_is_the_stored_report_per_client():
    frame = trust_from_analysis(vem_results(), seed=1)
    assert list(frame["test acc"]) == [0.5, 0.6, 0.7, 0.8] and list(frame["n_train"]) == [10, 20, 30, 40]
    with pytest.raises(KeyError, match="no trust report for seed 0"):
        trust_from_analysis(vem_results(), seed=0)


def test_trust_reading_says_which_term_decides_from_the_numbers():
    frame = trust_from_analysis(vem_results())
    t = trust_terms(frame, init_scale=0.1)
    assert t["dist_std"] > t["trace_std"] and t["dist_corr_n"] > 0.9 and t["trace_moved"] == pytest.approx(0.01)
    assert t["tau_min"] == pytest.approx(-4.8) and t["tau_max"] == pytest.approx(4.0)
    text = trust_reading(frame, 0.1, 44)
    assert "$D = 44$" in text and "**distance** term decides" in text and "10 to 40 training images" in text
    assert "follows the distance" in trust_takeaway(frame, 0.1, 44)
    swapped = frame.assign(**{"Tr(Sigma)/D": frame["||mu-w||^2/D"] + 0.01, "||mu-w||^2/D": 1e-4})
    assert "**uncertainty** term decides" in trust_reading(swapped, 0.1, None)


def test_fig1_is_drawn_from_a_stored_head_iou_matrix_and_absent_without_one():
    from pflkit.report.fedselect.figures import HEAD_IOU, HEAD_SHARE, plot_fig1, stored_head_iou

    res = fedselect_results()
    assert stored_head_iou(res) == (None, None)  # the committed results of today store no matrix
    seed = res["analysis"]["FedSelect (0.50)"]["seeds"][0]
    seed.update({HEAD_IOU: [[1.0, 0.2], [0.2, 1.0]], HEAD_SHARE: [0.1, 0.3]})
    iou, share = stored_head_iou(res, seed=0)
    assert iou.shape == (2, 2) and share == pytest.approx(0.2) and stored_head_iou(res, seed=1) == (None, None)
    fig = plot_fig1({2: iou, 4: iou}, {2: share, 4: None}, "Fig. 1")
    titles = [ax.get_title() for ax in fig.axes[:2]]
    assert "20.0% of head entries" in titles[0] and "%" not in titles[1]
