"""What is known about why a claim does not hold at a preset: the finding the claims table's "why" ends with.

Each finding has two parts. What is the authors' design -- for FedL2P, checked against the authors' code
(github.com/royson/fedl2p, commit fe1944e): the meta-nets BNNet and LRNet, 3-layer MLPs with a clamp at
the output (``src/models/weight_net.py`` lines 5-36), their Xavier-normal init with gain 0.1
(``weights_init``, lines 38-42, applied in ``src/apps/clients/fedl2p_classification_client.py`` line 514
with ``gain_init: 0.1`` of ``configs/cifar10/cifar_fedl2p.yaml`` lines 23 and 34), the clamp's
straight-through gradient (``ClampSTE``, ``src/models/model_utils.py`` lines 63-73) and the IFT and FOMAML
outer steps (``fedl2p_classification_client.py`` lines 318-358); pflkit's are the same
(`pflkit.meta.metanets`, docs/fidelity.md) -- and what is measured here, computed from the results and
the code each time the table is written, never typed in: BNNet's input sensitivity at that init
(`bnnet_sensitivity`), the BN layers the model has (the analysis' ``beta_per_layer``), the meta rounds run
against the paper preset's (the experiment files), the widest spread of the clients' beta.
"""
from __future__ import annotations

import functools
from typing import Mapping

AUTHORS = "royson/fedl2p"
PAPER_BN_LAYERS = "ResNet-18's 20"  # the paper's backbone (sec. 4.1): 20 BatchNorm layers, as torchvision builds it
DESIGN = (f"the meta-nets (BNNet, LRNet: `{AUTHORS}` src/models/weight_net.py:5-36), their App. E init (Xavier gain "
          "0.1, weight_net.py:38-42 with configs/cifar10/cifar_fedl2p.yaml:23,34), the clamp with its straight-through "
          "gradient (src/models/model_utils.py:63-73) and the IFT / FOMAML+ outer steps "
          "(src/apps/clients/fedl2p_classification_client.py:318-358) are the authors' design, which pflkit follows")


@functools.lru_cache(maxsize=8)
def bnnet_sensitivity(num_bn: int, seed: int = 0) -> float:
    """RMS over outputs of ||d beta / d xi|| of a BNNet with ``num_bn`` BN layers at App. E's init (seeded),
    at xi = 0: how far the clients' beta can differ per unit of difference in their inputs."""
    import torch
    from torch.func import jacrev

    from pflkit.meta.metanets import bnnet

    net = bnnet(num_bn, generator=torch.Generator().manual_seed(seed))
    jac = jacrev(lambda z: net.body(z.reshape(1, -1)).reshape(-1))(torch.zeros(num_bn)).detach()
    return float(jac.norm() / jac.shape[0] ** 0.5)


def _fedl2p_runs(results: Mapping[str, dict]) -> list[dict]:
    return [r for n, r in sorted(results.items()) if n.startswith("fedl2p_") and (r.get("analysis") or {}).get("FedL2P")]


def _bn_layers(runs: list[dict]) -> list[int]:
    return sorted({len(s["beta_per_layer"]) for r in runs for s in r["analysis"]["FedL2P"].get("seeds", [])
                   if s.get("beta_per_layer")})


def _span(values: list[int | float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def stage_rounds(results: Mapping[str, dict], pattern: str, algorithm: str) -> tuple[list[int], list[int]]:
    """(rounds of ``algorithm``'s stages in the results of experiments whose names match ``pattern`` (a glob),
    the rounds the same stages have at the ``paper`` preset of their experiment files)."""
    import fnmatch

    from pflkit.run.experiments import list_experiments, resolve

    files = list_experiments()
    here, paper = [], []
    for name, res in sorted(results.items()):
        if not fnmatch.fnmatchcase(name, pattern) or "methods" not in res:
            continue
        mine = [m for m in (res.get("config") or {}).get("methods", []) if m.get("algorithm") == algorithm]
        if not mine:
            continue
        here += [int(m["rounds"]) for m in mine]
        if name in files:
            try:
                full = resolve(files[name], "paper")
            except Exception:  # noqa: BLE001 - a finding must not stop the report
                continue
            paper += [m.config.rounds for m in full.methods if m.algorithm == algorithm]
    return here, paper


def _fedl2p_scale(results: Mapping[str, dict]) -> str:
    """The measured reasons at this scale, from the FedL2P runs in ``results``."""
    runs = _fedl2p_runs(results)
    parts = []
    layers = _bn_layers(runs)
    if layers:
        sens = bnnet_sensitivity(max(layers))
        parts.append(f"App. E's init gives BNNet an input sensitivity of {sens:.1e} per unit of xi "
                     f"(`pflkit.report.findings.bnnet_sensitivity`), so clients get about the same beta")
        parts.append(f"the model has {_span(layers)} BN layers instead of {PAPER_BN_LAYERS}")
    here, paper = stage_rounds(results, "fedl2p_*", "fedl2p")
    if here:
        parts.append(f"{_span(here)} meta rounds instead of the paper's {_span(paper) if paper else '500'} "
                     f"(`{AUTHORS}` configs/cifar10/cifar_fedl2p.yaml:42: num_rounds 500)")
    return "; measured at this scale: " + "; ".join(parts) if parts else ""


def _budget(results: Mapping[str, dict], pattern: str, algorithm: str, label: str) -> str:
    here, paper = stage_rounds(results, pattern, algorithm)
    if not here or not paper or max(here) >= min(paper):
        return ""
    return f"{label} trained {_span(here)} rounds here against {_span(paper)} at the `paper` preset"


def finding(claim: str, results: Mapping[str, dict]) -> str:
    """The finding for claim ``claim`` (a `pflkit.report.claims` function's name) on ``results``; "" when
    nothing is known beyond the claim's own reason."""
    if claim.startswith("fedl2p_"):
        extra = ""
        if claim == "fedl2p_matches_best_ft":
            extra = ("; the kept lambda is the round with the lowest mean validation loss of its sampled clients, "
                     f"unweighted in the authors' code (`{AUTHORS}` src/apps/fedl2p_classification_app.py:270-273), "
                     "sample-weighted in pflkit's (docs/fidelity.md)")
        return DESIGN + _fedl2p_scale(results) + extra
    if claim == "pfedhn_beats_baselines_n50":
        return _budget(results, "pfedhn_table1_*_n50", "pfedhn", "pFedHN")
    if claim == "pfedhn_pc_matches":
        return _budget(results, "pfedhn_*", "pfedhn_pc", "pFedHN-PC")
    if claim == "fedselect_beats_fedavg_lg":
        return _budget(results, "fedselect_*_s2", "fedselect", "FedSelect")
    if claim == "pfedvem_best_under_drift":
        return _budget(results, "pfedvem_*", "pfedvem", "pFedVEM")
    return ""
