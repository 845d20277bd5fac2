"""The pFedHN notebooks' tables and readings (`pflkit.report.pfedhn`): each a function of results, checked on
small hand-made inputs whose answer is known."""
import numpy as np
import pandas as pd

from pflkit.report.pfedhn import figures as report
from pflkit.report.pfedhn import tables


def _res(name, n, methods):
    return {"config": {"name": name, "title": name, "data": {"dataset": "cifar10", "num_clients": n}},
            "data": {"source": "cifar10_small.npz (subset)"},
            "methods": {k: {"acc_mean": a, "status": st, "published": p, "bytes_per_round": 2048}
                        for k, (a, st, p) in methods.items()}}


def test_accuracy_table_gives_no_number_to_a_method_that_did_not_finish():
    res = _res("t", 10, {"pFedHN": (80.0, "ok", 90.0), "FedAvg": (12.0, "diverged", 50.0)})
    table = tables.accuracy_table({"t": res})
    assert table.loc["pFedHN", ("CIFAR-10, 10 clients", "ours")] == 80.0
    assert np.isnan(table.loc["FedAvg", ("CIFAR-10, 10 clients", "ours")])
    assert table.loc["FedAvg", ("CIFAR-10, 10 clients", "paper")] == 50.0
    assert table.loc["FedAvg", ("CIFAR-10, 10 clients", "KiB/round")] == 2.0


def test_table1_reading_ranks_the_method_and_signs_its_gap_to_the_paper():
    res = _res("t", 50, {"pFedHN": (70.0, "ok", 88.0), "FedPer": (84.0, "ok", 83.0), "Local": (75.0, "ok", 68.0)})
    text = tables.table1_reading({"t": res})
    assert "rank 3 of 3" in text and "best here FedPer (84.0%)" in text and "18.0 points below" in text
    res["methods"]["pFedHN"]["acc_mean"] = 90.0
    assert "2.0 points above" in tables.table1_reading({"t": res})


def test_mix_and_match_reading_counts_the_rows_whose_diagonal_is_best():
    acc = np.array([[0.9, 0.5, 0.4], [0.6, 0.5, 0.7], [0.1, 0.2, 0.8]])
    text = report.mix_and_match_reading(acc)
    assert "best (1.00) in 2 of 3 rows" in text
    assert "73.3%" in text  # the mean of the diagonal, 0.9, 0.5, 0.8
    assert "in every row" in text  # not all rows: the paper's result is named


def test_novel_reading_sees_whether_the_gap_widens_with_the_distance():
    tv = "TV"
    table = pd.DataFrame({"alpha": [0.1, 0.5, 1.0], tv: [0.1, 0.2, 0.3], "accuracy (%)": [60.0, 55.0, 50.0],
                          "gap (%)": [-2.0, -7.0, -12.0]})
    assert "widens" in report.novel_reading(table, tv, 0.62)
    table["gap (%)"] = [-2.0, -12.0, -7.0]
    assert "not a steady widening" in report.novel_reading(table, tv, 0.62)


def test_committed_figure_is_found_beside_the_results_and_none_when_missing(tmp_path):
    (tmp_path / "results" / "cpu").mkdir(parents=True)
    (tmp_path / "figures" / "pfedhn").mkdir(parents=True)
    (tmp_path / "figures" / "pfedhn" / "x_only_here.png").write_bytes(b"png")
    found = report.committed_figure("x_only_here.png", tmp_path / "results" / "cpu")
    assert found == tmp_path / "figures" / "pfedhn" / "x_only_here.png"
    assert report.committed_figure("no_such_figure.png", tmp_path / "results" / "cpu") is None


def test_paper_label_says_the_paper_used_the_full_dataset_when_we_read_a_subset():
    res = _res("t", 10, {})
    assert tables.paper_label(res) == "paper (full dataset)"
    res["data"]["source"] = "cifar10.npz"
    assert tables.paper_label(res) == "paper"
    assert tables.paper_label(res, "paper (on CIFAR-10)") == "paper (on CIFAR-10)"
