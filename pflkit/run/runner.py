"""Run an experiment end to end and write its ``results.json``.

For each seed: build the federation (saved beside the results), optionally train
the pretraining stage (its global model is then tested on every client: the
tables' "Global" column, and the start of every method that fine-tunes it), then
train and test every method. Each finished stage is written to disk at once, so
``resume=True`` skips finished stages and continues the unfinished one from its
last round checkpoint: a resumed run ends with the numbers of an uninterrupted one.

A pretraining stage with its own data (``[pretrain.data]``) trains on its own
federation (``seed*/pretrain/``: federation, record, weights); ``new_head`` or
``algorithm = "none"`` also make it separate (`run_pretrain`). Its weights are then
carried to the experiment's model (`carry_weights`: body exactly, head kept or
re-initialized) and that model is tested on the clients: the "Global" record, whose
``pretraining`` entry keeps the stage's own summary. Shapes and classes are checked
before any training (`check_pretrain_fits`).

Who trains the stages is the `pflkit.run.trainer.Trainer` the run is given (this process's round loop by
default; Flower's nodes through `pflkit.flower.serve`); what it cannot do is refused before any work.
The pieces live beside this module: the environment (`environment`), the run folder (`folder`), the
data checks (`checks`), the pretraining stage (`pretraining`), each method's stage (`stages`) and the
aggregation into results.json (`results`).

What a number rests on is checked and recorded: the output folder is locked for the
run; a folder that already holds a run is continued only with ``resume=True`` and
only when the stored fingerprint (resolved config and data files) matches, replaced
only with ``overwrite=True``; results.json records the device, versions, kernel
backends, the client-update engine (requested, and used per stage) and the data files
(path, size, sha256), those of the pretraining data and of any weights file the model
started from; a method is ``ok`` only when every client has a finite test accuracy (else
``incomplete``, naming the clients).
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from pflkit import kernels
from pflkit.config import ConfigError
from pflkit.data.base import Dataset
from pflkit.data.datasets import load_dataset
from pflkit.fl.federate import federation_for
from pflkit.fl.federation import Federation
from pflkit.io import locked_folder, remove_orphans, write_json
from pflkit.run.checks import (check_client_splits, check_data_setting, check_federation_fits, check_given_data,
                               federation_record, user_data_record)
from pflkit.run.environment import device_info, engine_info, make_env
from pflkit.run.experiment_config import ExperimentConfig
from pflkit.run.folder import data_files, fingerprint, fingerprint_hash, keeping_states, prepare_folder
from pflkit.run.pretraining import (check_imagenet_weights, check_pretrain_fits, client_data, load_pretrain_data,
                                    pretrain_provenance, run_pretrain)
from pflkit.run.results import run_results
from pflkit.run.stages import forget, retry, run_method
from pflkit.run.trainer import Trainer


def run_seed(cfg: ExperimentConfig, dataset, seed: int, out: Path, resume: bool, progress: bool,
             trainer: Trainer, pre: Dataset | None = None, federation: Federation | None = None):
    """All stages of one seed, trained by ``trainer``; returns ({label: stage record}, {"seen": ids, "unseen": ids}).

    ``pre``: the pretraining stage's own dataset (`load_pretrain_data`), when it has one.
    ``trainer.engine``: how the round loop runs client updates (`pflkit.fl.engines`; not the numbers).
    ``federation``: the caller's own clients (`Federation.from_indices`), the same for every seed.
    """
    seed_dir = out / f"seed{seed}"
    seed_dir.mkdir(parents=True, exist_ok=True)
    fed = federation.rebind(dataset) if federation is not None else federation_for(cfg.data, dataset, seed)
    check_client_splits(fed, cfg)
    fed.save(seed_dir / "federation.npz")
    env = make_env(cfg, fed, seed, trainer.engine)
    records: dict[str, dict] = {}
    pretrained = None
    stages = ([cfg.pretrain] if cfg.pretrain is not None else []) + list(cfg.methods)
    for k, stage in enumerate(stages):
        if resume and retry(seed_dir, stage):
            forget(seed_dir, stages[k:])
            resume = False
        if stage is cfg.pretrain:
            records[stage.label], pretrained = run_pretrain(cfg, fed, env, pre, seed_dir, resume, progress,
                                                            trainer.train)
        else:
            records[stage.label] = run_method(cfg, stage, fed, env, pretrained, seed_dir, resume, progress,
                                              trainer.train)
    return records, {"seen": fed.seen_ids, "unseen": fed.unseen_ids}


def run_experiment(cfg: ExperimentConfig, out: str | Path, *, data_root=None, download: bool = False,
                   resume: bool = False, overwrite: bool = False, progress: bool = True, trainer: Trainer | None = None,
                   engine: str = "auto", keep_states: bool = False, dataset: Dataset | None = None,
                   federation: Federation | None = None) -> dict:
    """Run every seed of ``cfg`` into ``out`` and write ``out/results.json`` (atomically).

    ``trainer`` trains each stage (`Trainer`; default: pflkit's loop in this process with round engine
    ``engine``: ``"auto"``, ``"sequential"``, ``"threads"`` or ``"vectorized"``, `pflkit.fl.engines`; the
    Flower server passes its own, `pflkit.flower.serve.flower_trainer`); what the experiment needs and it
    cannot do is a one-line `ConfigError` before any work. The engine does not change the numbers
    beyond float rounding, so it is not part of the fingerprint that ``resume`` checks; results.json's
    ``environment`` records the requested engine and the one each stage used. ``download`` lets a
    missing dataset be downloaded into the cache. ``keep_states`` keeps each stage's final server and
    client states (`keeping_states`, `load_final_states`); it does not change the numbers either.
    Data of one's own: ``dataset`` (a `Dataset`, named by ``data.dataset``; or register it with
    `pflkit.data.register_dataset`) replaces loading ``data.dataset``, and ``federation``
    (`Federation.from_indices` over that dataset, ``data.num_clients`` clients) replaces the
    partition of ``[data]`` for every seed; results.json's ``data`` and ``federation`` say so.
    ``out`` is locked while the run lasts; a folder holding an earlier run needs ``resume``
    (same settings, checked) or ``overwrite``. Returns the results dict (keys: config, engine,
    status, methods, rounds, timing, version, environment, data).
    Accuracies in ``methods`` are percentages (mean over clients of each client's test
    accuracy; ``acc_std`` is the standard deviation over seeds).
    """
    out = Path(out)
    if trainer is not None and engine != "auto":
        raise ConfigError(f"run_experiment: engine={engine!r} and a trainer; give the engine to the trainer "
                          "(Trainer(engine=...)) instead")
    trainer = trainer if trainer is not None else Trainer(engine=engine)
    if keep_states:
        trainer = dataclasses.replace(trainer, train=keeping_states(trainer.train))
    given = dataset is not None
    trainer.check(cfg, given or federation is not None)  # a one-line error before any work
    if given or federation is not None:
        check_given_data(cfg, dataset, federation)
    if not given:
        check_data_setting(cfg)
    with locked_folder(out), kernels.use_backend(cfg.kernels):
        remove_orphans(out)
        t0 = time.perf_counter()
        check_imagenet_weights(cfg)  # a missing ImageNet file fails here, before any data is read
        if not given:
            dataset = load_dataset(cfg.data.dataset, data_root, download=download, **cfg.data.options)
        check_federation_fits(federation, dataset)
        pre = load_pretrain_data(cfg, data_root, download, load=load_dataset)
        t_data = time.perf_counter() - t0
        check_pretrain_fits(cfg, dataset, pre)
        fp = fingerprint(cfg, dataset, pre, given=given, federation=federation)
        prepare_folder(out, fp, resume=resume, overwrite=overwrite)
        environment = device_info(cfg)
        seeds = [cfg.seed + k for k in range(cfg.seeds)]
        used = client_data(cfg, dataset, pre)
        runs = {s: run_seed(cfg, used, s, out, resume, progress, trainer, pre, federation) for s in seeds}
        results = run_results(cfg, runs, seeds, trainer.transport)
        environment.update(engine_info(trainer, runs))
        stage_seconds = sum(v for st in results["timing"]["stages"].values() for v in st.values())
        results["timing"].update({"total_seconds": t_data + stage_seconds, "data_seconds": t_data,
                                  "wall_seconds": time.perf_counter() - t0})
        results.update({"environment": environment,
                        "data": {"name": dataset.meta.name, "source": dataset.meta.source,
                                 "files": data_files(dataset), "fingerprint": fingerprint_hash(fp),
                                 **user_data_record(dataset, fp, given)}})
        if federation is not None:
            results["federation"] = federation_record(federation)
        results.update(pretrain_provenance(cfg, pre))
        write_json(out / "results.json", results)
    return results
