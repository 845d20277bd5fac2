"""Compact results: the committed form of one run (``results/<preset>/<experiment>.json``).

`compact_result` keeps what the reproduction report (`pflkit.report.reproduction`) and the claim
checks (`pflkit.report.claims`) read: per method the summary, per-seed and per-client accuracies and
the published number; the per-round history; the resolved config and declared deviations; the code
version (`pflkit.batch.versions.code_version`) and configuration digest the batch compares to skip it;
the data files' names, sizes and sha256 (no machine's folders); and a short form of each method's
per-seed report (FedL2P's beta and sparsity per client, the ARI of Table 6). No checkpoints or weights.
The batch adds ``reused`` when the run took finished stages from another experiment's identical run
(`pflkit.batch.reuse`): ``{label: {"from": experiment, "seeds": [...]}}``, and ``invocations``: every
invocation that ran it, ``{"unrecorded": bool, "runs": [{"started", "gpu", "cpu_capability", "seconds"}]}``
(``environment`` is the last invocation's only; ``unrecorded``: it was resumed from before they were kept;
``seconds`` null: that invocation was killed).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pflkit.io import read_json, slug

COMPACT_FORMAT = 1
# settings that do not change a run's numbers (or only document it): not part of `config_digest`
NOT_HASHED = ("published", "published_detail", "title", "deviations", "device", "kernels")


def config_digest(config: dict) -> str:
    """Digest of a resolved configuration (``ExperimentConfig.to_dict()``) less `NOT_HASHED`: what the
    batch compares to skip an experiment and the report to say a result is out of date."""
    d = {k: v for k, v in config.items() if k not in NOT_HASHED}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def compact_path(results_dir, preset: str, name: str) -> Path:
    return Path(results_dir) / preset / f"{name}.json"


def command_for(name: str, preset: str, overrides=()) -> str:
    """The command that reproduces one experiment's compact result."""
    extra = "".join(f" --set '{o}'" for o in overrides)
    return f"pflkit reproduce --preset {preset} --only {name}{extra}"


# ----------------------------------------------------------------------------- compact results

def _files(records) -> list[dict]:
    """Data / weights file records without machine-specific folders (the file name, size, sha256)."""
    out = []
    for r in records or []:
        r = dict(r)
        if "path" in r:
            r["file"] = Path(str(r.pop("path"))).name
        out.append(r)
    return out


def _no_folders(text: str) -> str:
    """A data source description with absolute paths cut to file names (no machine's folders)."""
    return re.sub(r"(?<![\w.])/(?:[^\s/:;,()]+/)+([^\s/:;,()]+)", r"\1", text or "")


def _round(o, digits: int = 6):
    if isinstance(o, float):
        return float(f"{o:.{digits}g}")
    if isinstance(o, dict):
        return {k: _round(v, digits) for k, v in o.items()}
    if isinstance(o, list):
        return [_round(v, digits) for v in o]
    return o


def _hyperparameter_summary(rows: list[dict], info: list[dict], seed: int) -> dict:
    """FedL2P's report of one seed in short: each client's beta (mean over BN layers) and sparsity, and,
    when the clients carry domains, the ARI of each meta-net input / output clustering (Table 6); and the
    per-client arrays its figures draw (`report_rows` reads them back): beta per BN layer, eta per tensor,
    BNNet's input xi (Eq. 3) and LRNet's input features (Eq. 4), a few dozen numbers per client."""
    import numpy as np

    betas = [float(np.mean(list(r["beta"].values()))) if r.get("beta") else None for r in rows]
    out = {"beta_per_client": betas, "sparsity_per_client": [r.get("sparsity") for r in rows],
           "beta_per_layer": {k: float(np.mean([r["beta"][k] for r in rows])) for k in (rows[0].get("beta") or {})}}
    layers, tensors = list(rows[0].get("beta") or {}), list(rows[0].get("eta") or {})
    out["arrays"] = {"clients": [r["client"] for r in rows], "bn_layers": layers, "tensors": tensors,
                     "beta": [[r["beta"][k] for k in layers] for r in rows],
                     "eta": [[r["eta"][k] for k in tensors] for r in rows],
                     "xi": [r.get("xi") for r in rows], "features": [r.get("features") for r in rows]}
    domains = [c.get("domain") for c in info]
    if len(rows) == len(info) and None not in domains and len(set(domains)) > 1:
        import warnings

        from pflkit.analysis.clustering import meta_net_ari

        out["domains"] = domains
        with warnings.catch_warnings():  # sklearn's "graph is not fully connected" would break the progress bar
            warnings.simplefilter("ignore", UserWarning)
            out["ari"] = meta_net_ari(rows, [domains[r["client"]] for r in rows], seed=seed)
    return out


