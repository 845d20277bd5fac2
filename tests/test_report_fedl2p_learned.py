"""FedL2P's figures and readings from the compact result: what does not vary is stated, not drawn."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from pflkit.report.fedl2p.figures import plot_distance_map  # noqa: E402
from pflkit.report.fedl2p.learned import (  # noqa: E402
    ari_frame, drawable, learned, learned_reading, learned_statements, paper_label, plot_beta_by_domain,
    plot_learned, plot_sparsity_scenarios,
)

FLAT = {"seed": 0, "beta_per_client": [0.0296 + 1e-5 * (k % 3) for k in range(9)], "sparsity_per_client": [0.0] * 9,
        "beta_per_layer": {"bn1": 0.059, "bn2": 0.0}, "domains": [0, 0, 0, 1, 1, 1, 2, 2, 2],
        "ari": {"xi": 1.0, "beta": 1.0, "features": 0.5, "eta": 1.0}}
SPREAD = {**FLAT, "beta_per_client": [0.1, 0.2, 0.15, 0.5, 0.6, 0.55, 0.9, 0.8, 0.85],
          "sparsity_per_client": [0.0, 0.1, 0.0, 0.2, 0.0, 0.3, 0.0, 0.0, 0.4]}


def _texts(fig) -> str:
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts)


def test_learned_reads_the_seed_of_a_compact_result():
    res = {"analysis": {"FedL2P": {"seeds": [FLAT, {**SPREAD, "seed": 1}]}}}
    assert learned(res, "FedL2P", 1)["beta_per_client"] == SPREAD["beta_per_client"]
    assert learned(res, "FedL2P", 2) is None and learned(res, "L2P", 0) is None


def test_flat_beta_and_zero_sparsity_are_stated_with_their_values_per_domain():
    text = " ".join(learned_statements(FLAT, ["mnist", "mnist_m", "usps"]))
    assert "0.0296" in text and "for every client" in text and "mnist_m" in text
    assert "sparsity = 0 for every client" in text and "no tensor frozen" in text
    assert learned_statements(SPREAD) == []  # both vary visibly: nothing to state
    assert "0.0296" in learned_reading(FLAT) and "bn1 **0.059**" in learned_reading(FLAT)


def test_plot_learned_draws_only_what_varies():
    flat = plot_learned(FLAT, "t")
    assert len(flat.axes) == 2 and "for every client" in _texts(flat)  # the layer bars and the statement
    spread = plot_learned(SPREAD, "t")
    assert len(spread.axes) == 3 and "for every client" not in _texts(spread)
    # per-client panels use integer client ticks
    ticks = spread.axes[1].get_xticks()
    assert np.allclose(ticks, np.round(ticks))
    plt.close("all")


def test_drawable_is_false_for_an_all_zero_summary():
    zero = {**FLAT, "beta_per_client": [0.0] * 9, "beta_per_layer": {"bn1": 0.0, "bn2": 0.0}}
    assert not drawable(zero) and not drawable(None)
    assert drawable(FLAT) and drawable(SPREAD)


def test_beta_by_domain_states_a_flat_split_and_draws_a_real_one():
    ax = plot_beta_by_domain(FLAT, ["a", "b", "c"], "t")
    assert not ax.lines and "no dots are drawn" in ax.texts[0].get_text()
    ax = plot_beta_by_domain(SPREAD, ["a", "b", "c"], "t")
    assert len(ax.get_legend().get_texts()) == 4  # three domains and the mean line
    plt.close("all")


def test_sparsity_scenarios_all_zero_is_a_sentence():
    ax = plot_sparsity_scenarios({"a": FLAT, "b": FLAT}, "t")
    assert "sparsity = 0 for every client of all 2 scenarios" in ax.texts[0].get_text()
    ax = plot_sparsity_scenarios({"a": FLAT, "b": SPREAD}, "t", {"a": "label shift", "b": "domains"})
    assert ax.get_ylim()[1] < 1.0  # scaled to the largest value, not to [0, 1]
    assert {"label shift", "domains"} <= {t.get_text() for t in ax.get_legend().get_texts()}
    plt.close("all")


def test_distance_map_labels_contrast_with_their_cell():
    rng = np.random.default_rng(0)
    rows = [{"client": i, "xi": list(rng.normal(size=3) + 5 * (i // 4))} for i in range(12)]
    ax = plot_distance_map(rows, np.repeat([0, 1, 2], 4), "xi")
    colors = {t.get_text(): t.get_color() for t in ax.texts}
    assert "white" in colors.values() and "black" in colors.values()
    plt.close("all")


def test_ari_frame_and_paper_label():
    frame = ari_frame(FLAT, (0.52, 0.53, 0.72, 0.63))
    assert frame.loc["features", "ARI"] == 0.5 and frame.loc["xi", "paper"] == 0.52
    assert paper_label({"config": {"data": {"dataset": "digit_domains"}}}) == "paper (on DomainNet)"
    assert paper_label({"config": {"data": {"dataset": "cifar10"}}}, "paper") == "paper"


def test_by_domain_states_flat_beta_and_eta_instead_of_collapsed_boxes():
    from pflkit.report.fedl2p.figures import plot_hyperparameters_by_domain

    dom = [0, 0, 1, 1]
    rows = [{"client": i, "beta": {"bn1": 0.0296 + 1e-6 * i, "bn2": 0.5}, "eta": {"w": 0.01 * (1 + 1e-5 * i)},
             "sparsity": 0.0} for i, d in enumerate(dom)]
    fig = plot_hyperparameters_by_domain(rows, dom, ["MNIST", "USPS"], "t")
    left, right = fig.axes[:2]
    assert not left.patches and "no visible spread" in left.texts[0].get_text()
    assert not right.patches and "same learning rates" in right.texts[0].get_text()
    assert left.get_title().startswith("beta: between-domain SD")  # the spread is still in the title
    plt.close(fig)


def test_an_all_zero_beta_is_read_as_the_pretrained_statistics():
    zero = {**FLAT, "beta_per_client": [0.0] * 9, "beta_per_layer": {"bn1": 0.0, "bn2": 0.0}}
    text = learned_reading(zero)
    assert "β = 0 in every BN layer for all 9 clients" in text and "sparsity = 0 for every client" in text
