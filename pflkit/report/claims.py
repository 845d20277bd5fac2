"""Each paper's qualitative claims, written once as small pure functions over compact results.

A claim function takes ``{experiment name: compact result}`` (`pflkit.batch.reproduce.compact_result`,
the files under ``results/<preset>/``) and returns a `ClaimResult`: ``holds``, ``fails``,
``inconclusive``, ``budget-limited`` or ``not run`` (the experiments or methods it needs have no
usable result), with the paper's number, ours, the 95% interval the verdict was read from and a
one-line reason. Accuracies are the results' ``acc_mean`` (percent, mean over clients, averaged
over seeds). The paper's side is computed from the same experiments' ``published`` numbers where
the claim is about a table.

How sure a verdict is (`pflkit.report.verdicts`): a comparison of two methods of one run is paired
over its clients, the mean per-client difference with a 95% bootstrap interval (seeds resampled too
where a row has several); a row holds when the whole interval is on the claim's side of its margin,
fails when the whole interval is on the other side, and is inconclusive when it straddles the margin;
a failing row whose method was still learning when training stopped is budget-limited. A claim over
several rows fails when one fails, else is budget-limited, inconclusive or holds (`verdicts.combine`).
Claims about a statistic of one method (beta, ARI) read the bootstrap interval of that statistic over
clients (or over runs, for the ARI, one number per run) against the claim's threshold.

For one paper, `claims_of` returns its `ClaimResult`s: ``verdict``, ``interval`` (the text of the
interval the verdict was read from), ``reason`` (why), and ``rows`` (`RowVerdict`, per compared row).

The thresholds that turn "near 0", "at least matches" and "recovers" into a test are named
constants below; `check_all` runs every claim of `CLAIMS`.
"""
from __future__ import annotations

import fnmatch
import json
import re
import statistics
from dataclasses import dataclass
from typing import Callable, Mapping

from pflkit.report.findings import finding
from pflkit.report.verdicts import (BUDGET_LIMITED, FAILS, HOLDS, INCONCLUSIVE, NOT_RUN, VERDICTS, Interval,
                                    Rise, combine, mean_interval, paired_interval, range_interval, read,
                                    still_learning)

MATCH_TOL = 1.0  # percentage points: "at least matches" allows this shortfall (seed noise at small presets)
BETA_NEAR_ZERO = 0.2  # mean beta at most this under label shift ("learns beta near 0")
BETA_ABOVE_ZERO = 0.3  # mean beta at least this across feature-shifted domains ("clearly above 0")
ARI_RECOVERS = 0.5  # ARI of the LRNet-input clustering vs the true domains at least this
BETA_SPREAD = 0.1  # the clients' kept beta spanning at least this in one run: "beta differs between clients"
LABEL_SHIFT_DATA = ("cifar10", "cifar100", "digits")  # with a Dirichlet partition: label shift only
FEATURE_SHIFT_DATA = ("cifar10c", "digit_domains", "office_caltech10", "domainnet")

Results = Mapping[str, dict]  # experiment name -> compact result (or a stub of a result not run: its config)


@dataclass(frozen=True)
class RowVerdict:
    """One compared row of a pairwise claim: ``label`` against ``rival`` in experiment ``name``, their mean
    accuracies, the paired interval of ``label - rival`` (None without per-client values: then the verdict
    is the point comparison's), the row's verdict and, when budget-limited, how ``label``'s curve ended."""

    name: str
    label: str
    rival: str
    ours: float
    theirs: float
    interval: Interval | None
    margin: float
    verdict: str
    rise: Rise | None = None

    def text(self) -> str:
        gap = self.interval.text() if self.interval else f"{self.ours - self.theirs:+.2f} (no per-client values)"
        n = f", {self.interval.clients} clients" if self.interval else ""
        n += f", {self.interval.seeds} seeds" if self.interval and self.interval.seeds > 1 else ""
        return f"{self.name}: {self.label} - {self.rival} {gap} pp{n}"


@dataclass(frozen=True)
class ClaimResult:
    """A checked claim: ``verdict`` one of holds / fails / inconclusive / budget-limited / not run;
    ``interval`` the 95% interval(s) it was read from, as text; ``rows`` the pairwise rows (if any)."""

    claim: str
    paper: str
    text: str
    verdict: str
    paper_value: str
    ours: str
    reason: str
    interval: str = ""
    rows: tuple = ()


# ----------------------------------------------------------------------------- helpers

def acc(result: dict, label: str) -> float | None:
    """Our mean accuracy of ``label`` (None when the method is absent or not ``ok``)."""
    m = result.get("methods", {}).get(label)
    return m["acc_mean"] if m and m.get("status") == "ok" and m.get("acc_mean") is not None else None


def published(result: dict, label: str) -> float | None:
    m = result.get("methods", {}).get(label)
    p = m.get("published") if m else None
    return p if p is not None else result.get("config", {}).get("published", {}).get(label)


def _matching(results: Results, pattern: str) -> list[tuple[str, dict]]:
    return sorted(((n, r) for n, r in results.items() if fnmatch.fnmatchcase(n, pattern)), key=lambda x: x[0])


