"""Finished stages one experiment of a batch takes from another's run instead of training them again.

Experiment files of one paper often repeat a stage exactly: FedL2P's Table 5 rows hold the FT (BN C),
FT (BN G) and FedL2P runs of Table 2 / 3 (the paper prints the same numbers), Table 8's IFT row is
Table 3's FedL2P. A stage's outcome depends only on the data (its configuration and the files read),
the model, the seed, its own settings and the stage it starts from (the pretrained model, or the
method named in ``start_from``); the runner seeds every draw from the run seed and fixed keys, never
from a stage's label or its place in the file. `stage_keys` digests exactly that, so two stages with
the same key give the same record, client for client (`tests/test_reproduce.py` checks it against a
fresh run).

`seed_from_donors` copies the finished stages of matching keys from other run folders of the batch's
work folder into a fresh one, with a ``run.json`` that the runner accepts only if the data it reads
now are the donor's (`pflkit.run.folder.prepare_folder` compares the fingerprint; on a mismatch the
batch starts the run over with nothing reused). A donor must have been made by the same code
version, or its stage must have the same behavioural fingerprint (`pflkit.batch.behaviour`). The compact result names every reused stage and its donor (``reused``).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from pflkit.algorithms import get_algorithm
from pflkit.io import read_json, slug, write_json
from pflkit.run.folder import FINAL_STATES, NOT_FINGERPRINTED, RUN_FILE, clear_run, fingerprint_hash

__all__ = ["stage_keys", "stage_upstreams", "stage_files", "seed_from_donors", "fingerprinted_config"]


def stage_upstreams(config: dict) -> dict[str, str | None]:
    """``{stage label: label of the stage it starts from, or None}`` for a resolved configuration's dict: a
    method's ``start_from``, else the pretraining stage when its algorithm needs a pretrained model."""
    pretrain = config.get("pretrain")
    out: dict[str, str | None] = {pretrain["label"]: None} if pretrain else {}
    for m in config["methods"]:
        if m.get("start_from"):
            out[m["label"]] = m["start_from"]
        elif pretrain and get_algorithm(m["algorithm"]).needs_pretrained:
            out[m["label"]] = pretrain["label"]
        else:
            out[m["label"]] = None
    return out


def stage_keys(fp: dict) -> dict[str, str]:
    """``{stage label: key}`` for a run fingerprint (`pflkit.run.folder.fingerprint`): the pretraining stage
    and every method, keyed by the data (settings and files), the model, the stage's own settings less
    its label, and the key of the stage it starts from."""
    config = fp["config"]
    common = {"data": config["data"], "model": config["model"], "files": fp.get("data"),
              "pretrain_data": fp.get("pretrain_data"), "pretrain_weights": fp.get("pretrain_weights"),
              "federation": fp.get("federation")}
    keys: dict[str, str] = {}
    pretrain, upstreams = config.get("pretrain"), stage_upstreams(config)
    if pretrain:
        own = {k: v for k, v in pretrain.items() if k != "label"}
        keys[pretrain["label"]] = fingerprint_hash({**common, "stage": own})
    for m in config["methods"]:
        upstream = keys.get(upstreams[m["label"]]) if upstreams[m["label"]] else None
        own = {k: v for k, v in m.items() if k not in ("label", "start_from")}
        keys[m["label"]] = fingerprint_hash({**common, "stage": own, "upstream": upstream})
    return keys


def stage_files(seed_dir: Path, label: str) -> list[Path]:
    """The files a finished stage left in one seed folder: its record, report, exported weights, kept
    final states and, for a pretraining stage with its own federation, the ``pretrain/`` folder."""
    name = slug(label)
    files = [seed_dir / f"{name}{ext}" for ext in (".json", ".report.json", ".weights.pt", FINAL_STATES)]
    return [p for p in files if p.exists()] + ([seed_dir / "pretrain"] if (seed_dir / "pretrain").is_dir()
                                              and (seed_dir / "pretrain" / f"{name}.json").exists() else [])


def _finished(seed_dir: Path, label: str, keep_states: bool) -> bool:
    name = slug(label)
    return ((seed_dir / f"{name}.json").exists() and not (seed_dir / f"{name}.ckpt").exists()
            and (not keep_states or (seed_dir / f"{name}{FINAL_STATES}").exists()))


def fingerprinted_config(cfg) -> dict:
    """The resolved configuration's dict less `pflkit.run.folder.NOT_FINGERPRINTED`, as JSON holds it (what a run
    fingerprint stores, and what `stage_keys` / `stage_upstreams` read)."""
    return json.loads(json.dumps({k: v for k, v in cfg.to_dict().items() if k not in NOT_FINGERPRINTED}, default=str))


def target_fingerprint(cfg, donor_fp: dict) -> dict:
    """The fingerprint ``cfg`` will have if it reads the donor's data: its own configuration with the
    donor's record of the files (the runner recomputes it and refuses the folder if they differ)."""
    return {"config": fingerprinted_config(cfg), **{k: v for k, v in donor_fp.items() if k != "config"}}


