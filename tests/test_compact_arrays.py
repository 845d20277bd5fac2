"""A compact result keeps FedL2P's per-client arrays, so its figures can be drawn without the run folder."""
import json

import numpy as np
import pytest

from pflkit.analysis.clustering import meta_net_ari
from pflkit.report.compact import _hyperparameter_summary, _round, report_rows


def _rows(n: int = 6, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"client": c, "beta": {"bn1": float(rng.uniform()), "bn2": float(rng.uniform())},
             "eta": {"conv.weight": float(rng.uniform()), "fc.bias": 0.0}, "sparsity": 0.1 * c,
             "tensor_sparsity": 0.5, "xi": rng.normal(size=2).tolist(), "features": rng.normal(size=4).tolist()}
            for c in range(n)]


def test_report_rows_give_back_what_the_summary_stored():
    rows = _rows()
    back = report_rows(_hyperparameter_summary(rows, [], seed=0))
    assert back == [{k: v for k, v in r.items() if k != "tensor_sparsity"} for r in rows]


def test_the_stored_arrays_give_the_same_clustering_as_the_report():
    rows = _rows(12)
    domains = [c % 3 for c in range(12)]
    info = [{"domain": d} for d in domains]
    summary = _round(_hyperparameter_summary(rows, info, seed=0))
    assert report_rows(summary) is not None
    # the arrays are stored to 6 significant digits: the clustering they give is the report's
    assert meta_net_ari(report_rows(summary), domains, seed=0) == pytest.approx(summary["ari"], rel=1e-5)
    assert len(json.dumps(summary)) < 20_000  # a few dozen numbers per client


def test_a_summary_without_arrays_gives_none():
    assert report_rows({"beta_per_client": [0.1]}) is None