def labels(result: dict) -> list[str]:
    """The methods of a result and those its experiment publishes a number for (a result that was not
    run may hold only ``config.published``: the paper's side of a claim is then still known)."""
    return list(dict.fromkeys([*result.get("methods", {}), *result.get("config", {}).get("published", {})]))


def _gaps(results: Results, pattern: str, label: str, rivals: Callable[[str], bool], value=acc):
    """Per experiment matching ``pattern`` where ``label`` and a rival have a value:
    (name, label's value, best rival's label, its value)."""
    rows = []
    for name, res in _matching(results, pattern):
        ours = value(res, label)
        vals = {k: value(res, k) for k in labels(res) if k != label and rivals(k)}
        vals = {k: v for k, v in vals.items() if v is not None}
        if ours is not None and vals:
            best = max(vals, key=vals.get)
            rows.append((name, ours, best, vals[best]))
    return rows


def _not_ok(results: Results, pattern: str, compared: Callable[[str], bool]) -> list[str]:
    """``experiment: method (status)`` for each compared method of a result matching ``pattern`` that
    ran but is not ``ok`` (diverged, incomplete): `acc` leaves it out of every comparison, so a claim
    names it instead of reading as if it had been beaten."""
    return [f"{name}: {k} ({m.get('status')})" for name, res in _matching(results, pattern)
            for k, m in res.get("methods", {}).items() if compared(k) and m.get("status") not in (None, "ok")]


def _left_out(results: Results, pattern: str, compared: Callable[[str], bool]) -> str:
    """`_not_ok` as a clause for a claim's reason ("" when every compared method is ok)."""
    gone = _not_ok(results, pattern, compared)
    return f"; not compared (not ok): {', '.join(gone)}" if gone else ""


def _count(rows, ok: Callable[[float, float], bool]) -> str:
    return f"{sum(ok(a, b) for _, a, _, b in rows)}/{len(rows)}"


def _worst(rows) -> str:
    name, a, best, b = min(rows, key=lambda r: r[1] - r[3])
    return f"worst {a - b:+.2f} pp ({name}: {a:.2f} vs {best} {b:.2f})"


def _versus_paper(res: dict, label: str, rival: str) -> str:
    """``label`` against ``rival`` in one result, each beside the paper's number: shows whether a failed
    comparison comes from our ``label`` falling short of the paper or from the rival exceeding it."""
    def side(k):
        ours, paper = acc(res, k), published(res, k)
        return f"{k} {ours:.2f}" + (f" (paper {paper:g})" if paper is not None else "")
    return f"{side(label)} vs {side(rival)}"


def _worst_failure(results: Results, failed, split: Callable[[str], tuple[str, str]]) -> str:
    """``experiment: label vs rival`` (`_versus_paper`) for the failed row with the largest shortfall;
    ``split`` turns a row's name into (experiment, label). Whether a failing row's ``label`` was still
    learning is its verdict (budget-limited, `_judge`)."""
    name, _, rival, _ = min(failed, key=lambda r: r[1] - r[3])
    experiment, label = split(name)
    res = results[experiment]
    return f"{experiment}: {_versus_paper(res, label, rival)}"


def _and(reason: str, clause: str) -> str:
    """``reason`` with ``clause`` after a semicolon (unchanged when ``clause`` is empty)."""
    return f"{reason}; {clause}" if clause else reason


def _result(fn, verdict: str, paper_value: str, ours: str, reason: str, interval: str = "",
            rows: tuple = ()) -> ClaimResult:
    paper, text = fn.paper, fn.text
    return ClaimResult(fn.__name__, paper, text, verdict, paper_value, ours, reason, interval, tuple(rows))


def _judge(res: dict, name: str, label: str, rival: str, ours: float, theirs: float, margin: float,
           strict: bool, ok: Callable[[float, float], bool]) -> RowVerdict:
    """One row's verdict: the paired interval of ``label - rival`` over the clients (and seeds) read against
    ``margin`` (`verdicts.read`); a failing row whose ``label`` was still learning is budget-limited."""
    methods = res.get("methods", {})
    iv = paired_interval(methods[label].get("per_client") or [], methods[rival].get("per_client") or [])
    verdict = read(iv, margin, strict=strict) if iv else (HOLDS if ok(ours, theirs) else FAILS)
    rise = still_learning((res.get("history") or {}).get(label)) if verdict == FAILS else None
    return RowVerdict(name, label, rival, ours, theirs, iv, margin, BUDGET_LIMITED if rise else verdict, rise)


def _row_counts(rows: list[RowVerdict]) -> str:
    """``"rows: 2 holds, 3 inconclusive"``: how many rows read each verdict."""
    counts = {v: sum(r.verdict == v for r in rows) for v in VERDICTS}
    return "rows: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)


def _decisive(rows: list[RowVerdict]) -> RowVerdict:
    """The row nearest to failing: the lowest lower bound above its margin (point gap without interval)."""
    return min(rows, key=lambda r: (r.interval.lo if r.interval else r.ours - r.theirs) - r.margin)


def _rows_text(rows: list[RowVerdict]) -> tuple[str, str]:
    """(the claim's interval text: its row nearest to failing, then the counts; the budget-limited rows' clause)."""
    worst = _decisive(rows)
    interval = f"{worst.text()}; {_row_counts(rows)}"
    limited = [r for r in rows if r.verdict == BUDGET_LIMITED]
    clause = ("; budget-limited (failing, but still learning when training stopped): "
              + "; ".join(f"{r.name}: {r.label}'s {r.rise.text()}" for r in limited)) if limited else ""
    return interval, clause


