"""Sentences that read a result: what a notebook says after a figure or table, generated, never typed.

Each function takes saved results (a run's ``results.json`` or its committed compact form), a federation or
checked claims and returns Markdown. Numbers come from the arguments only, so the prose cannot drift from
the results it describes.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pflkit.report.figures import constant_statement, visible_spread


def _ok(results: dict) -> dict[str, float]:
    return {k: m["acc_mean"] for k, m in results["methods"].items()
            if m.get("status") == "ok" and m.get("acc_mean") is not None}


def accuracy_frame(results: dict, paper_header: str = "paper") -> pd.DataFrame:
    """One row per method: accuracy (mean over clients, %, two decimals; ± std over seeds when several),
    the paper's number, the status; for display (the notebook's HTML table)."""
    rows = []
    for label, m in results["methods"].items():
        ok = m.get("status") == "ok" and m.get("acc_mean") is not None
        seeds = len(m.get("per_seed") or [])
        ours = f"{m['acc_mean']:.2f}" + (f" ± {m['acc_std']:.2f}" if ok and seeds > 1 else "") if ok else "—"
        rows.append({"method": label, "accuracy (%)": ours,
                     paper_header: "" if m.get("published") is None else f"{m['published']:.2f}",
                     "seeds": seeds, "status": m.get("status")})
    return pd.DataFrame(rows).set_index("method")


def classes_per_client(fed, split: str = "train", share: float = 0.05) -> np.ndarray:
    """How many classes hold at least ``share`` of each client's ``split`` samples."""
    hist = np.asarray(fed.histograms(split), dtype=float)
    frac = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
    return (frac >= share).sum(axis=1)


def signed(value: float, digits: int = 1) -> str:
    """``value`` with its sign at ``digits`` decimals, a difference that rounds to zero as ``+0.0`` (never
    ``-0.0``, which reads as a loss)."""
    return f"{round(value, digits) + 0.0:+.{digits}f}"


def label_shift_reading(fed, split: str = "train") -> str:
    """How skewed the clients' labels are: classes holding >= 5% of a client's samples, median and range."""
    k = classes_per_client(fed, split)
    return (f"Of the {fed.num_classes} classes, a client's {split} samples are spread over a median of "
            f"**{int(np.median(k))}** (at least 5% of its samples each; from {int(k.min())} to {int(k.max())} "
            f"over the {len(k)} clients). A model trained for all clients sees a mixture no client has.")


def rounds_reading(results: dict, label: str, metric: str = "val_acc") -> str:
    """Where stage ``label``'s validation curve (first seed) started, peaked and ended, and the kept round."""
    hist = next(iter(results["rounds"].get(label, {}).values()), [])
    pts = [(h["round"], 100.0 * h[metric]) for h in hist if h.get(metric) is not None]
    if not pts:
        return f"{label}: no {metric} was logged."
    best = max(pts, key=lambda p: p[1])
    kept = (results["methods"].get(label, {}).get("best_round") or [None])[0]
    text = (f"{label}'s mean validation accuracy went from {pts[0][1]:.1f}% (round {pts[0][0]}) to "
            f"{pts[-1][1]:.1f}% (round {pts[-1][0]}), highest {best[1]:.1f}% at round {best[0]}")
    if len(pts) == 1:
        text = f"{label} logged one validation point: {pts[0][1]:.1f}% at round {pts[0][0]}"
    return text + (f"; the model kept for the next stages is round {kept}'s." if kept is not None else ".")


def methods_reading(results: dict, reference: str | None = None) -> str:
    """The best method, and each other method's gap to ``reference`` (default: the first method)."""
    acc = _ok(results)
    if not acc:
        return "No method finished with status ok."
    reference = reference if reference in acc else next(iter(acc))
    best = max(acc, key=acc.get)
    parts = [f"{k} {v - acc[reference]:+.1f}" for k, v in acc.items() if k != reference]
    bad = [k for k, m in results["methods"].items() if m.get("status") != "ok"]
    text = (f"Best: **{best}** at {acc[best]:.1f}%. Against {reference} ({acc[reference]:.1f}%), in points: "
            + ", ".join(parts) + ".")
    return text + (f" Not ok (no number shown): {', '.join(bad)}." if bad else "")


