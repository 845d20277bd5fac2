"""Client failures on Flower: a one-line reason for results, the full text for a log.

Flower reports a ClientApp that raised as an error reply whose ``reason`` is whatever
the engine made of the exception: in a Ray simulation about 2 KB of actor traceback with
terminal colour codes, wrapped as ``<class '...RayTaskError(ClientAppException)'>:<'...'>``,
with the original exception's text after ``ClientAppException occurred. Message:``; from
`pflkit.flower.simulation.LocalGrid`, a Python traceback. Results keep `one_line` of it
(exception type and message, at most ``LIMIT`` characters); `FailureLog` writes the whole
text to the log (WARNING) and to ``flower-failures.log`` in the run's output folder.
"""
from __future__ import annotations

import logging
import re
import time
from pathlib import Path

log = logging.getLogger(__name__)

LIMIT = 200
LOG_FILE = "flower-failures.log"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_FLOWER_WRAP = re.compile(r"<class '([^']+)'>:<'(.*)'>", re.S)  # flwr's str(type(ex)) + ":<'" + str(ex) + "'>"
_FLOWER_MESSAGE = "occurred. Message:"  # flwr's ClientAppException text before the original message
_TYPED = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)(?:: ?(.*))?$")  # [module.]Type[: message]
_NOT_EXCEPTION = ("Traceback (most recent call last)", "The above exception", "During handling")
WRAPPERS = ("ClientFailure", "ClientAppException")  # carry another exception's "Type: message" as their text


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _exception_line(text: str) -> str:
    """A traceback's exception line: the first line not indented after its last frame (the message
    may go on over more lines; a chained exception's traceback comes before)."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    frames = [i for i, ln in enumerate(lines) if ln.lstrip().startswith('File "')]
    after = lines[frames[-1] + 1:] if frames else lines
    tops = [ln for ln in after if not ln[0].isspace() and not ln.startswith(_NOT_EXCEPTION)]
    if tops:
        return tops[0 if frames else -1].strip()
    return lines[-1].strip() if lines else ""


def one_line(reason: str, limit: int = LIMIT) -> str:
    """``"Type: message"`` from a failure reason of any size: ANSI codes stripped, one line, <= ``limit`` chars.

    Unwraps Flower's ``<class 'T'>:<'...'>`` format, Ray's traceback around
    ``ClientAppException`` and pflkit's own `ClientFailure` (whose text already starts
    with the original exception's type), so a client's ``RuntimeError("boom")`` reads
    ``"RuntimeError: boom"`` whichever backend ran it.
    """
    text, outer = strip_ansi(str(reason)).strip(), None
    m = _FLOWER_WRAP.fullmatch(text)
    if m:
        outer, text = m.group(1).rsplit(".", 1)[-1].split("(")[0], m.group(2).strip()
    if _FLOWER_MESSAGE in text:
        text = text.rsplit(_FLOWER_MESSAGE, 1)[1].strip()
        outer = None
    elif "Traceback (most recent call last)" in text:
        text = _exception_line(text)
    text = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = " ".join(text.split())
    while True:  # pflkit.flower.client_app.ClientFailure: RuntimeError: boom -> RuntimeError: boom
        t = _TYPED.match(line)
        if not t or t.group(2) is None:
            break
        if t.group(1) in WRAPPERS and t.group(2):
            line = t.group(2)
            continue
        line = f"{t.group(1)}: {t.group(2)}"
        break
    t = _TYPED.match(line)
    if outer and not (t and t.group(2) is not None):
        line = f"{outer}: {line}" if line else outer
    line = line or "unknown failure"
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."


class FailureLog:
    """Writes each client failure's full text to the log (WARNING) and, if ``folder`` is set, to a file."""

    def __init__(self, folder: str | Path | None = None):
        self.path = None if folder is None else Path(folder) / LOG_FILE

    def record(self, where: str, cid: int, reason: str) -> str:
        """Log the failure of client ``cid`` (``where``: stage, seed, round / split); returns its one-line reason."""
        short = one_line(reason)
        full = strip_ansi(str(reason)).strip()
        if full == short:
            log.warning("%s: client %d failed: %s", where, cid, short)
        else:
            log.warning("%s: client %d failed: %s\n%s", where, cid, short, full)
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {where}: client {cid}: {short}\n{full}\n\n")
            except OSError as e:  # the run goes on; the log above has the text
                log.warning("cannot write %s: %s", self.path, e)
        return short