def claim(paper: str, text: str):
    """Mark a function as a claim of ``paper`` stated as ``text`` (kept on the function)."""
    def wrap(fn):
        fn.paper, fn.text = paper, text
        return fn
    return wrap


def _pairwise(fn, results: Results, pattern: str, label: str, rivals, ok, rule: str,
              explain: Callable[[Results, list], str] | None = None, *, margin: float = 0.0,
              strict: bool = False, finding: str = "") -> ClaimResult:
    """A claim "``label`` vs its best rival, per experiment": each row's verdict reads the paired interval of
    ``label - rival`` against ``margin`` (`_judge`; ``strict``: the bound must clear it), ``ok`` is the same
    rule on the means (the counts shown); ``explain(results, rows short of ok)`` adds a clause to the reason of a
    claim that does not hold, and so does ``finding`` (what is known about why, `pflkit.report.findings`)."""
    ours, paper = _gaps(results, pattern, label, rivals), _gaps(results, pattern, label, rivals, published)
    paper_value = f"{rule} in {_count(paper, ok)} rows" if paper else "no published numbers"
    left_out = _left_out(results, pattern, lambda k: k == label or rivals(k))
    if not ours:
        return _result(fn, NOT_RUN, paper_value, "-", f"no result of {pattern} with {label} and a rival{left_out}")
    rows = [_judge(results[n], n, label, rival, a, b, margin, strict, ok) for n, a, rival, b in ours]
    verdict = combine([r.verdict for r in rows])
    short = [r for r in ours if not ok(r[1], r[3])]
    interval, limited = _rows_text(rows)
    reason = (f"{len(short)} of {len(ours)} scenarios short of the rule on the means, worst "
              f"{_worst_failure(results, short, lambda name: (name, label))}" if short
              else f"every one of {len(ours)} scenarios on the means") + limited
    if short and explain:
        reason += explain(results, short)
    if verdict != HOLDS:
        reason = _and(reason, finding)
    return _result(fn, verdict, paper_value, f"{rule} in {_count(ours, ok)}; {_worst(ours)}", reason + left_out,
                   interval, rows)


# ----------------------------------------------------------------------------- FedL2P

def _beta(res: dict, label: str = "FedL2P") -> float | None:
    return (res.get("analysis", {}).get(label) or {}).get("beta_mean")


def _shift(res: dict) -> str | None:
    data = res.get("config", {}).get("data", {})
    if data.get("dataset") in FEATURE_SHIFT_DATA:
        return "feature"
    if data.get("dataset") in LABEL_SHIFT_DATA and data.get("scheme") == "dirichlet":
        return "label"
    return None


def _same_run(res: dict, label: str = "FedL2P") -> str:
    """What identifies ``label``'s run of an experiment: its data configuration and its outcome (per-client
    accuracies, kept rounds, the analysis' betas), without the paper's number beside it."""
    outcome = {k: v for k, v in (res.get("methods", {}).get(label) or {}).items() if k != "published"}
    return json.dumps([res.get("config", {}).get("data"), outcome, res.get("analysis", {}).get(label)],
                      sort_keys=True, default=str)


def _distinct(named: list[tuple[str, dict]], label: str = "FedL2P") -> tuple[list[tuple[str, dict]], list[str]]:
    """The runs less exact repeats of an earlier one, and a note ``"B = A"`` per repeat left out.

    Table 5 re-reports Table 3's FedL2P of the same scenario. With the same configuration and seed, our
    two experiments then hold the very same run, and a mean over runs must weigh it once."""
    first: dict[str, str] = {}
    kept, repeats = [], []
    for name, res in named:
        key = _same_run(res, label)
        if key in first:
            repeats.append(f"{name} = {first[key]}")
        else:
            first[key] = name
            kept.append((name, res))
    return kept, repeats


def _beta_by_dataset(runs: list[dict]) -> dict[str, tuple[float, list[dict]]]:
    """FedL2P runs grouped by dataset (readable name): (mean kept beta, the runs), in first-seen order."""
    from pflkit.data.datasets import dataset_name  # here: the registry loads torch, the rest of claims reads JSON

    groups: dict[str, list[dict]] = {}
    for res in runs:
        groups.setdefault(dataset_name(res.get("config", {}).get("data", {}).get("dataset", "?")), []).append(res)
    return {name: (_mean_beta(rs), rs) for name, rs in groups.items()}


def _mean_beta(runs: list[dict]) -> float:
    return sum(_beta(r) for r in runs) / len(runs)


def _client_betas(res: dict) -> list[float]:
    """The kept beta of every client of every seed of a run (`analysis`'s ``beta_per_client``)."""
    seeds = (res.get("analysis", {}).get("FedL2P") or {}).get("seeds", [])
    return [b for s in seeds for b in s.get("beta_per_client") or []]


def _beta_interval(runs: list[dict]) -> Interval | None:
    """The mean over runs of the clients' mean kept beta, with its bootstrap interval over clients (None when
    a run records no client's beta)."""
    groups = [_client_betas(r) for r in runs]
    return mean_interval(groups) if groups and all(groups) else None


