"""How a paper's qualitative claim is checked: the result types, the pairwise rule and the reading of verdicts.

Each paper's claims are small pure functions in its own package (``pflkit.report.<paper>.claims``), built
from what is here; `pflkit.report.papers.check_all` runs every paper's.

A claim function takes ``{experiment name: compact result}`` (`pflkit.report.compact.compact_result`,
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

For one paper, `pflkit.report.papers.claims_of` returns its `ClaimResult`s: ``verdict``, ``interval`` (the text of the
interval the verdict was read from), ``reason`` (why), and ``rows`` (`RowVerdict`, per compared row).

The thresholds that turn "near 0", "at least matches" and "recovers" into a test are named constants:
`MATCH_TOL` here (several papers' "at least matches"), the others in the claims of the paper they belong to.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Callable, Mapping

from pflkit.report.verdicts import (BUDGET_LIMITED, FAILS, HOLDS, INCONCLUSIVE, NOT_RUN, VERDICTS, Interval, Rise,
                                    combine, paired_interval, read, still_learning)

MATCH_TOL = 1.0  # percentage points: "at least matches" allows this shortfall (seed noise at small presets)

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


def matching(results: Results, pattern: str) -> list[tuple[str, dict]]:
    return sorted(((n, r) for n, r in results.items() if fnmatch.fnmatchcase(n, pattern)), key=lambda x: x[0])


def labels(result: dict) -> list[str]:
    """The methods of a result and those its experiment publishes a number for (a result that was not
    run may hold only ``config.published``: the paper's side of a claim is then still known)."""
    return list(dict.fromkeys([*result.get("methods", {}), *result.get("config", {}).get("published", {})]))


def _gaps(results: Results, pattern: str, label: str, rivals: Callable[[str], bool], value=acc):
    """Per experiment matching ``pattern`` where ``label`` and a rival have a value:
    (name, label's value, best rival's label, its value)."""
    rows = []
    for name, res in matching(results, pattern):
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
    return [f"{name}: {k} ({m.get('status')})" for name, res in matching(results, pattern)
            for k, m in res.get("methods", {}).items() if compared(k) and m.get("status") not in (None, "ok")]


def not_compared(results: Results, pattern: str, compared: Callable[[str], bool]) -> str:
    """`_not_ok` as a clause for a claim's reason ("" when every compared method is ok)."""
    gone = _not_ok(results, pattern, compared)
    return f"; not compared (not ok): {', '.join(gone)}" if gone else ""


def tally(rows, ok: Callable[[float, float], bool]) -> str:
    return f"{sum(ok(a, b) for _, a, _, b in rows)}/{len(rows)}"


def worst(rows) -> str:
    name, a, best, b = min(rows, key=lambda r: r[1] - r[3])
    return f"worst {a - b:+.2f} pp ({name}: {a:.2f} vs {best} {b:.2f})"


def _versus_paper(res: dict, label: str, rival: str) -> str:
    """``label`` against ``rival`` in one result, each beside the paper's number: shows whether a failed
    comparison comes from our ``label`` falling short of the paper or from the rival exceeding it."""
    def side(k):
        ours, paper = acc(res, k), published(res, k)
        return f"{k} {ours:.2f}" + (f" (paper {paper:g})" if paper is not None else "")
    return f"{side(label)} vs {side(rival)}"


def worst_failure(results: Results, failed, split: Callable[[str], tuple[str, str]]) -> str:
    """``experiment: label vs rival`` (`_versus_paper`) for the failed row with the largest shortfall;
    ``split`` turns a row's name into (experiment, label). Whether a failing row's ``label`` was still
    learning is its verdict (budget-limited, `judge`)."""
    name, _, rival, _ = min(failed, key=lambda r: r[1] - r[3])
    experiment, label = split(name)
    res = results[experiment]
    return f"{experiment}: {_versus_paper(res, label, rival)}"


def with_clause(reason: str, clause: str) -> str:
    """``reason`` with ``clause`` after a semicolon (unchanged when ``clause`` is empty)."""
    return f"{reason}; {clause}" if clause else reason


def claim_result(fn, verdict: str, paper_value: str, ours: str, reason: str, interval: str = "",
                 rows: tuple = ()) -> ClaimResult:
    paper, text = fn.paper, fn.text
    return ClaimResult(fn.__name__, paper, text, verdict, paper_value, ours, reason, interval, tuple(rows))


def judge(res: dict, name: str, label: str, rival: str, ours: float, theirs: float, margin: float,
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


def rows_text(rows: list[RowVerdict]) -> tuple[str, str]:
    """(the claim's interval text: its row nearest to failing, then the counts; the budget-limited rows' clause)."""
    nearest = _decisive(rows)
    interval = f"{nearest.text()}; {_row_counts(rows)}"
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


def pairwise(fn, results: Results, pattern: str, label: str, rivals, ok, rule: str,
             explain: Callable[[Results, list], str] | None = None, *, margin: float = 0.0,
             strict: bool = False, finding: str = "") -> ClaimResult:
    """A claim "``label`` vs its best rival, per experiment": each row's verdict reads the paired interval of
    ``label - rival`` against ``margin`` (`judge`; ``strict``: the bound must clear it), ``ok`` is the same
    rule on the means (the counts shown); ``explain(results, rows short of ok)`` adds a clause to the reason of a
    claim that does not hold, and so does ``finding`` (what is known about why, `pflkit.report.findings`)."""
    ours, paper = _gaps(results, pattern, label, rivals), _gaps(results, pattern, label, rivals, published)
    paper_value = f"{rule} in {tally(paper, ok)} rows" if paper else "no published numbers"
    left_out = not_compared(results, pattern, lambda k: k == label or rivals(k))
    if not ours:
        return claim_result(fn, NOT_RUN, paper_value, "-",
                            f"no result of {pattern} with {label} and a rival{left_out}")
    rows = [judge(results[n], n, label, rival, a, b, margin, strict, ok) for n, a, rival, b in ours]
    verdict = combine([r.verdict for r in rows])
    short = [r for r in ours if not ok(r[1], r[3])]
    interval, limited = rows_text(rows)
    reason = (f"{len(short)} of {len(ours)} scenarios short of the rule on the means, worst "
              f"{worst_failure(results, short, lambda name: (name, label))}" if short
              else f"every one of {len(ours)} scenarios on the means") + limited
    if short and explain:
        reason += explain(results, short)
    if verdict != HOLDS:
        reason = with_clause(reason, finding)
    return claim_result(fn, verdict, paper_value, f"{rule} in {tally(ours, ok)}; {worst(ours)}",
                        reason + left_out, interval, rows)


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