def _donors(work: Path, folder: Path, code, marker_name: str) -> list[tuple[str, dict, Path, dict | None]]:
    """(experiment, run fingerprint, folder, its stages' behavioural fingerprints) of every other run folder in
    ``work`` whose batch record (``marker_name``) says it was made by ``code`` (fingerprints None: every stage
    counts) or holds the fingerprints of its stages (`pflkit.batch.behaviour`: a stage counts when its own matches)."""
    out = []
    for other in sorted(p for p in work.iterdir() if p.is_dir() and p != folder) if work.is_dir() else []:
        try:
            marker, run = read_json(other / marker_name), read_json(other / RUN_FILE)
        except (OSError, ValueError):
            continue
        if "fingerprint" not in run:
            continue
        if marker.get("code") == code:
            out.append((other.name, run["fingerprint"], other, None))
        elif marker.get("stages"):
            out.append((other.name, run["fingerprint"], other, marker["stages"]))
    return out


def _matches(cfg, donor_fp: dict, donor: Path, keep_states: bool, donor_stages: dict | None = None,
             stages: dict | None = None) -> tuple[dict, dict[str, dict]]:
    """(``cfg``'s fingerprint with the donor's data, ``{label: {"label": donor's label, "seeds": [...]}}``);
    with ``donor_stages``, only the stages whose behavioural fingerprint is ``stages``' (`pflkit.batch.behaviour`)."""
    fp = target_fingerprint(cfg, donor_fp)
    by_key = {key: label for label, key in stage_keys(donor_fp).items()}
    seeds = [cfg.seed + k for k in range(cfg.seeds)]
    taken = {}
    for label, key in stage_keys(fp).items():
        source = by_key.get(key)
        if source and donor_stages is not None and (stages or {}).get(label) != donor_stages.get(source):
            continue  # made by other code whose micro-run of this stage computes otherwise
        have = [s for s in seeds if source and _finished(donor / f"seed{s}", source, keep_states)]
        if have:
            taken[label] = {"label": source, "seeds": have}
    return fp, taken


def seed_from_donors(cfg, folder: Path, *, code, marker: str, keep_states: bool = False,
                     stages: dict | None = None) -> dict[str, dict]:
    """Start the run folder ``folder`` over with the finished stages that other run folders of its
    parent (the batch's work folder) hold under the same key, seed by seed; returns
    ``{label: {"from": experiment, "seeds": [...]}}`` (empty, and ``folder`` untouched, when nothing
    matches).

    The donor that has the most of them comes first; a stage it lacks comes from another donor that read
    the same data files (the same fingerprint for ``cfg``), the one with the most seeds of that stage. So
    the stages of one long experiment can be trained side by side, in run folders of experiments that
    each hold some of them, and then put together.

    The donor's data record goes into ``folder``'s ``run.json`` together with ``cfg``'s settings, so the
    runner resumes the folder only when it reads the same data files. ``marker``: the file name of the
    batch's record of each folder's configuration and code (`pflkit.batch.work_folder.MARKER`). ``keep_states``:
    a stage is taken only with its final states (the notebooks of `pflkit.report.papers.KEEP_STATES` read them).
    ``stages``: ``cfg``'s behavioural stage fingerprints (`pflkit.batch.behaviour.stage_fingerprints`); a donor made
    by other code gives the stages whose fingerprint it recorded equal to these.
    """
    found = [(name, donor, *_matches(cfg, donor_fp, donor, keep_states, donor_stages, stages))
             for name, donor_fp, donor, donor_stages in _donors(folder.parent, folder, code, marker)]
    found = [f for f in found if f[3]]
    if not found:
        return {}
    found.sort(key=lambda f: -sum(len(t["seeds"]) for t in f[3].values()))  # stable: ties in folder order
    fp = found[0][2]
    plan: dict[str, tuple[str, Path, dict]] = {}
    for name, donor, target, taken in found:
        if target != fp:  # the donor read other data files than the first one
            continue
        for label, t in taken.items():
            if label not in plan or len(t["seeds"]) > len(plan[label][2]["seeds"]):
                plan[label] = (name, donor, t)
    clear_run(folder)  # whatever an earlier run of other settings left there
    for label, (_, donor, t) in plan.items():
        for s in t["seeds"]:
            seed_dir = folder / f"seed{s}"
            seed_dir.mkdir(parents=True, exist_ok=True)
            for path in stage_files(donor / f"seed{s}", t["label"]):
                if path.is_dir():
                    shutil.copytree(path, seed_dir / path.name, dirs_exist_ok=True)
                else:
                    shutil.copy2(path, seed_dir / path.name.replace(slug(t["label"]), slug(label), 1))
    write_json(folder / RUN_FILE, {"fingerprint": fp, "hash": fingerprint_hash(fp)})
    return {label: {"from": name, "seeds": t["seeds"]} for label, (name, _, t) in plan.items()}