def _bn_premise(runs: list[dict], kind: str, *, prefers_local: bool) -> list[str]:
    """Why beta may rightly differ from the paper's: the same runs' FT (BN C) (beta = 1) against FT (BN G)
    (beta = 0), mean over the runs that have both. The paper's beta follows whichever is better; when
    ours ranks them the other way, BNNet learning the other end is the better choice here."""
    pairs = [(acc(r, "FT (BN C)"), acc(r, "FT (BN G)")) for r in runs]
    pairs = [(c, g) for c, g in pairs if c is not None and g is not None]
    if not pairs:
        return []
    c, g = (sum(v) / len(pairs) for v in zip(*pairs))
    if (c > g) == prefers_local:
        return []
    better, worse = ("FT (BN G)", "FT (BN C)") if prefers_local else ("FT (BN C)", "FT (BN G)")
    return [f"in these {kind}-shift runs {better} beats {worse} ({max(c, g):.2f} vs {min(c, g):.2f}, mean of "
            f"{len(pairs)}), so beta {'near 0' if prefers_local else 'above 0'} is the better choice here: the "
            f"premise of the paper's figure does not hold at this preset"]


def _beta_rounds(res: dict, label: str = "FedL2P") -> list[tuple[int, int, float, float, float | None]]:
    """Per seed of ``label`` with a kept round: (kept round, rounds run, beta in round 1, beta in the last
    round, beta in the kept round or None), beta being the history's ``client_beta_mean`` (BNNet's mean
    beta on that round's clients)."""
    kept = (res.get("methods", {}).get(label) or {}).get("best_round") or []
    seeds = ((res.get("history") or {}).get(label) or {}).values()
    out = []
    for best, rows in zip(kept, seeds):
        betas = [r["client_beta_mean"] for r in rows or [] if r.get("client_beta_mean") is not None]
        if best and betas:
            at_kept = rows[int(best) - 1].get("client_beta_mean") if int(best) <= len(rows) else None
            out.append((int(best), len(rows), betas[0], betas[-1], at_kept))
    return out


def _kept_round(runs: list[dict], kind: str, kept_beta: float, *, toward_zero: bool) -> list[str]:
    """Why beta may sit short of where training took it: FedL2P keeps the lambda of the round whose sampled
    clients had the lowest mean validation loss (sec. 4.1), and at a short preset that is often an early
    round. Said when the last round's beta (mean over the same runs) is on the paper's side of the kept one."""
    rows = [r for res in runs for r in _beta_rounds(res)]
    if not rows:
        return []
    kept, total = (statistics.median(v) for v in zip(*(r[:2] for r in rows)))
    first, last = (sum(v) / len(rows) for v in zip(*(r[2:4] for r in rows)))
    if (last < kept_beta) != toward_zero:
        return []
    return [f"the {kind}-shift lambda kept is the one of the round with the lowest validation loss of its sampled "
            f"clients (sec. 4.1): median round {kept:g} of {total:g} in {len(rows)} runs, while beta went from "
            f"{first:.2f} in round 1 to {last:.2f} in the last round (means)"]