def per_client_reading(results: dict, a: str, b: str) -> str:
    """On how many clients method ``a`` beats, ties or trails ``b`` (first seed, test accuracy)."""
    pa = np.asarray(results["methods"][a]["per_client"][0], dtype=float)
    pb = np.asarray(results["methods"][b]["per_client"][0], dtype=float)
    d = pa - pb
    return (f"{a} beats {b} on {int((d > 0).sum())} of {len(d)} clients, ties on {int((d == 0).sum())} and "
            f"trails on {int((d < 0).sum())}; the mean per-client difference is {d.mean():+.1f} points.")


def beta_reading(analysis: dict, label: str = "FedL2P") -> str:
    """What FedL2P's learned beta (Eq. 2) did: its value per client, stated when it does not vary."""
    seeds = (analysis.get(label) or {}).get("seeds") or []
    betas = [b for s in seeds for b in s.get("beta_per_client", []) if b is not None]
    if not betas:
        return f"{label}: no per-client beta was stored."
    if not visible_spread(betas, span=1.0):
        return (f"{label}: " + constant_statement("β", betas) + "; its meta-net gave every client the same mix of "
                "BN statistics, so no per-client plot is drawn.")
    b = np.asarray(betas)
    side = "the pretrained model's statistics (β → 0)" if b.mean() < 0.5 else "each client's own statistics (β → 1)"
    return (f"{label}: β (Eq. 2) ranges from {b.min():.2f} to {b.max():.2f} over {len(b)} clients (mean {b.mean():.2f}): "
            f"on average the clients lean to {side}.")


def takeaways(claims, preset: str) -> str:
    """Markdown bullets from checked claims (`pflkit.report.claims.ClaimResult`): each verdict with its
    evidence, and for a claim that does not hold, why (its finding)."""
    if not claims:
        return f"- No claim of the paper is checked by the results shown here (preset {preset})."
    lines = []
    for c in claims:
        line = f"- **{c.verdict}**: {c.text} (paper: {c.paper_value}; ours at {preset}: {c.ours}"
        line += f"; 95% interval: {c.interval})" if getattr(c, "interval", "") else ")"
        if c.verdict != "holds" and c.reason:
            line += f". Why: {c.reason}"
        lines.append(line)
    return "\n".join(lines)


def _beta_mean(results: dict, label: str) -> float | None:
    seeds = ((results.get("analysis") or {}).get(label) or {}).get("seeds") or []
    betas = [b for s in seeds for b in s.get("beta_per_client", []) if b is not None]
    return float(np.mean(betas)) if betas else None


def personalization_takeaways(results: dict, global_label: str, learned: str = "FedL2P") -> str:
    """Bullets for a run of Global, FT (BN C/G/I) and FedL2P: what fine-tuning gave over the global model,
    how much the BN choice moved it, where FedL2P's mean beta (Eq. 2) leaned and how it compares."""
    acc = _ok(results)
    fts = {k: v for k, v in acc.items() if k.startswith("FT")}
    if global_label not in acc or not fts:
        return "- This run lacks the Global model or the FT baselines with status ok; nothing to compare."
    best = max(fts, key=fts.get)
    lines = [f"- Fine-tuning on each client's data takes the Global model's {acc[global_label]:.1f}% to "
             f"{fts[best]:.1f}% with the best FT variant, {best}; "
             + ("every FT variant gains." if min(fts.values()) > acc[global_label] else
                "not every variant gains: " + ", ".join(f"{k} {v:.1f}%" for k, v in fts.items()
                                                       if v <= acc[global_label]) + "."),
             f"- The BN statistics alone move the fine-tuned accuracy over {max(fts.values()) - min(fts.values()):.1f} "
             "points between the FT variants."]
    beta = _beta_mean(results, learned)
    if learned in acc:
        lean = "" if beta is None else (f" Its mean β is {beta:.2f}: it leans to the "
                                        + ("global statistics (BN G's side)." if beta < 0.5 else
                                           "clients' own statistics (BN C's side)."))
        lines.append(f"- {learned}, which learns that choice per client, reaches {acc[learned]:.1f}% "
                     f"({acc[learned] - fts[best]:+.1f} points against {best}).{lean}")
    return "\n".join(lines)


