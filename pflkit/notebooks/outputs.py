"""Notebooks committed with their outputs: execute each in results mode and write it back, byte-stable.

`execute_results_mode` runs a notebook with papermill in a temporary folder, its ``source`` set to
``results`` (every table, figure and verdict drawn from the committed compact results, no training).
`with_outputs` puts the executed outputs into the committed notebook's own cells: its sources and metadata
stay as written, papermill's injected cell, timestamps and durations are dropped, so the file changes only
when an output does. `problems` lists what a committed output must never hold: an error, a warning or other
stderr text, a memory address, an absolute path. `compare` is what the test checks: text outputs equal,
images present with the same pixel size (PNG bytes differ between matplotlib builds).
"""
from __future__ import annotations

import copy
import json
import logging
import re
import struct
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

TEXT_KINDS = ("text/plain", "text/html", "text/markdown", "text/latex")
IMAGE_KINDS = ("image/png",)
_ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]{6,}")
_ABSOLUTE = re.compile(r"(?<![\w.:/])(?:/(?:tmp|home|root|work|Users|var|private|content|opt)/|[A-Z]:\\\\)")


def execute_results_mode(nb: Path, figures_dir: Path | None = None, timeout: int = 600) -> dict:
    """``nb`` executed with ``source="results"`` in a temporary folder; the executed notebook as a dict.
    With ``figures_dir`` the notebook saves its figures there (the repository's ``figures/<folder>``)."""
    import os

    inline = "module://matplotlib_inline.backend_inline"  # the kernel's own; a caller's Agg would hide figures
    before = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = inline
    try:
        return _execute(nb, figures_dir, timeout)
    finally:
        if before is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = before


def _execute(nb: Path, figures_dir: Path | None, timeout: int) -> dict:
    from pflkit.notebooks.execute import run_notebooks

    with tempfile.TemporaryDirectory(prefix="pflkit-nb-") as tmp:
        params = {"source": "results"}
        if figures_dir is not None:
            params["figures_dir"] = str(Path(figures_dir).resolve())
        rel = nb.resolve().relative_to(nb.resolve().parents[1])
        done = run_notebooks("cpu", rel.parent.as_posix(), Path(tmp), params, only_names=[nb.name],
                             root=nb.resolve().parents[1], timeout=timeout)
        return json.loads(done[0].read_text())


def with_outputs(source: dict, executed: dict) -> dict:
    """``source`` (the committed notebook) with the outputs and execution counts of ``executed``."""
    ran = [c for c in executed["cells"] if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    if len(ran) != len(source["cells"]):
        raise ValueError(f"executed notebook has {len(ran)} cells, its source {len(source['cells'])}")
    out = copy.deepcopy(source)
    count = 0
    for cell, done in zip(out["cells"], ran):
        if cell["cell_type"] != "code":
            continue
        outputs = [_clean_output(o) for o in done.get("outputs", [])]
        count += 1
        cell["execution_count"] = count
        cell["outputs"] = [o for o in outputs if o is not None]
        for o in cell["outputs"]:
            if o["output_type"] == "execute_result":
                o["execution_count"] = count
    return out


def _clean_output(o: dict) -> dict | None:
    o = {k: v for k, v in o.items() if k != "transient"}
    if o.get("output_type") == "display_data" and not o.get("data"):
        return None
    if "metadata" in o:
        o["metadata"] = {k: v for k, v in o["metadata"].items() if k in IMAGE_KINDS}
    return o


def dumps(nb: dict) -> str:
    """The one serialization of a committed notebook (as `pflkit.notebooks.install.sync_install_cells` writes)."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def problems(nb: dict) -> list[str]:
    """What must not be in a committed output: errors, stderr (warnings), memory addresses, absolute paths."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        for o in cell.get("outputs", []):
            kind = o["output_type"]
            if kind == "error":
                found.append(f"cell {i}: error {o.get('ename')}: {o.get('evalue')}")
            if kind == "stream" and o.get("name") == "stderr":
                found.append(f"cell {i}: stderr: {_text(o.get('text'))[:200]!r}")
            texts = [_text(o.get("text", ""))] + [_text(v) for k, v in o.get("data", {}).items() if k in TEXT_KINDS]
            for t in texts:
                if _ADDRESS.search(t):
                    found.append(f"cell {i}: a memory address: {_ADDRESS.search(t)[0]}")
                if _ABSOLUTE.search(t):
                    found.append(f"cell {i}: an absolute path near {t[max(0, _ABSOLUTE.search(t).start() - 30):][:80]!r}")
    return found


def png_size(data: str) -> tuple[int, int]:
    """(width, height) of a base64 PNG."""
    import base64

    raw = base64.b64decode(data)
    return struct.unpack(">II", raw[16:24])


def _signature(cell: dict) -> list:
    sig = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            sig.append(("stream", o.get("name"), _text(o.get("text"))))
        elif o["output_type"] in ("display_data", "execute_result"):
            data = o.get("data", {})
            sig.append((o["output_type"], {k: _text(v) for k, v in data.items() if k in TEXT_KINDS},
                        {k: png_size(_text(v)) for k, v in data.items() if k in IMAGE_KINDS}))
        else:
            sig.append((o["output_type"], o.get("ename"), o.get("evalue")))
    return sig


def compare(committed: dict, fresh: dict) -> list[str]:
    """Differences between two executions of one notebook: text outputs exactly, images by presence and size."""
    diffs = []
    for i, (a, b) in enumerate(zip(committed["cells"], fresh["cells"])):
        sa, sb = _signature(a), _signature(b)
        if sa != sb:
            diffs.append(f"cell {i}: committed {_short(sa)} != fresh {_short(sb)}")
    if len(committed["cells"]) != len(fresh["cells"]):
        diffs.append(f"{len(committed['cells'])} cells committed, {len(fresh['cells'])} now")
    return diffs


def _short(sig) -> str:
    return repr(sig)[:300]


def has_results_mode(nb: Path) -> bool:
    """Whether the notebook's parameters cell declares ``source`` (it can draw from the committed results)."""
    import papermill as pm

    return "source" in pm.inspect_notebook(str(nb))


def commit_notebooks(notebooks: list[Path], figures_root: Path | None = None) -> list[tuple[Path, float, bool]]:
    """Execute each notebook that has a results mode (`has_results_mode`) and write it back with its outputs
    when they changed; a notebook without one is skipped with a log line.

    Returns ``(notebook, seconds, changed)`` per notebook. Refuses (before writing anything of that
    notebook) outputs with `problems`. With ``figures_root``, figures go to ``figures_root/<folder>``.
    """
    done = []
    for nb in notebooks:
        if not has_results_mode(nb):
            log.warning("%s: no `source` parameter, so no results mode yet: not executed", nb.name)
            continue
        start = time.perf_counter()
        figures = figures_root / nb.parent.name if figures_root is not None else None
        source = json.loads(nb.read_text())
        new = with_outputs(source, execute_results_mode(nb, figures))
        bad = problems(new)
        if bad:
            raise ValueError(f"{nb}: outputs not fit to commit: " + "; ".join(bad[:5]))
        text = dumps(new)
        changed = text != nb.read_text()
        if changed:
            nb.write_text(text)
        done.append((nb, time.perf_counter() - start, changed))
        log.info("%s: %.1f s%s", nb.name, done[-1][1], ", changed" if changed else "")
    return done