@claim("fedl2p", "FedL2P learns beta near 0 under label shift and clearly above 0 across feature-shifted domains")
def fedl2p_beta_by_shift(results: Results) -> ClaimResult:
    """Sec. 4.2, Fig. 2a / 2b: on CIFAR-10 label shift BNNet settles on beta = 0 (the pretrained
    model's BN statistics, i.e. FT (BN G)); on CIFAR-10-C and across domains it moves towards
    beta = 1 for clients whose features differ. The rule is on means over runs; with several
    feature-shift datasets, each one's mean is shown, and when some clear the threshold, the reasons
    for a low pooled mean are computed from the other datasets' runs."""
    runs: dict[str, list[dict]] = {"label": [], "feature": []}
    named, repeats = _distinct([(n, r) for n, r in _matching(results, "fedl2p_*")
                                if _beta(r) is not None and _shift(r)])
    for _, res in named:
        runs[_shift(res)].append(res)
    paper_value = "beta = 0 under label shift (Fig. 2a); up to 1 under feature shift (Fig. 2b, CIFAR-10-C)"
    if not runs["label"] or not runs["feature"]:
        missing = [k for k, v in runs.items() if not v]
        return _result(fedl2p_beta_by_shift, NOT_RUN, paper_value, "-",
                       f"no FedL2P beta recorded under {' and '.join(missing)} shift")
    lab, feat = _mean_beta(runs["label"]), _mean_beta(runs["feature"])
    lab_iv, feat_iv = _beta_interval(runs["label"]), _beta_interval(runs["feature"])
    verdicts = [read(lab_iv, BETA_NEAR_ZERO, above=False) if lab_iv else (HOLDS if lab <= BETA_NEAR_ZERO else FAILS),
                read(feat_iv, BETA_ABOVE_ZERO) if feat_iv else (HOLDS if feat >= BETA_ABOVE_ZERO else FAILS)]
    interval = "; ".join(f"{kind}-shift mean beta {iv.mean:.3f} [{iv.lo:.3f}, {iv.hi:.3f}] ({iv.clients} clients)"
                         for kind, iv in (("label", lab_iv), ("feature", feat_iv)) if iv)
    by_data = _beta_by_dataset(runs["feature"])
    split = "" if len(by_data) < 2 else ": " + ", ".join(f"{name} {b:.2f} in {len(rs)}"
                                                          for name, (b, rs) in by_data.items())
    ours = f"mean beta {lab:.2f} (label shift, {len(runs['label'])} runs), {feat:.2f} (feature shift, " \
           f"{len(runs['feature'])} runs{split})" + \
           (f"; counted once, as the same FedL2P run: {', '.join(repeats)}" if repeats else "")
    problems = ([f"label-shift beta {lab:.2f} > {BETA_NEAR_ZERO}"] if lab > BETA_NEAR_ZERO else []) + \
               ([f"feature-shift beta {feat:.2f} < {BETA_ABOVE_ZERO}"] if feat < BETA_ABOVE_ZERO else [])
    if feat < BETA_ABOVE_ZERO:
        high = {name: b for name, (b, _) in by_data.items() if b >= BETA_ABOVE_ZERO}
        low = {name: rs for name, (b, rs) in by_data.items() if b < BETA_ABOVE_ZERO}
        low_runs = [r for rs in low.values() for r in rs]
        kind, low_beta = "feature", feat
        if high:  # the low mean comes from some datasets only: the explanations below are about those
            low_beta = _mean_beta(low_runs)
            problems.append(f"beta is at least {BETA_ABOVE_ZERO} on " +
                            ", ".join(f"{name} ({b:.2f})" for name, b in high.items()) +
                            f" and {low_beta:.2f} on {' and '.join(low)}")
            kind = f"{' and '.join(low)} feature"
        problems += _bn_premise(low_runs, kind, prefers_local=True)
        problems += _kept_round(low_runs, kind, low_beta, toward_zero=False)
    if lab > BETA_NEAR_ZERO:
        problems += _bn_premise(runs["label"], "label", prefers_local=False)
        problems += _kept_round(runs["label"], "label", lab, toward_zero=True)
    reason = "; ".join(problems) or f"label <= {BETA_NEAR_ZERO} and feature >= {BETA_ABOVE_ZERO}"
    verdict = combine(verdicts)
    if INCONCLUSIVE in verdicts:
        reason = f"an interval straddles its threshold ({interval}); " + reason
    if verdict != HOLDS:
        reason = _and(reason, finding('fedl2p_beta_by_shift', results))
    return _result(fedl2p_beta_by_shift, verdict, paper_value, ours, reason, interval)


FT_BETA = {"FT (BN G)": 0.0, "FT (BN C)": 1.0}  # the beta of Eq. 2 each fine-tuning baseline fixes
KEPT_DRIFT = 0.2  # beta this much further from the best FT's in the kept round than in the last: "kept early"


def _kept_away(results: Results, failed) -> str:
    """Why FedL2P may trail the best FT baseline although training moved beta to that baseline's value:
    the lambda kept is the one of the round whose sampled clients had the lowest validation loss (sec. 4.1).
    For each failed row (seed 0's history) whose best FT fixes a beta (`FT_BETA`) and whose kept round
    is not the last, that round's beta is compared with the last round's; rows where the kept one is at
    least `KEPT_DRIFT` further from the FT's beta are named."""
    away = []
    for name, _, rival, _ in failed:
        target, seeds = FT_BETA.get(rival), _beta_rounds(results[name])
        if target is None or not seeds:
            continue
        kept, total, _, last, at_kept = seeds[0]
        if kept < total and at_kept is not None and abs(at_kept - target) - abs(last - target) >= KEPT_DRIFT:
            away.append(f"{name} round {kept} of {total}, beta {at_kept:.2f} (last {last:.2f}; {rival} {target:g})")
    if not away:
        return ""
    return (f"; in {len(away)} of the {len(failed)} the lambda kept (the round with the lowest validation loss of "
            f"its sampled clients, sec. 4.1) is an early one whose beta is at least {KEPT_DRIFT:g} further from "
            f"the best FT's than the last round's: {', '.join(away)}")


@claim("fedl2p", "FedL2P at least matches the best fine-tuning baseline (FT BN C / G / I) in every scenario")
def fedl2p_matches_best_ft(results: Results) -> ClaimResult:
    """Tables 1-5: FedL2P's row is at or above the best FT baseline of each scenario (allowing
    `MATCH_TOL` percentage points). A failure names the rows whose kept round sits away from where
    training took beta (`_kept_away`)."""
    return _pairwise(fedl2p_matches_best_ft, results, "fedl2p_*", "FedL2P", lambda k: k.startswith("FT ("),
                     lambda a, b: a >= b - MATCH_TOL, f"FedL2P >= best FT - {MATCH_TOL:g}", _kept_away,
                     margin=-MATCH_TOL, finding=finding("fedl2p_matches_best_ft", results))


def _published_ari(res: dict) -> float | None:
    """Table 6's LRNet-input ARI that the experiment file gives for its scenario ([published_detail.ari])."""
    return ((res.get("config", {}).get("published_detail") or {}).get("ari") or {}).get("lrnet_input")


