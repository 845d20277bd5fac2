"""Command line: ``pflkit list | run | demo | notebooks | reproduce | data pack``."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from pflkit.config import ENGINES, KERNEL_BACKENDS, ConfigError
from pflkit.run.experiments import PRESETS, experiments_dir


def _cmd_list(args) -> int:
    from pflkit.run.experiments import list_experiments, resolve

    rows = []
    for name, path in list_experiments().items():
        try:
            cfg = resolve(path, "cpu")
            rows.append((cfg.paper or path.parent.name, cfg.table, name, cfg.title))
        except ConfigError as e:
            rows.append((path.parent.name, "?", name, f"(invalid: {e})"))
    for paper, table, name, title in sorted(rows):
        print(f"{paper:10s} {table:14s} {name:32s} {title}")
    return 0


def _run(name: str, args) -> int:
    from pflkit.run.experiments import resolve
    from pflkit.report.divergence import mark_divergence
    from pflkit.report.figures import plot_methods, save_figure
    from pflkit.report.tables import format_table
    from pflkit.run.runner import run_experiment

    overrides = list(args.set or [])
    if args.seed is not None:
        overrides.append(f"seed={args.seed}")
    if args.seeds is not None:
        overrides.append(f"seeds={args.seeds}")
    for flag in ("kernels", "device"):
        if getattr(args, flag, None):
            overrides.append(f"{flag}={getattr(args, flag)}")
    try:
        cfg = resolve(name, args.preset, overrides)
    except ConfigError as e:  # name the flag the user typed, not the config key behind it
        msg = str(e)
        for flag in ("kernels", "device"):
            if getattr(args, flag, None) and msg.startswith(f"{flag}="):
                msg = f"--{msg}"
        raise ConfigError(msg) from None
    engine = getattr(args, "engine", None) or "auto"
    if engine not in (*ENGINES, "flower"):
        raise ConfigError(f"--engine={engine!r}: expected one of {', '.join(ENGINES)}, flower")
    out = Path(args.out or default_out(cfg, overrides))
    if not (args.resume or args.overwrite):
        finished = finished_run(cfg, out, args.data_root)
        if finished is not None:  # the same run again: show it rather than refuse (as `reproduce` skips it)
            print(format_table(mark_divergence(finished)))
            print(f"results: {out / 'results.json'} (a finished run of these settings, shown again; "
                  f"--overwrite runs it again)")
            return 0 if finished["status"] == "ok" else 3
    if not args.quiet:
        print(_committed_time(cfg, overrides))
    if engine == "flower":  # a local Flower simulation (Ray), one virtual SuperNode per client
        try:
            from pflkit.flower.simulation import run_flower
        except ImportError as e:
            raise ConfigError(f"--engine flower needs Flower: pip install -e \".[flower]\" ({e})") from e
        results = run_flower(cfg, out, data_root=args.data_root, progress=not args.quiet, resume=args.resume)
    else:
        results = run_experiment(cfg, out, data_root=args.data_root, download=args.download, resume=args.resume,
                                 overwrite=args.overwrite, progress=not args.quiet, engine=engine,
                                 keep_states=getattr(args, "keep_states", False))
    results = mark_divergence(results)  # a finite blow-up is reported like a NaN (exit status 3)
    print(format_table(results))
    fig = save_figure(plot_methods(results).figure, out / "methods.png")
    print(f"results: {out / 'results.json'}\nfigure: {fig}")
    if results["status"] != "ok":
        print(f"pflkit: run {results['status']}: " + "; ".join(
            f"{label}: {m.get('error') or m['status']}" for label, m in results["methods"].items()
            if m["status"] != "ok"), file=sys.stderr)
    return 0 if results["status"] == "ok" else 3


def finished_run(cfg, out: Path, data_root=None) -> dict | None:
    """The results of the finished run in ``out`` when it was made with ``cfg``'s settings and data
    (same fingerprint as `pflkit.run.runner.run_experiment` checks on ``--resume``), else None (then the
    runner refuses a folder that holds a run, naming ``--resume`` and ``--overwrite``)."""
    from pflkit.data.datasets import load_dataset
    from pflkit.io import read_json
    from pflkit.run.pretraining import load_pretrain_data
    from pflkit.run.folder import RUN_FILE, fingerprint, fingerprint_hash

    if not ((out / "results.json").is_file() and (out / RUN_FILE).is_file()):
        return None
    try:
        results, stored = read_json(out / "results.json"), read_json(out / RUN_FILE)["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):  # unreadable: let the runner's refusal speak
        return None
    if not isinstance(results, dict) or "methods" not in results or "status" not in results:
        return None
    dataset = load_dataset(cfg.data.dataset, data_root, **cfg.data.options)
    pre = load_pretrain_data(cfg, data_root, False, load=load_dataset)
    current = fingerprint(cfg, dataset, pre)
    return results if fingerprint_hash(stored) == fingerprint_hash(current) else None


def _committed_time(cfg, overrides: list[str]) -> str:
    """One line before training: what this experiment cost the committed batch at this preset, when the
    checkout holds its result (and it was made with the same settings), else that there is no such timing."""
    from pflkit.report.committed import MissingResultError, read_committed, training_time
    from pflkit.report.compact import config_digest

    try:
        res = read_committed(cfg.name, cfg.preset)
    except MissingResultError:
        return f"{cfg.name}: training at preset {cfg.preset} (no committed result here to estimate its time)"
    same = config_digest(cfg.to_dict()) == (res.get("fingerprint") or {}).get("config")
    return (f"{cfg.name}: training at preset {cfg.preset}; the committed batch took {training_time(res)}"
            + ("" if same else " with other settings") + (f" (--set {' '.join(overrides)})" if overrides else ""))


def default_out(cfg, overrides: list[str]) -> Path:
    """``runs/NAME-PRESET``, plus a short hash of the ``--set`` overrides when there are any,
    so a run with other settings never lands in (and is never refused by) another run's folder."""
    if not overrides:
        return Path("runs") / f"{cfg.name}-{cfg.preset}"
    import hashlib

    digest = hashlib.sha256("\n".join(sorted(overrides)).encode()).hexdigest()[:8]
    return Path("runs") / f"{cfg.name}-{cfg.preset}-{digest}"


