"""ARI of spectral clusterings and the normalized log distance map (FedL2P Table 6, Fig. 3)."""
import math

import numpy as np
import pytest

from pflkit.analysis.clustering import (
    NEAR_CONSTANT, adjusted_rand, cluster_ari, domain_distance_map, group_spread, meta_net_ari, meta_net_clustering,
    pairwise_distances, rbf_affinity, report_matrix, spectral_clusters,
)


def blobs(n_domains=3, per=8, dim=5, spread=0.3, seed=0):
    rng = np.random.default_rng(seed)
    g = np.repeat(np.arange(n_domains), per)
    centres = rng.normal(size=(n_domains, dim)) * 5
    return centres[g] + spread * rng.normal(size=(len(g), dim)), g


def test_perfect_clustering_scores_one():
    x, g = blobs()
    labels = spectral_clusters(x, 3)
    assert adjusted_rand(g, labels) == 1.0 and cluster_ari(x, g) == 1.0
    # the same with unit-free scaling: learning rates of ~1e-3 cluster as well as ~1e2 features
    assert cluster_ari(1e-3 * x, g) == 1.0 and cluster_ari(1e2 * x, g) == 1.0
    # label names do not matter, only the partition
    assert adjusted_rand(g, 7 - 2 * labels) == 1.0


def test_random_clustering_scores_near_zero():
    g = np.repeat(np.arange(4), 10)
    scores = [cluster_ari(np.random.default_rng(s).normal(size=(40, 6)), g, seed=s) for s in range(12)]
    assert abs(np.mean(scores)) < 0.05 and max(scores) < 0.3


def test_ari_by_hand():
    # the prediction splits the second true cluster; contingency table [[2, 0, 0], [0, 1, 1]]
    true, pred = [0, 0, 1, 1], [0, 0, 1, 2]
    # sum C(n_ij,2) = 1; sum C(a_i,2) = 2; sum C(b_j,2) = 1; C(4,2) = 6 -> expected 2 * 1 / 6 = 1/3
    # ARI = (1 - 1/3) / ((2 + 1) / 2 - 1/3) = (2/3) / (7/6) = 4/7
    assert adjusted_rand(true, pred) == pytest.approx(4 / 7)


def test_degenerate_inputs():
    g = np.array([0, 0, 1, 1, 2, 2])
    same = np.ones((6, 3))
    assert spectral_clusters(same, 3).tolist() == [0] * 6 and cluster_ari(same, g) == 0.0
    one_each = np.random.default_rng(0).normal(size=(4, 2))
    assert cluster_ari(one_each, [0, 1, 2, 3]) == 1.0  # as many clusters as clients: trivially the domains
    with pytest.raises(ValueError, match="one entry per client"):
        cluster_ari(same, [0, 1])
    with pytest.raises(ValueError, match="non-finite"):
        cluster_ari(np.full((4, 2), np.nan), [0, 0, 1, 1])
    with pytest.raises(ValueError, match="n_clusters"):
        spectral_clusters(same, 0)


def test_affinity_median_heuristic():
    x = np.array([[0.0], [1.0], [3.0]])
    d = pairwise_distances(x)
    assert d.tolist() == [[0, 1, 3], [1, 0, 2], [3, 2, 0]]
    a = rbf_affinity(x)  # squared distances of distinct pairs 1, 4, 9 -> median 4 -> gamma 1/4
    assert a[0, 2] == pytest.approx(math.exp(-9 / 4)) and np.allclose(np.diag(a), 1)


def test_distance_map_by_hand():
    x = np.array([0.0, 2.0, 10.0, 13.0])
    names, m = domain_distance_map(x, ["a", "a", "b", "b"])
    assert names.tolist() == ["a", "b"]
    # d(a,a) = 2, d(b,b) = 3, d(a,b) = (10 + 13 + 8 + 11) / 4 = 10.5
    assert m[0, 1] == pytest.approx(math.log(10.5 / math.sqrt(6))) and m[1, 0] == m[0, 1]
    assert m[0, 0] == pytest.approx(0.0) and m[1, 1] == pytest.approx(0.0)
    _, single = domain_distance_map(np.array([0.0, 1.0, 5.0]), [0, 0, 1])
    assert np.isnan(single[1, 1]) and np.isnan(single[0, 1]) and single[0, 0] == 0.0


def test_distance_map_of_unrelated_domains_is_near_zero_and_of_blobs_positive():
    x = np.random.default_rng(1).normal(size=(90, 4))
    _, m = domain_distance_map(x, np.repeat(np.arange(3), 30))
    assert np.abs(m).max() < 0.1
    xb, g = blobs(spread=1.0)
    _, mb = domain_distance_map(xb, g)
    assert (mb[~np.eye(3, dtype=bool)] > 0.5).all()