@claim("fedl2p", "Spectral clustering of LRNet's inputs recovers the clients' true domains (ARI)")
def fedl2p_lrnet_input_ari(results: Results) -> ClaimResult:
    """Sec. 4.4, Table 6: the ARI between the clustering of the LRNet inputs x and the domains is
    high (0.65-1.0); holds when ours is at least `ARI_RECOVERS` in every run that records it."""
    ours, paper, per_run = {}, [], []
    for name, res in _matching(results, "fedl2p_*"):
        seeds = (res.get("analysis", {}).get("FedL2P") or {}).get("seeds", [])
        aris = [s["ari"]["features"] for s in seeds if s.get("ari") and s["ari"].get("features") is not None]
        if aris:
            ours[name] = sum(aris) / len(aris)
            per_run += aris
        if (aris or res.get("config", {}).get("data", {}).get("scheme") == "domains") and "FedL2P" in labels(res):
            paper += [p] if (p := _published_ari(res)) is not None else []
    paper_value = (f"ARI {min(paper):.2f}-{max(paper):.2f} (Table 6)" if len(set(paper)) > 1
                   else f"ARI {paper[0]:.2f} (Table 6)" if paper else "ARI 0.65-1.00 (Table 6)")
    if not ours:
        return _result(fedl2p_lrnet_input_ari, NOT_RUN, paper_value, "-", "no run records the ARI (needs clients "
                       "with domains and FedL2P's hyperparameter report)")
    low = {n: v for n, v in ours.items() if v < ARI_RECOVERS}
    text = ", ".join(f"{n} {v:.2f}" for n, v in ours.items())
    reason = (f"ARI below {ARI_RECOVERS} in {', '.join(low)}" if low else f"ARI >= {ARI_RECOVERS} in every run")
    iv = mean_interval([[a] for a in per_run])
    interval = (f"mean ARI {iv.mean:.2f} [{iv.lo:.2f}, {iv.hi:.2f}] over {iv.seeds} runs (bootstrap over runs: "
                "one ARI per run)")
    verdict = read(iv, ARI_RECOVERS)
    if verdict != HOLDS:
        reason = _and(reason, finding('fedl2p_lrnet_input_ari', results))
    return _result(fedl2p_lrnet_input_ari, verdict, paper_value, f"ARI {text}", reason, interval)


def _beta_spread(res: dict, label: str = "FedL2P") -> float | None:
    """The widest range (max - min) over one seed's clients of the kept beta (`analysis`'s ``beta_per_client``,
    a client's mean over BN layers), over the seeds; None when no seed records it."""
    seeds = (res.get("analysis", {}).get(label) or {}).get("seeds", [])
    spans = [max(b) - min(b) for s in seeds if (b := s.get("beta_per_client"))]
    return max(spans) if spans else None


def _widest_seed_betas(res: dict, label: str = "FedL2P") -> list[float]:
    """The clients' kept beta of the seed of ``res`` whose clients' beta spans widest (`_beta_spread`'s)."""
    seeds = (res.get("analysis", {}).get(label) or {}).get("seeds", [])
    return max((s["beta_per_client"] for s in seeds if s.get("beta_per_client")), key=lambda b: max(b) - min(b))


def _xi_ari(runs: list[tuple[str, dict]]) -> list[float]:
    """The ARI of BNNet's input (xi) against the domains, one per seed of the given runs that records it."""
    return [s["ari"]["xi"] for _, res in runs for s in (res.get("analysis", {}).get("FedL2P") or {}).get("seeds", [])
            if (s.get("ari") or {}).get("xi") is not None]


@claim("fedl2p", "BNNet gives clients different beta: some use their own BN statistics more than others")
def fedl2p_beta_per_client(results: Results) -> ClaimResult:
    """Sec. 4.3, Fig. 2 / 4: the learned beta spreads across clients (box plots per layer), "some clients
    benefit more by using its own BN statistics" (CIFAR-10-C). Holds when in at least one feature-shift run
    the clients' kept beta spans at least `BETA_SPREAD`; when none does and BNNet's input separates the
    domains (ARI of xi), the reason says so: the spread is missing in BNNet's output, not in its input."""
    paper_value = "beta spread across clients (Fig. 2b, 4)"
    runs, _ = _distinct([(n, r) for n, r in _matching(results, "fedl2p_*") if _shift(r) == "feature"])
    spans = sorted(((span, n) for n, r in runs if (span := _beta_spread(r)) is not None), reverse=True)
    if not spans:
        return _result(fedl2p_beta_per_client, NOT_RUN, paper_value, "-",
                       "no feature-shift FedL2P run records its clients' beta")
    widest, name = spans[0]
    ours = f"widest span of the clients' beta {widest:.4f} ({name}), in {len(spans)} feature-shift runs"
    iv = range_interval(_widest_seed_betas(dict(runs)[name]))
    interval = f"span in {name} {iv.mean:.4f} [{iv.lo:.4f}, {iv.hi:.4f}] ({iv.clients} clients)"
    verdict = read(iv, BETA_SPREAD)
    if verdict == INCONCLUSIVE:
        return _result(fedl2p_beta_per_client, verdict, paper_value, ours,
                       f"the widest span's interval straddles {BETA_SPREAD}", interval)
    if widest >= BETA_SPREAD:
        wide = [n for v, n in spans if v >= BETA_SPREAD]
        return _result(fedl2p_beta_per_client, verdict, paper_value, ours,
                       f"span >= {BETA_SPREAD} in {len(wide)} of {len(spans)}: {', '.join(wide)}", interval)
    reason = f"every span < {BETA_SPREAD}: BNNet gives all clients of a run about the same beta"
    aris = _xi_ari(runs)
    if aris:
        reason += (f", although its input xi separates the domains (ARI of xi {min(aris):.2f}-{max(aris):.2f}): "
                   "the spread is missing in BNNet's output, not in its input")
    reason = _and(reason, finding('fedl2p_beta_per_client', results))
    return _result(fedl2p_beta_per_client, verdict, paper_value, ours, reason, interval)


