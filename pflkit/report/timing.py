"""What a run took and what it ran on, as REPRODUCTION.md and the README say it: a run's time (`run_time`,
`own_seconds`), a batch's (`batch_time`) and its hardware (`hardware`, `hardware_mix`), read from a compact
result's ``timing`` and ``invocations`` (`pflkit.batch.reproduce`).
"""
from __future__ import annotations

from collections import Counter


def _span(seconds: float, decimals: int) -> str:
    """``"20 s"`` under a minute (a run that short reads "0.3 min" otherwise), else minutes."""
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.{decimals}f} min"


def run_time(res: dict, decimals: int = 1) -> str:
    """How long a run took, in minutes (seconds under one): its wall time, or, when the run was resumed
    from stages an earlier invocation had finished (its stages took longer than the last invocation), the
    time of all its stages with the last invocation's beside it; with stages taken from another run
    (``reused``), its own time first. "" when the result records no timing."""
    timing = res.get("timing") or {}
    wall, stages = timing.get("wall_seconds"), timing.get("total_seconds")
    if not wall:
        return ""
    if stages and stages > wall + 60 and res.get("reused"):
        return (f"{_span(wall, decimals)} here; {_span(stages, decimals)} over its stages with those "
                "taken from another run")
    if stages and stages > wall + 60:
        return (f"{_span(stages, decimals)} over its stages (resumed; the last invocation "
                f"{_span(wall, decimals)})")
    return _span(wall, decimals)


def own_seconds(res: dict, batch: frozenset[str] | None = None) -> float:
    """The compute one run spent itself: all its stages' time when it was resumed, its wall time when it
    took stages from other runs (those count in their own), 0 when the result records no timing.

    ``batch``: the experiments whose results are counted beside it. Stages taken from a run outside it
    (a part run that trained some of this experiment's stages beside the others) count here: then all
    its stages' time."""
    timing = res.get("timing") or {}
    wall, stages = timing.get("wall_seconds") or 0.0, timing.get("total_seconds") or 0.0
    donors = {r["from"] for r in (res.get("reused") or {}).values()}
    counted_there = donors and (batch is None or donors <= batch)
    return wall if counted_there else max(wall, stages)


def batch_time(results) -> str:
    """One sentence: what the runs of ``results`` took in all (`own_seconds` summed, so a stage two
    experiments share counts once, a stage of a part run not in ``results`` in the run it went to) and the
    longest of them; "" when none records a time."""
    names = frozenset(r["experiment"] for r in results)
    timed = [t for t in sorted(((own_seconds(r, names), r["experiment"]) for r in results), reverse=True)
             if t[0] > 0]
    if not timed:
        return ""
    total = sum(s for s, _ in timed)
    return (f"Time here: the {len(timed)} runs took {total / 3600:.1f} h in all (the sum of each run's own time; "
            f"a stage taken from another run counts once); the longest, `{timed[0][1]}`, "
            f"{timed[0][0] / 3600:.1f} h.")


def machine(env: dict) -> str:
    """The GPU's name, else ``a CPU with AVX512`` (the vector instruction set torch's kernels used), else ""."""
    if env.get("gpu"):
        return str(env["gpu"])
    return f"a CPU with {env['cpu_capability']}" if env.get("cpu_capability") else ""


def hardware(res: dict) -> str:
    """What a run ran on: from its ``invocations`` (`pflkit.batch.reproduce`: every invocation that ran it), each
    kind once in the order first used, ``"a CPU with AVX2, then a CPU with AVX512"``, with a note when
    earlier invocations were not recorded; without them, from ``environment`` (the last invocation's);
    "" when the result records neither."""
    calls = res.get("invocations") or {}
    kinds = list(dict.fromkeys(k for k in map(machine, calls.get("runs", [])) if k))
    if not kinds:
        return machine(res.get("environment") or {})
    text = ", then ".join(kinds)
    return f"{text} (earlier invocations not recorded)" if calls.get("unrecorded") else text


def hardware_mix(results) -> str:
    """One sentence when the runs of ``results`` ran on more than one kind of hardware (`hardware`): how
    many on each, and why it matters; "" otherwise."""
    kinds = Counter(hardware(r) for r in results)
    known = sorted(((n, k) for k, n in kinds.items() if k), reverse=True)
    if len(known) < 2:
        return ""
    parts = [f"{n} on {k}" for n, k in known] + ([f"{kinds['']} not recorded"] if kinds[""] else [])
    return (f"Hardware: {', '.join(parts)}. Each changes the float rounding, which training amplifies, so a rerun "
            "on other hardware differs from a row by run-to-run noise.")