def _cmd_notebooks(args) -> int:
    from pflkit.notebooks.execute import find_notebooks, run_notebooks
    from pflkit.notebooks.session import figures_root

    if args.commit:
        return _commit_notebooks(find_notebooks(args.only), figures_root() if args.figures else None)
    params = {"device": args.device, "source": args.source}
    if args.data_root:
        params["data_root"] = args.data_root
    if args.standin:
        params["standin"] = True
    figures = figures_root() if args.figures else None
    done = run_notebooks(args.preset, args.only, args.out, params, figures_dir=figures)
    for p in done:
        print(f"executed: {p}")
    return 0


def _commit_notebooks(notebooks, figures) -> int:
    from pflkit.notebooks.outputs import commit_notebooks

    for nb, seconds, changed in commit_notebooks(notebooks, figures):
        print(f"{'written' if changed else 'unchanged'}: {nb.relative_to(nb.parents[2])} ({seconds:.1f} s)")
    return 0


def _positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (the error names the value)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _cmd_reproduce(args) -> int:
    """The whole catalog in one resumable batch (`pflkit.batch.reproduce`), or with --report the report only."""
    if args.report:
        from pflkit.report.reproduction import write_report

        from pflkit.report.readme import sync_readme

        path = write_report(args.results, args.output, presets=[args.preset] if args.preset else None)
        print(f"wrote {path}")
        readme = args.readme
        if readme is None and args.results == "results" and Path("README.md").exists():
            readme = "README.md"  # the repository's README, when the report is made from its results/
        if readme:
            changed = sync_readme(readme, args.results)
            print(f"{readme}: {len(changed)} generated block(s) (results tables, claims) regenerated"
                  + "".join(f"\n  {c}" for c in changed))
        if readme == "README.md" and not args.no_notebooks:  # the repository's notebooks show its results too
            from pflkit.notebooks.execute import find_notebooks
            from pflkit.notebooks.session import figures_root

            return _commit_notebooks(find_notebooks(), figures_root())
        return 0
    import time

    from pflkit.batch.outcomes import FAILED, format_summary
    from pflkit.batch.reproduce import reproduce

    t0 = time.perf_counter()
    if args.stages:
        from pflkit.batch.restage import restage

        outcomes = restage(args.stages.split(","), args.preset or "cpu", paper=args.paper, only=args.only,
                           results_dir=args.results, work_dir=args.work, overrides=args.set or [],
                           data_root=args.data_root, download=args.download, force=args.force, jobs=args.jobs)
        print(format_summary(outcomes, time.perf_counter() - t0))
        return 3 if any(o.status == FAILED for o in outcomes) else 0
    outcomes = reproduce(args.preset or "cpu", paper=args.paper, only=args.only, results_dir=args.results,
                         work_dir=args.work, overrides=args.set or [], data_root=args.data_root,
                         download=args.download, device=args.device, notebooks=not args.no_notebooks,
                         force=args.force, code_check=not args.no_code_check, progress=not args.quiet,
                         jobs=args.jobs, reuse=not args.no_reuse)
    print(format_summary(outcomes, time.perf_counter() - t0))
    print(f"compact results: {args.results}/{args.preset or 'cpu'}/; the report: pflkit reproduce --report")
    return 3 if any(o.status == FAILED for o in outcomes) else 0


