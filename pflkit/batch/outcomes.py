"""What the batch did with each experiment (or notebook): an `Outcome` with its status, and the summary
``pflkit reproduce`` prints at the end."""
from __future__ import annotations

from dataclasses import dataclass

DONE, SKIPPED, NOT_RUN, FAILED = "done", "skipped", "not run", "failed"


@dataclass
class Outcome:
    """What the batch did with one experiment (or notebook): ``status`` is done / skipped / not run / failed."""

    name: str
    status: str
    reason: str = ""
    seconds: float = 0.0


def one_line(e: BaseException, limit: int = 200) -> str:
    """An error as one line an outcome's reason can hold: its type and the start of its message."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def _duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def format_summary(outcomes: list[Outcome], seconds: float | None = None) -> str:
    """Counts of done / skipped / not run / failed, then one line per experiment that was not skipped."""
    counts = {s: sum(o.status == s for o in outcomes) for s in (DONE, SKIPPED, NOT_RUN, FAILED)}
    head = ", ".join(f"{n} {s}" for s, n in counts.items())
    lines = [f"reproduce: {head}" + (f" in {_duration(seconds)}" if seconds is not None else "")]
    for o in outcomes:
        if o.status != SKIPPED:
            note = f": {o.reason}" if o.reason else ""
            lines.append(f"  {o.status:8s} {o.name} ({_duration(o.seconds)}){note}")
    return "\n".join(lines)