def report_rows(seed_summary: dict) -> list[dict] | None:
    """The per-client rows of FedL2P's report (`pflkit.algorithms.fedl2p.hyperparameter_report`'s form:
    ``client``, ``beta`` {layer: value}, ``eta`` {tensor: value}, ``sparsity``, ``xi``, ``features``) from one
    seed's summary in a compact result; None for a result made before the arrays were stored."""
    arrays = seed_summary.get("arrays")
    if not arrays:
        return None
    sparsity = seed_summary.get("sparsity_per_client") or [None] * len(arrays["clients"])
    return [{"client": c, "beta": dict(zip(arrays["bn_layers"], b)), "eta": dict(zip(arrays["tensors"], e)),
             "sparsity": sp, "xi": x, "features": f}
            for c, b, e, sp, x, f in zip(arrays["clients"], arrays["beta"], arrays["eta"], sparsity, arrays["xi"],
                                          arrays["features"])]


def analysis(run_dir: Path, results: dict) -> dict:
    """Per method, the short form of its per-seed report (``seed*/<slug>.report.json``): FedL2P's
    hyperparameters (`_hyperparameter_summary`); any other report (a dict of per-client lists) as is."""
    cfg = results["config"]
    seeds = [cfg["seed"] + k for k in range(cfg["seeds"])]
    out: dict = {}
    for label in results["methods"]:
        per_seed = []
        for s in seeds:
            path = Path(run_dir) / f"seed{s}" / f"{slug(label)}.report.json"
            if not path.exists():
                continue
            rep = read_json(path)
            if isinstance(rep, list) and rep and "beta" in rep[0]:
                per_seed.append({"seed": s, **_hyperparameter_summary(rep, _client_info(run_dir, s), s)})
            elif isinstance(rep, dict):
                per_seed.append({"seed": s, **rep})
        if per_seed:
            out[label] = {"seeds": _round(per_seed)}
            betas = [b for p in per_seed for b in p.get("beta_per_client", []) if b is not None]
            if betas:
                out[label]["beta_mean"] = sum(betas) / len(betas)
    return out


def _client_info(run_dir: Path, seed: int) -> list[dict]:
    import numpy as np

    path = Path(run_dir) / f"seed{seed}" / "federation.npz"
    if not path.exists():
        return []
    with np.load(path, allow_pickle=False) as z:
        return json.loads(str(z["__info__"])) if "__info__" in z else []


def compact_result(results: dict, run_dir, *, cfg_hash: str, code: dict | None, overrides=()) -> dict:
    """The committed form of one run: its methods (summary, per-seed and per-client accuracies), the
    per-round history, the resolved config, declared deviations, versions, data checksums; no weights."""
    config = results["config"]
    data = dict(results.get("data") or {})
    data.update(files=_files(data.get("files")), source=_no_folders(data.get("source", "")))
    out = {
        "format": COMPACT_FORMAT, "experiment": config["name"], "paper": config.get("paper", ""),
        "table": config.get("table", ""), "title": config.get("title", ""), "preset": config["preset"],
        "status": results["status"], "command": command_for(config["name"], config["preset"], overrides),
        "overrides": list(overrides), "fingerprint": {"config": cfg_hash, "code": code},
        "deviations": list(config.get("deviations", [])), "methods": results["methods"],
        "analysis": analysis(Path(run_dir), results), "history": _round(results.get("rounds", {})),
        "timing": {k: v for k, v in (results.get("timing") or {}).items() if k != "stages"},
        "version": results.get("version", {}), "environment": results.get("environment", {}),
        "data": data, "config": config,
    }
    if "pretrain_data" in results:
        pre = results["pretrain_data"]
        out["pretrain_data"] = {**pre, "files": _files(pre.get("files")), "source": _no_folders(pre.get("source", ""))}
    if "weights" in results:
        out["weights"] = _files(results["weights"])
    return out
