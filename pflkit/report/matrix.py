"""The cross-paper matrix: every personalization method on every offline heterogeneity, from compact results.

The experiment files of ``pflkit/catalog/matrix/`` (``[experiment] paper = "matrix"``) each run every
method of pflkit on one kind of heterogeneity (one *scenario*), with the same method labels. Their
compact results (``results/<preset>/matrix_*.json``) are turned here into

* `matrix_table`: a markdown table, one row per method, one column per scenario; a cell is the mean over
  clients of each client's test accuracy (%), averaged over seeds, ± the standard deviation over seeds;
  the best mean of each column in bold; ``n/a`` (with a footnote giving the experiment file's reason)
  where the method is not part of that scenario, its status (``diverged``, ...) where it ran but has no
  number, ``not run`` where the scenario has no result yet;
* `plot_matrix`: the same numbers as a heatmap (raw accuracies, one colour scale for the whole figure);
* `best_text`: one line per scenario naming the best method, and whether the runner-up is within the
  spread across seeds.

Everything is a pure function of the compact results; `write_matrix` writes the three outputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from pflkit.io import atomic_write

PAPER = "matrix"
# scenario (experiment name) -> the column's heading, in the table's order
SCENARIOS = {
    "matrix_dirichlet": "Dirichlet label shift",
    "matrix_pathological": "Pathological (2 classes)",
    "matrix_domains": "Digit domains (feature shift)",
    "matrix_speakers": "Speakers (FSDD)",
    "matrix_concept_drift": "Concept drift (Omniglot)",
}
NA, NOT_RUN = "n/a", "not run"


@dataclass(frozen=True)
class Cell:
    """One method on one scenario: a number (``mean``, ``std`` over seeds, ``seeds``) or a word.

    ``word`` is ``n/a`` (not part of the scenario), ``not run`` (no result for the scenario) or the
    method's status when it has no number (``diverged``, ``incomplete``, ...); empty when ``mean`` is set.
    """

    mean: float | None = None
    std: float | None = None
    seeds: int = 0
    word: str = ""

    def __post_init__(self):
        if (self.mean is None) == (not self.word):
            raise ValueError(f"Cell: exactly one of mean={self.mean!r} and word={self.word!r} must be given")

    def text(self, digits: int = 1) -> str:
        """``61.3 ± 1.2`` (std only with several seeds), or the word."""
        if self.mean is None:
            return self.word
        spread = f" ± {self.std:.{digits}f}" if self.seeds > 1 and self.std is not None else ""
        return f"{self.mean:.{digits}f}{spread}"


def matrix_results(results: dict[str, dict]) -> dict[str, dict]:
    """The matrix experiments among ``{name: compact result}`` (``paper == "matrix"``), in `SCENARIOS` order
    (other matrix files after them, by name)."""
    mine = {n: r for n, r in results.items() if r.get("paper") == PAPER}
    order = list(SCENARIOS)
    return dict(sorted(mine.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))


def method_labels(results: dict[str, dict]) -> list[str]:
    """Every method label of the matrix results, in first-seen order (the experiment files' order)."""
    labels: dict[str, None] = {}
    for res in results.values():
        labels.update(dict.fromkeys(res.get("methods", {})))
    return list(labels)


def cell(res: dict | None, label: str) -> Cell:
    """The `Cell` of method ``label`` in one compact result (None: the scenario has no result)."""
    if res is None or "methods" not in res:
        return Cell(word=NOT_RUN)
    m = res["methods"].get(label)
    if m is None:
        return Cell(word=NA)
    mean = m.get("acc_mean")
    if m.get("status") != "ok" or mean is None or not math.isfinite(mean):
        return Cell(word=str(m.get("status") or "missing"))
    seeds = sum(v is not None for v in m.get("per_seed") or [])
    return Cell(mean=float(mean), std=m.get("acc_std"), seeds=seeds)


def grid(results: dict[str, dict], scenarios: list[str] | None = None) -> tuple[list[str], list[str], list[list[Cell]]]:
    """(method labels, scenario names, cells[method][scenario]) of the matrix results.

    ``scenarios``: the columns (default: `SCENARIOS` then any other matrix experiment found); a scenario
    without a result is a column of ``not run``.
    """
    mine = matrix_results(results)
    names = list(scenarios) if scenarios is not None else list(dict.fromkeys([*SCENARIOS, *mine]))
    labels = method_labels(mine)
    return labels, names, [[cell(mine.get(s), label) for s in names] for label in labels]


def best_rows(cells: list[list[Cell]], column: int) -> list[int]:
    """The rows holding the highest mean of ``column`` (ties all count; empty when no number)."""
    values = [(r, row[column].mean) for r, row in enumerate(cells) if row[column].mean is not None]
    if not values:
        return []
    top = max(v for _, v in values)
    return [r for r, v in values if round(v, 1) == round(top, 1)]


def _heading(name: str) -> str:
    return SCENARIOS.get(name, name)


def matrix_table(results: dict[str, dict], excluded: dict[str, dict[str, str]] | None = None,
                 scenarios: list[str] | None = None) -> str:
    """The markdown table method x scenario, best mean per column in bold, then the ``n/a`` footnotes.

    ``excluded``: ``{scenario: {label: why}}``, each experiment file's documented exclusions
    (`declared_exclusions`); an ``n/a`` cell gets a footnote mark with that reason.
    """
    labels, names, cells = grid(results, scenarios)
    if not labels:
        return "No matrix results yet: run `pflkit reproduce --paper matrix` first.\n"
    notes: dict[str, int] = {}
    bold = [set(best_rows(cells, c)) for c in range(len(names))]
    lines = ["| method | " + " | ".join(_heading(n) for n in names) + " |", "|---|" + "---:|" * len(names)]
    for r, label in enumerate(labels):
        row = []
        for c, name in enumerate(names):
            text = cells[r][c].text()
            if r in bold[c]:
                text = f"**{text}**"
            why = (excluded or {}).get(name, {}).get(label)
            if cells[r][c].word == NA and why:
                text += f" [{notes.setdefault(f'`{name}`: {label} left out: {why}', len(notes) + 1)}]"
            row.append(text)
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    lines += [""] + [f"[{k}] {note}" for note, k in notes.items()]
    return "\n".join(lines).rstrip() + "\n"


def best_text(results: dict[str, dict], scenarios: list[str] | None = None) -> str:
    """One line per scenario: the best method, its accuracy, the runner-up and whether it is within the
    spread across seeds (|difference| <= the larger of the two standard deviations)."""
    labels, names, cells = grid(results, scenarios)
    lines = []
    for c, name in enumerate(names):
        ranked = sorted(((cells[r][c], labels[r]) for r in range(len(labels)) if cells[r][c].mean is not None),
                        key=lambda t: -t[0].mean)
        if not ranked:
            lines.append(f"- {_heading(name)}: no result yet.")
            continue
        (top, who), rest = ranked[0], ranked[1:]
        line = f"- {_heading(name)}: **{who}** ({top.text()})"
        if rest:
            second, other = rest[0]
            spread = max(top.std or 0.0, second.std or 0.0)
            close = top.mean - second.mean <= spread and top.seeds > 1
            line += (f", then {other} ({second.text()})"
                     + ("; within the spread across seeds, so not a clear winner" if close else ""))
        lines.append(line + ".")
    return "\n".join(lines) + "\n"


def declared_exclusions(root: Path | None = None) -> dict[str, dict[str, str]]:
    """``{experiment: {label: why}}`` from each matrix file's ``[experiment] excluded`` table."""
    from pflkit.run.experiments import list_experiments, tomllib

    out = {}
    for name, path in list_experiments(root).items():
        if path.parent.name != PAPER:
            continue
        with open(path, "rb") as f:
            meta = tomllib.load(f).get("experiment", {})
        out[name] = {str(k): str(v) for k, v in (meta.get("excluded") or {}).items()}
    return out


def plot_matrix(results: dict[str, dict], title: str = "", scenarios: list[str] | None = None):
    """Heatmap of the matrix: raw test accuracy (%) per cell, one colour scale for all cells, mean and
    ± std over seeds written in each cell, the cell's word (``n/a``, ``diverged``, ...) on grey otherwise."""
    import numpy as np

    from pflkit.report.figures import plt, sns

    labels, names, cells = grid(results, scenarios)
    values = np.array([[c.mean if c.mean is not None else np.nan for c in row] for row in cells], dtype=float)
    notes = [[c.text().replace(" ± ", "\n± ") if c.mean is not None else c.word for c in row] for row in cells]
    fig, ax = plt.subplots(figsize=(2.0 + 1.9 * len(names), 1.2 + 0.5 * max(len(labels), 1)))
    ax.set_facecolor("0.85")  # cells without a number
    finite = values[np.isfinite(values)]
    sns.heatmap(values, ax=ax, cmap="viridis", annot=np.array(notes, dtype=object), fmt="",
                annot_kws={"fontsize": 7}, linewidths=0.5, linecolor="white",
                vmin=float(finite.min()) if finite.size else 0.0, vmax=float(finite.max()) if finite.size else 100.0,
                cbar_kws={"label": "test accuracy (%)"}, xticklabels=[_heading(n) for n in names],
                yticklabels=labels)
    for c in range(len(names)):  # the best of each column framed
        for r in best_rows(cells, c):
            ax.add_patch(plt.Rectangle((c, r), 1, 1, fill=False, edgecolor="red", linewidth=2))
    for r, row in enumerate(cells):  # words on the grey cells (heatmap writes no text on NaN cells)
        for c, x in enumerate(row):
            if x.mean is None:
                ax.text(c + 0.5, r + 0.5, x.word, ha="center", va="center", fontsize=7, color="0.2")
    ax.set_xlabel("")
    ax.set_ylabel("")
    ax.tick_params(axis="x", rotation=25, labelsize=8)
    ax.tick_params(axis="y", labelsize=8)
    plt.setp(ax.get_xticklabels(), ha="right")
    ax.set_title(title or "personalized test accuracy (%): mean over clients, mean ± std over seeds; best framed",
                 fontsize=9)
    return fig


def matrix_markdown(results: dict[str, dict], preset: str, excluded=None, figure: str | None = None) -> str:
    """The table, the best method per scenario and the command, as one markdown document."""
    parts = [f"# Cross-paper matrix, preset `{preset}`", "",
             "Generated by `pflkit reproduce --paper matrix --preset " f"{preset}` (tables and figure from "
             f"`results/{preset}/matrix_*.json`); do not edit by hand.", "",
             "Each cell: the mean over clients of each client's test accuracy (%), averaged over seeds, ± the "
             "standard deviation over seeds; the best of each column in bold. How each scenario is built and "
             "how the methods' budgets are equalized: the header of `pflkit/catalog/matrix/<scenario>.toml`.", "",
             matrix_table(results, excluded), "## Best method per scenario", "", best_text(results)]
    if figure:
        parts += [f"![matrix]({figure})", ""]
    return "\n".join(parts)


def write_matrix(results: dict[str, dict], preset: str, folder, excluded=None) -> tuple[Path, Path]:
    """Write ``folder/matrix_<preset>.md`` and ``folder/matrix_<preset>.png``; returns their paths."""
    from pflkit.report.figures import plt, save_figure

    folder = Path(folder)
    fig = plot_matrix(results, f"cross-paper matrix, preset {preset}: personalized test accuracy (%), "
                      "mean over clients, mean ± std over seeds; best of each scenario framed")
    png = save_figure(fig, folder / f"matrix_{preset}.png")
    plt.close(fig)
    text = matrix_markdown(results, preset, excluded, figure=png.name)
    md = atomic_write(folder / f"matrix_{preset}.md", lambda f: f.write(text.encode()))
    return md, png