def _setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` with VALUE read as TOML (``psi=0.001``, ``lt_mode="lookahead"``; a bare word is a string)."""
    import tomllib

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return key.strip(), value


def _cmd_check_hypergradient(args) -> int:
    """A FedL2P meta step of a saved run, taken apart (`pflkit.batch.neumann_check`)."""
    import json

    from pflkit.batch.neumann_check import format_rows, run_step_check

    changes = dict(args.set or [])
    rows = run_step_check(args.name, args.run, preset=args.preset, clients=args.clients, seed=args.seed,
                          changes=changes, power_steps=args.power_steps, data_root=args.data_root,
                          checkpoint=args.checkpoint, kept=args.kept)
    print(format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
        print(f"wrote {args.json}")
    return 0


def _cmd_pack(args) -> int:
    from pflkit.data.pack import pack

    out = pack(args.name, args.data_root, args.out, download=args.download)
    print(f"wrote {out}")
    return 0


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="cpu", choices=PRESETS, help="sizes (default: cpu)")
    p.add_argument("--seed", type=int, help="first seed (default: the experiment's)")
    p.add_argument("--seeds", type=int, help="number of seeds (seed, seed+1, ...)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a setting (repeatable)")
    p.add_argument("--data-root", help="folder with datasets (else $PFLKIT_DATA)")
    p.add_argument("--out", help="output folder (default: runs/NAME-PRESET[-HASH of the --set values])")
    p.add_argument("--resume", action="store_true", help="continue a stopped run in --out (same settings)")
    p.add_argument("--overwrite", action="store_true", help="replace the run in --out instead of refusing")
    p.add_argument("--download", action="store_true", help="download a missing dataset into the cache")
    p.add_argument("--device", help="auto (default: CUDA when available), cpu, cuda, cuda:N or mps")
    p.add_argument("--kernels", choices=KERNEL_BACKENDS, help="custom-op backend")
    p.add_argument("--engine", default="auto", choices=[*ENGINES, "flower"],
                   help="how rounds run: auto (vectorized on CUDA where the algorithm allows it, threads on a "
                        "multi-core CPU, else sequential), sequential, threads (client updates in a CPU thread pool; "
                        "same numbers), vectorized (a round's clients trained together with torch.func.vmap; for "
                        "GPUs), flower (a Flower simulation); pflkit: the older name of auto")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--keep-states", action="store_true",
                   help="keep every stage's final server and client states (seedS/<stage>.final.pt, weights-only)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pflkit", description="Personalized federated learning toolkit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every round")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="experiments by paper and table").set_defaults(fn=_cmd_list)
    p = sub.add_parser("run", help="run an experiment, write DIR/results.json")
    p.add_argument("name", help="experiment name (see `pflkit list`) or path to a .toml")
    _run_options(p)
    p.set_defaults(fn=lambda a: _run(a.name, a))
    p = sub.add_parser("demo", help="the embedded default: digits, FedAvg then FT (BN C/G/I)")
    _run_options(p)
    p.set_defaults(fn=lambda a: _run("demo", a))
    p = sub.add_parser("notebooks", help="execute notebooks with papermill")
    p.add_argument("--preset", default="smoke", choices=PRESETS)
    p.add_argument("--only", help="a subfolder of notebooks/, e.g. tutorials or fedl2p")
    p.add_argument("--out", default="notebooks_out", help="where executed copies go")
    p.add_argument("--data-root", help="folder with datasets (else $PFLKIT_DATA)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N or mps")
    p.add_argument("--standin", action="store_true", help="replace every dataset but sklearn digits by digits (labelled STAND-IN)")
    p.add_argument("--figures", action="store_true",
                   help="write figures to the repository's figures/ (default: under each notebook's --out)")
    p.add_argument("--source", default="train", choices=["train", "results"],
                   help="train: run the experiments at --preset (default); results: draw from the committed results")
    p.add_argument("--commit", action="store_true",
                   help="execute every notebook on the committed results of preset cpu and write it back into "
                        "notebooks/ with its outputs (with --figures, figures/ too)")
    p.set_defaults(fn=_cmd_notebooks)
    p = sub.add_parser("reproduce", help="every experiment in one resumable batch -> results/PRESET/*.json; "
                       "--report writes REPRODUCTION.md")
    p.add_argument("--preset", choices=PRESETS,
                   help="sizes (default: cpu; with --report: every preset found)")
    folders = sorted(d.name for d in experiments_dir().iterdir() if d.is_dir())  # what --paper matches
    p.add_argument("--paper", help=f"only this catalog folder's experiments ({', '.join(folders)}; "
                   "matrix: every method on every heterogeneity, then its table and heatmap)")
    p.add_argument("--only", metavar="PATTERN", help="experiment names: comma-separated globs or substrings")
    p.add_argument("--results", default="results", help="compact results folder (default: results)")
    p.add_argument("--work", help="full run folders, kept for resuming (default: runs/reproduce/PRESET)")
    p.add_argument("--no-notebooks", action="store_true", help="do not execute the notebooks afterwards (with --report: do not rewrite the committed notebooks)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a setting of every experiment")
    p.add_argument("--force", action="store_true", help="rerun experiments whose result is up to date")
    p.add_argument("--jobs", type=_positive_int, default=1,
                   help="experiments (then notebooks) run at once, each process with cores / jobs threads (default 1)")
    p.add_argument("--no-code-check", action="store_true",
                   help="keep results made by other code (only a changed configuration reruns)")
    p.add_argument("--no-reuse", action="store_true",
                   help="train every stage, even one another run of the batch finished with the same settings")
    p.add_argument("--data-root", help="folder with datasets (else $PFLKIT_DATA)")
    p.add_argument("--download", action="store_true", help="download missing datasets into the cache")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N or mps")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--stages", metavar="LABELS",
                   help="rerun only these stages (comma-separated labels, e.g. 'FT (BN C)') of the committed results, "
                        "with the stages they start from; a result is changed only when those reproduce it exactly")
    p.add_argument("--report", action="store_true", help="only write the reproduction report from --results")
    p.add_argument("--output", default="REPRODUCTION.md", help="the report's path (default: REPRODUCTION.md)")
    p.add_argument("--readme", default=None,
                   help="with --report: regenerate this file's results tables from --results (default: README.md "
                        "when --results is the default results/)")
    p.set_defaults(fn=_cmd_reproduce)
    p = sub.add_parser("check-hypergradient",
                       help="FedL2P: does a saved run's meta step follow d L_V / d lambda? (Neumann series, "
                            "Hessian, the exact unrolled gradient)")
    p.add_argument("name", help="the catalog experiment (or .toml) the run was made from")
    p.add_argument("--run", required=True, help="the run's folder (pflkit run --out, or reproduce's --work/NAME)")
    p.add_argument("--preset", default="cpu", choices=PRESETS, help="the run's preset")
    p.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    p.add_argument("--clients", type=_positive_int, default=4, help="seen clients to check (default 4)")
    p.add_argument("--power-steps", type=_positive_int, default=50, help="Hessian-vector products of the power "
                   "iteration (default 50)")
    p.add_argument("--set", action="append", type=_setting, metavar="KEY=VALUE",
                   help="replace a FedL2P setting for the check, e.g. psi=0.001 (repeatable)")
    p.add_argument("--data-root", help="folder with datasets (else $PFLKIT_DATA)")
    p.add_argument("--checkpoint", help="a FedL2P stage checkpoint of the run (seedS/<stage>.ckpt): check the step "
                   "after its last round (default: the first step, at the initial lambda)")
    p.add_argument("--kept", action="store_true", help="with --checkpoint: at the lambda the keep-best rule holds")
    p.add_argument("--json", help="also write the rows to this file")
    p.set_defaults(fn=_cmd_check_hypergradient)
    p = sub.add_parser("data", help="dataset utilities")
    dsub = p.add_subparsers(dest="data_command", required=True)
    q = dsub.add_parser("pack", help="write a dataset as an offline .npz")
    q.add_argument("name")
    q.add_argument("--data-root", help="folder holding the downloaded dataset")
    q.add_argument("--out", help="output .npz (default: NAME.npz in the first data root, where load_dataset looks)")
    q.add_argument("--download", action="store_true", help="download through torchvision first, where it can")
    q.set_defaults(fn=_cmd_pack)
    return parser


def _user_error(e: Exception) -> bool:
    """Errors about the user's input or files, printed as one line (bugs keep their traceback)."""
    from pflkit.data.download import ChecksumError
    from pflkit.io import FolderLockedError

    return isinstance(e, (ConfigError, ValueError, TypeError, FileNotFoundError, FolderLockedError, ChecksumError))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return args.fn(args)
    except BrokenPipeError:  # `pflkit list | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        if args.verbose or not _user_error(e):  # the full traceback for debugging / for bugs
            raise
        print(f"pflkit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