def _ift_sign(results: Results, failed) -> str:
    return ("; the two rules can pull the learning rates opposite ways: with Eq. 9-10's L_T and an exact H^{-1} "
            "the IFT's learning-rate hypergradient is FOMAML+'s with the sign flipped (d theta* / d eta = +g, while "
            "fine-tuning moves the weights by -g); `pflkit check-hypergradient` measures each against the gradient "
            "through fine-tuning, client by client (docs/fidelity.md)")


@claim("fedl2p", "FedL2P's IFT meta-gradient at least matches FOMAML+ (same meta-nets, same start)")
def fedl2p_ift_matches_fomaml(results: Results) -> ClaimResult:
    """App. F, Table 8: IFT "outperforms FOMAML+ for alpha = 1000, 1.0, 0.5 and has comparable performance
    for alpha = 0.1"; checked as IFT >= FOMAML+ - `MATCH_TOL` in every row. A failure adds why the two can
    pull the learning rates apart (`_ift_sign`)."""
    return _pairwise(fedl2p_ift_matches_fomaml, results, "fedl2p_table8_*", "FedL2P (IFT)",
                     lambda k: k == "FedL2P (FOMAML+)", lambda a, b: a >= b - MATCH_TOL,
                     f"IFT >= FOMAML+ - {MATCH_TOL:g}", _ift_sign, margin=-MATCH_TOL,
                     finding=finding("fedl2p_ift_matches_fomaml", results))


# ----------------------------------------------------------------------------- pFedHN

@claim("pfedhn", "pFedHN-PC at least matches pFedHN")
def pfedhn_pc_matches(results: Results) -> ClaimResult:
    """Table 1: the personalized classifier variant is at or above pFedHN (within `MATCH_TOL`)."""
    return _pairwise(pfedhn_pc_matches, results, "pfedhn_*", "pFedHN-PC", lambda k: k == "pFedHN",
                     lambda a, b: a >= b - MATCH_TOL, f"pFedHN-PC >= pFedHN - {MATCH_TOL:g}", margin=-MATCH_TOL,
                     finding=finding("pfedhn_pc_matches", results))


@claim("pfedhn", "pFedHN beats every baseline at 50 clients")
def pfedhn_beats_baselines_n50(results: Results) -> ClaimResult:
    """Table 1, the 50-client columns (CIFAR-10, CIFAR-100): pFedHN above every baseline
    (pFedHN-PC, its own variant, is not a baseline)."""
    return _pairwise(pfedhn_beats_baselines_n50, results, "pfedhn_table1_*_n50", "pFedHN",
                     lambda k: not k.startswith("pFedHN"), lambda a, b: a > b, "pFedHN > best baseline",
                     strict=True, finding=finding("pfedhn_beats_baselines_n50", results))


# ----------------------------------------------------------------------------- FedSelect

FEDSELECT_ROW = re.compile(r"^FedSelect \(\d")  # the paper's FedSelect rows, one per personalization rate
ROW_SEP = ", "  # "experiment, method" names a compared row


def _mask_iou(res: dict, label: str) -> float | None:
    a = res.get("analysis", {}).get(label) or {}
    vals = [s["mask_iou"] for s in a.get("seeds", []) if s.get("mask_iou") is not None]
    return sum(vals) / len(vals) if vals else a.get("mask_iou")


