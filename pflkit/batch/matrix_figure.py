"""The cross-paper matrix after a batch that includes it (``catalog/matrix/``): its table and heatmap
(`pflkit.report.matrix`), drawn again only when the results they read or the drawing code changed
(`MATRIX_DONE`)."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from pflkit.batch.outcomes import DONE, FAILED, SKIPPED, Outcome, one_line
from pflkit.io import read_json, write_json
from pflkit.notebooks.session import figures_root
from pflkit.report import matrix
from pflkit.report.reproduction import load_results

MATRIX_DONE = "_matrix_done.json"  # in the work folder: the inputs the matrix table and figure were drawn from


def matrix_outputs(selection: dict[str, Path], preset: str, results_dir, work: Path) -> list[Outcome]:
    """When the batch includes the cross-paper matrix (``catalog/matrix/``): its table and heatmap
    (`pflkit.report.matrix`), in the repository's ``figures/matrix/`` (at ``smoke``, in the work folder)."""
    if not any(p.parent.name == matrix.PAPER for p in selection.values()):
        return []
    folder = work / matrix.PAPER if preset == "smoke" else figures_root() / matrix.PAPER
    label, record = f"{matrix.PAPER} table and figure", work / MATRIX_DONE
    outputs = [folder / f"matrix_{preset}.md", folder / f"matrix_{preset}.png"]
    t0 = time.perf_counter()
    try:
        results, excluded = load_results(results_dir).get(preset, {}), matrix.declared_exclusions()
        fingerprints = [(n, (results.get(n) or {}).get("fingerprint")) for n in sorted(excluded)]
        key = hashlib.sha256(json.dumps([preset, fingerprints, sorted(excluded.items()),
                                         Path(matrix.__file__).read_text()], default=str).encode())
        key = key.hexdigest()[:16]
        if all(o.exists() for o in outputs) and record.exists() and read_json(record).get("key") == key:
            return [Outcome(label, SKIPPED, "up to date")]
        md, png = matrix.write_matrix(results, preset, folder, excluded)
        write_json(record, {"key": key})
    except Exception as e:  # noqa: BLE001 - the runs are kept; only the rendering failed
        return [Outcome(label, FAILED, one_line(e), time.perf_counter() - t0)]
    return [Outcome(label, DONE, f"{md}, {png}", time.perf_counter() - t0)]
