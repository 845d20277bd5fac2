"""pFedVEM's Table 1 and the server's trust in each client (Alg. 1, Eq. 7) from a saved run.

Pure functions of what `pflkit run` writes for a ``pfedvem_*`` experiment: ``results.json`` (each
method's personalized accuracy per seed) and ``seed{S}/<method>.report.json`` (pFedVEM's and pFedMAP's
`trust_report`: n_j, rho_j^2 and its two parts, the share of tau_j = 1 / rho_j^2 in w).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pflkit.io import read_json, slug

__all__ = ["table1", "trust_frame"]


def table1(results: dict) -> pd.DataFrame:
    """Table 1 for one run: per method the mean over seeds of the personalized accuracy (%, mean over
    clients of each client's test accuracy), its standard error (SEM, what the paper reports), the
    standard deviation over seeds (SD, ``ddof=1``; NaN for one seed), the number of seeds counted, of how
    many were run, the method's status (``ok`` only when every seed finished) and the published number.
    A seed that did not finish with ``ok`` has no accuracy and is not counted."""
    rows = {}
    for label, m in results["methods"].items():
        accs = np.array([a for a in m.get("per_seed", []) if a is not None], dtype=np.float64)
        sd = float(accs.std(ddof=1)) if len(accs) > 1 else np.nan
        rows[label] = {"ours (%)": float(accs.mean()) if len(accs) else np.nan,
                       "SEM": sd / np.sqrt(len(accs)) if len(accs) else np.nan, "SD": sd, "seeds": len(accs),
                       "of": len(m.get("per_seed", [])), "status": m.get("status", "ok"),
                       "paper (%)": m.get("published")}
    return pd.DataFrame.from_dict(rows, orient="index")


def trust_frame(run_dir, results: dict, label: str = "pFedVEM", seed: int | None = None) -> pd.DataFrame:
    """The trust report of ``label`` for one seed (default: the run's first), one row per client:
    ``n_train``, ``rho2`` (Eq. 7 against the final w), ``Tr(Sigma)/D``, ``||mu-w||^2/D``, ``trust tau_j
    (share)`` and the client's ``test acc`` (a fraction) from ``results``."""
    cfg = results["config"]
    seed = cfg["seed"] if seed is None else seed
    path = Path(run_dir) / f"seed{seed}" / f"{slug(label)}.report.json"
    if not path.exists():
        raise FileNotFoundError(f"no trust report at {path}: did {label!r} finish in this run?")
    frame = pd.DataFrame(read_json(path)).rename(columns={
        "trace_per_dim": "Tr(Sigma)/D", "dist2_per_dim": "||mu-w||^2/D", "tau_share": "trust tau_j (share)"})
    per_client = results["methods"][label]["per_client"][seed - cfg["seed"]]
    frame["test acc"] = [a / 100.0 for a in per_client]
    frame.index.name = "client"
    return frame