@claim("fedselect", "FedSelect beats FedAvg and LG-FedAvg at s = 2, with masks that differ across clients")
def fedselect_beats_fedavg_lg(results: Results) -> ClaimResult:
    """Table 1, s = 2: every FedSelect row (p = 0.25, 0.5, 0.75) above FedAvg and LG-FedAvg; Fig. 1:
    the clients' masks differ (mean pairwise IoU < 1), checked when a run records it."""
    rivals = ("FedAvg", "LG-FedAvg")

    def rows(value):
        out = []
        for name, res in _matching(results, "fedselect_*_s2"):
            for label in (k for k in labels(res) if FEDSELECT_ROW.match(k)):
                out += [(f"{name}{ROW_SEP}{label}", value(res, label), r, value(res, r)) for r in rivals
                        if value(res, label) is not None and value(res, r) is not None]
        return out

    ours, paper = rows(acc), rows(published)
    fn = fedselect_beats_fedavg_lg
    paper_value = f"FedSelect above in {_count(paper, lambda a, b: a > b)} comparisons" if paper else "-"
    left_out = _left_out(results, "fedselect_*_s2", lambda k: k in rivals or bool(FEDSELECT_ROW.match(k)))
    if not ours:
        return _result(fn, NOT_RUN, paper_value, "-",
                       f"no s = 2 result with FedSelect and FedAvg / LG-FedAvg{left_out}")
    judged = [_judge(results[row.split(ROW_SEP, 1)[0]], row, row.split(ROW_SEP, 1)[1], rival, a, b, 0.0, True,
                     lambda x, y: x > y) for row, a, rival, b in ours]
    failed = [r for r in ours if not r[1] > r[3]]
    ious = {f"{n}:{k}": v for n, res in _matching(results, "fedselect_*_s2") for k in res.get("methods", {})
            if FEDSELECT_ROW.match(k) and (v := _mask_iou(res, k)) is not None}
    same = [k for k, v in ious.items() if v >= 1.0]
    reason = (f"{len(failed)} of {len(ours)} comparisons fail, worst "
              f"{_worst_failure(results, failed, lambda row: row.split(ROW_SEP, 1))}" if failed
              else f"all {len(ours)} comparisons")
    reason += f"; masks identical across clients in {', '.join(same)}" if same else \
        "; masks differ (IoU < 1)" if ious else "; mask IoU not recorded"
    reason += left_out
    ours_text = f"above in {_count(ours, lambda a, b: a > b)}; {_worst(ours)}"
    if ious:
        ours_text += f"; mask IoU {min(ious.values()):.2f}-{max(ious.values()):.2f}"
    interval, limited = _rows_text(judged)
    verdict = combine([r.verdict for r in judged] + ([FAILS] if same else []))
    if verdict != HOLDS:
        reason = _and(reason, finding('fedselect_beats_fedavg_lg', results))
    return _result(fn, verdict, paper_value, ours_text, reason + limited, interval, judged)


# ----------------------------------------------------------------------------- pFedVEM

@claim("pfedvem", "pFedVEM is the best method under label concept drift")
def pfedvem_best_under_drift(results: Results) -> ClaimResult:
    """Table 1: pFedVEM's row is the highest of each column (its own variants are not rivals)."""
    return _pairwise(pfedvem_best_under_drift, results, "pfedvem_*", "pFedVEM",
                     lambda k: not k.startswith("pFedVEM"), lambda a, b: a >= b, "pFedVEM best",
                     finding=finding("pfedvem_best_under_drift", results))


CLAIMS = (fedl2p_beta_by_shift, fedl2p_beta_per_client, fedl2p_matches_best_ft, fedl2p_lrnet_input_ari,
          fedl2p_ift_matches_fomaml, pfedhn_pc_matches, pfedhn_beats_baselines_n50, fedselect_beats_fedavg_lg,
          pfedvem_best_under_drift)


def check_all(results: Results) -> list[ClaimResult]:
    """Every claim of `CLAIMS` over one preset's compact results."""
    return [fn(results) for fn in CLAIMS]


def claims_of(results: Results, paper: str) -> list[ClaimResult]:
    """The claims of ``paper`` (``"fedl2p"``, ``"pfedhn"``, ``"fedselect"``, ``"pfedvem"``) checked on ``results``
    (``{experiment: compact result or results.json with its analysis}``): for each, ``verdict`` (holds / fails /
    inconclusive / budget-limited / not run), ``interval`` (the 95% interval it was read from, as text) and
    ``reason`` (why, with the finding for a claim that does not hold)."""
    return [c for c in check_all(results) if c.paper == paper]


def conclusion(claims: list[ClaimResult], preset: str) -> str:
    """What the checked claims say, in one paragraph written from their verdicts (never from a preset's
    expected outcome): how many hold, fail, are inconclusive or budget-limited and why, which were not run."""
    if not claims:
        return "No claim of this paper is checked by pflkit."
    by = {v: [c for c in claims if c.verdict == v] for v in (*VERDICTS, NOT_RUN)}
    parts = [f"At the `{preset}` preset, on the runs above, {len(by[HOLDS])} of the paper's {len(claims)} checked "
             f"claim(s) hold, {len(by[FAILS])} fail, {len(by[INCONCLUSIVE])} are inconclusive (the 95% interval "
             f"straddles the claim's margin), {len(by[BUDGET_LIMITED])} are budget-limited (failing while the "
             f"method was still learning) and {len(by[NOT_RUN])} could not be checked."]
    iv = lambda c: f"; 95% interval: {c.interval}" if c.interval else ""  # noqa: E731
    parts += [f"Holds: {c.text} (ours: {c.ours}{iv(c)}; paper: {c.paper_value})." for c in by[HOLDS]]
    for verdict in (FAILS, INCONCLUSIVE, BUDGET_LIMITED):
        parts += [f"{verdict.capitalize()}: {c.text}: {c.reason} (ours: {c.ours}{iv(c)}; paper: {c.paper_value})."
                  for c in by[verdict]]
    if by[NOT_RUN]:
        parts.append("Not checked here (they need runs this notebook did not make): "
                     + "; ".join(c.text for c in by[NOT_RUN]) + ".")
    if preset != "paper":
        parts.append("Sizes at this preset are smaller than the paper's, so a failing claim may hold at `paper`; "
                     "REPRODUCTION.md lists every preset's verdicts.")
    return " ".join(parts)