def test_meta_net_ari_on_a_report():
    xb, g = blobs(per=6)
    rng = np.random.default_rng(2)
    rows = [{"client": i, "xi": list(xb[i]), "beta": {"bn1": float(xb[i, 0]), "bn2": float(xb[i, 1])},
             "features": list(rng.normal(size=4)), "eta": {"w": float(rng.normal()), "b": 0.0}, "sparsity": 0.5}
            for i in range(len(g))]
    assert report_matrix(rows, "beta").shape == (18, 2) and report_matrix(rows, "sparsity").shape == (18, 1)
    ari = meta_net_ari(rows, g)
    assert ari["xi"] == 1.0 and ari["eta"] < 0.5 and set(ari) == {"xi", "beta", "features", "eta"}
    with pytest.raises(ValueError, match="unknown key"):
        report_matrix(rows, "gamma")


def test_group_spread_by_hand():
    # two domains, two coordinates
    #   domain 0: (1, 10), (3, 10)   means (2, 10)   variances (1, 0)
    #   domain 1: (5, 20), (5, 40)   means (5, 30)   variances (0, 100)
    x = np.array([[1.0, 10.0], [3.0, 10.0], [5.0, 20.0], [5.0, 40.0]])
    g = np.array([0, 0, 1, 1])
    sp = group_spread(x, g)
    # between_k: SD of the two domain means = half their distance: (1.5, 10)
    assert sp["between"] == pytest.approx(math.sqrt((1.5 ** 2 + 10 ** 2) / 2))
    # within_k: sqrt(mean of the domain variances): (sqrt(0.5), sqrt(50))
    assert sp["within"] == pytest.approx(math.sqrt((0.5 + 50) / 2))
    # levels: |mean over clients| = (3.5, 20); relative spreads coordinate by coordinate
    assert sp["level"] == pytest.approx(math.sqrt((3.5 ** 2 + 20 ** 2) / 2))
    assert sp["between_rel"] == pytest.approx(math.sqrt(((1.5 / 3.5) ** 2 + (10 / 20) ** 2) / 2))
    assert sp["within_rel"] == pytest.approx(math.sqrt((0.5 / 3.5 ** 2 + 50 / 20 ** 2) / 2))
    assert sp["separation"] == pytest.approx(sp["between"] / sp["within"])
    # domains weigh equally whatever their sizes; 1-d input works
    sp1 = group_spread([0.0, 0.0, 0.0, 4.0], [0, 0, 0, 1])
    assert sp1["between"] == pytest.approx(2.0) and sp1["within"] == 0.0 and sp1["separation"] == math.inf
    with pytest.raises(ValueError, match="two groups"):
        group_spread(x, [0, 0, 0, 0])


def test_near_constant_outputs_cluster_perfectly_but_report_no_spread():
    """The ARI is scale-free: outputs that vary by 1e-7 around a constant cluster like the
    inputs (ARI 1); the spread beside it shows that the hyperparameters hardly differ."""
    xb, g = blobs(per=6)
    beta = 0.5 + 1e-7 * xb[:, :2]  # a near-constant but perfectly domain-ordered output
    eta = 1e-2 * (1 + 1e-7 * xb[:, 2:4])
    rows = [{"client": i, "xi": list(xb[i]), "beta": {"bn1": beta[i, 0], "bn2": beta[i, 1]},
             "features": list(xb[i]), "eta": {"w": eta[i, 0], "b": eta[i, 1]}, "sparsity": 0.0}
            for i in range(len(g))]
    c = meta_net_clustering(rows, g)
    assert c["beta"]["ari"] == 1.0 and c["eta"]["ari"] == 1.0 and c["xi"]["ari"] == 1.0
    assert c["beta"]["between"] < 1e-5 and c["beta"]["between_rel"] < NEAR_CONSTANT and c["beta"]["near_constant"]
    assert c["eta"]["between_rel"] < NEAR_CONSTANT and c["eta"]["near_constant"]
    assert c["xi"]["between"] > 1.0 and not c["xi"]["near_constant"]
    # every output ARI of the report table sits beside its spread and the flag
    from pflkit.report.fedl2p.figures import ari_table

    t = ari_table(rows, g).set_index("quantity")
    assert list(t.loc["beta", ["ARI", "near-constant"]]) == [1.0, True] and t.loc["beta", "between"] < 1e-5
    assert t.loc["xi", "near-constant"] == False  # noqa: E712 (numpy bool)
    # an output that really differs by domain is not flagged
    rows2 = [{**r, "beta": {"bn1": 0.2 + 0.2 * g[i], "bn2": 0.5}} for i, r in enumerate(rows)]
    c2 = meta_net_clustering(rows2, g)["beta"]
    assert c2["ari"] == 1.0 and not c2["near_constant"] and c2["between"] == pytest.approx(
        math.sqrt((np.std([0.2, 0.4, 0.6]) ** 2 + 0) / 2))