def client_values(analysis: dict, key: str, labels=("L2P", "FedL2P")) -> dict[str, list]:
    """``{method: [value per client over seeds]}`` of a per-client list in FedL2P's stored summary
    (``beta_per_client``, ``sparsity_per_client``), for the methods that stored it."""
    out = {}
    for k in labels:
        seeds = (analysis.get(k) or {}).get("seeds") or []
        vals = [v for s in seeds for v in s.get(key, []) if v is not None]
        if vals:
            out[k] = vals
    return out


def sparsity_reading(analysis: dict, label: str) -> str:
    """Whether FedL2P's learning rates froze anything (eta = 0: the share of parameters, Sec. 4.2)."""
    v = client_values(analysis, "sparsity_per_client", (label,)).get(label)
    if not v:
        return f"{label}: no sparsity stored."
    if not any(v):
        return f"{label}: no learning rate is 0 on any client (sparsity 0): every layer is fine-tuned."
    return (f"{label}: on average {np.mean(v):.2f} of the parameters are frozen (η = 0), from {min(v):.2f} to "
            f"{max(v):.2f} over {len(v)} clients.")


def _traffic(history: dict[str, list[dict]]) -> dict[str, dict]:
    """Per stage with rounds: rounds, clients per round, bytes per client down / up (mean), total MB."""
    out = {}
    for stage, rows in history.items():
        if not rows:
            continue
        clients = np.array([max(int(r.get("clients") or 0), 1) for r in rows], dtype=float)
        down = np.array([r.get("bytes_down") or 0 for r in rows], dtype=float)
        up = np.array([r.get("bytes_up") or 0 for r in rows], dtype=float)
        out[stage] = {"rounds": len(rows), "clients": float(clients.mean()),
                      "down": float((down / clients).mean()), "up": float((up / clients).mean()),
                      "total_mb": float((down + up).sum() / 1e6),
                      "failed": sorted({int(c) for r in rows for c in (r.get("failed") or [])})}
    return out


def communication_reading(history: dict[str, list[dict]]) -> str:
    """What each federated stage sent per client and round and in all, from its history rows
    (``{stage: [{"round", "clients", "bytes_down", "bytes_up", ...}, ...]}``)."""
    lines = []
    for stage, t in _traffic(history).items():
        lines.append(f"- **{stage}**: {t['rounds']} rounds of {t['clients']:.0f} clients; per client and round "
                     f"{t['down'] / 1e3:,.1f} kB down ({t['down'] / 4:,.0f} float32 values) and "
                     f"{t['up'] / 1e3:,.1f} kB up; {t['total_mb']:.2f} MB in all.")
    return "\n".join(lines) if lines else "No stage of this run has federated rounds."


def communication_takeaway(history: dict[str, list[dict]], base: str = "Global") -> str:
    """One bullet comparing every stage's total traffic with ``base``'s (FedAvg's), from the history rows."""
    t = _traffic(history)
    if base not in t or len(t) < 2:  # nothing to compare with: the per-stage bullets (or the one sentence)
        return communication_reading(history) if t else f"- {communication_reading(history)}"
    parts = []
    for stage, s in t.items():
        if stage == base:
            continue
        per_round = (s["down"] + s["up"]) / (t[base]["down"] + t[base]["up"])
        parts.append(f"{stage} sent {s['total_mb']:.2f} MB in {s['rounds']} rounds "
                     f"({s['total_mb'] / t[base]['total_mb']:.0%} of {base}'s {t[base]['total_mb']:.2f} MB in "
                     f"{t[base]['rounds']}), {per_round:.1f}x {base}'s bytes per client and round")
    return "- " + "; ".join(parts) + "."


def failed_clients(history: dict[str, list[dict]]) -> list[int]:
    """The clients any round of any stage lists as failed, sorted."""
    return sorted({c for t in _traffic(history).values() for c in t["failed"]})
