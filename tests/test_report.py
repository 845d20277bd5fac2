import matplotlib

matplotlib.use("Agg")

from pflkit.fl.federate import build_federation  # noqa: E402
from pflkit.report.figures import plot_label_distribution, save_figure  # noqa: E402
from pflkit.report.tables import compare_table, format_table, results_table  # noqa: E402
from tests.helpers_data import digits_dataset  # noqa: E402

RES = {
    "config": {"name": "x", "preset": "cpu", "title": "t", "data": {"partition": {"alpha": 0.1}}},
    "methods": {
        "Global": {"acc_mean": 50.0, "acc_std": 1.0, "per_seed": [49.0, 51.0], "status": "ok", "published": 44.86},
        "FT (BN C)": {"acc_mean": None, "acc_std": None, "per_seed": [None, None], "status": "diverged"},
    },
}


def test_table_prints_ours_beside_the_paper_and_marks_divergence():
    df = results_table(RES)
    assert df.loc[0, "ours"] == "50.00±1.00" and df.loc[0, "paper"] == "44.86"
    assert df.loc[1, "ours"] == "diverged"
    text = format_table(RES)
    assert "preset cpu" in text and "diverge" in text


def test_compare_table_rows_by_config_key():
    df = compare_table([RES], "data.partition.alpha")
    assert df.loc[0.1, "Global"] == 50.0


def test_label_distribution_plot(tmp_path):
    fed = build_federation(digits_dataset(), "dirichlet", 5, seed=0, alpha=0.2)
    ax = plot_label_distribution(fed)
    heights = sum(p.get_height() for p in ax.patches)
    assert heights == fed.sizes("train").sum()
    assert save_figure(ax.figure, tmp_path / "f.png").stat().st_size > 0


def test_smoke_tables_say_their_numbers_are_meaningless():
    smoke = {**RES, "config": {**RES["config"], "preset": "smoke"}}
    assert "meaningless" in format_table(smoke) and "meaningless" not in format_table(RES)


def test_round_plots_show_accuracy_in_percent():
    """Validation accuracy is stored as a fraction and plotted in %, like every table."""
    from pflkit.report.figures import plot_rounds

    res = {"rounds": {"FedAvg": {"seed0": [{"round": 1, "val_acc": 0.25, "train_loss": 2.0},
                                           {"round": 2, "val_acc": 0.5, "train_loss": 1.0}]}}}
    ax = plot_rounds(res, "val_acc")
    assert list(ax.lines[0].get_ydata()) == [25.0, 50.0] and ax.get_ylabel() == "validation accuracy (%)"
    ax = plot_rounds(res, "train_loss")
    assert list(ax.lines[0].get_ydata()) == [2.0, 1.0] and ax.get_ylabel() == "training loss"
