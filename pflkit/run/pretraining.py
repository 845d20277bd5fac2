"""The pretraining stage: its own data and weights, its training, and how its model reaches the experiment's.

FedL2P personalizes a model pretrained elsewhere: for CIFAR-10-C the FedAvg model of
clean CIFAR-10 (alpha = 1000; sec. 4.3, App. D), for Office-Caltech-10 / DomainNet
torchvision's ImageNet ResNet-18 with a new head (sec. 4.4, App. D), so the clients'
feature shift is unseen during pretraining. Here the pieces of that, generic for any
experiment (`pflkit.run.experiment_config.PretrainStage`):

* `load_pretrain_data` / `source_split`: the ``[pretrain.data]`` dataset, optionally
  only its train (or test) split, so no client image is drawn for pretraining;
* `client_data`: the clients' images normalized with the pretraining data's statistics
  (the pretrained model's preprocessing);
* `check_pretrain_fits`: before any training, the two models' bodies agree in every
  tensor shape, the classes agree unless ``new_head``, a ``weights`` file fits;
* `check_imagenet_weights`: before any data is read, torchvision's ImageNet file of
  ``model.options.pretrained`` is at hand (cached, or downloaded once now);
* `load_start_weights` / `read_weights`: a state-dict file read with ``weights_only``;
* `carry_weights`: body copied exactly, head kept or re-initialized (seeded);
* `pretrain_provenance`: what results.json records about all of it.

* `run_pretrain`: the stage of one seed, put together from these (a plain stage is just a method
  trained on the clients, `pflkit.run.stages.run_stage`).
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
import torch

from pflkit.algorithms import get_algorithm
from pflkit.config import ConfigError
from pflkit.data.base import Dataset, ImageFiles, offline
from pflkit.data.datasets import dataset_digest, is_user_dataset, load_dataset
from pflkit.data.provenance import dataset_record, weights_record
from pflkit.fl.algorithm import Env
from pflkit.fl.federate import federation_for
from pflkit.fl.federation import Federation
from pflkit.fl.loop import run_rounds
from pflkit.fl.train import get_state, set_state
from pflkit.io import load_torch, read_json, save_torch, slug, write_json
from pflkit.models import build_model, head_param_names
from pflkit.run.checks import check_client_splits
from pflkit.run.environment import initial_model, make_env
from pflkit.run.experiment_config import NO_TRAINING, ExperimentConfig, PretrainStage
from pflkit.run.stages import run_stage, stage_record


def source_split(dataset: Dataset, which: str) -> Dataset:
    """``dataset`` with only its ``which`` split (``train`` / ``test``) kept; ``all`` returns it unchanged.

    A federation pools a dataset's train and test splits; keeping one leaves nothing of the
    other to draw from (`pflkit.run.experiment_config.PretrainDataConfig.source_split`).
    """
    if which == "all":
        return dataset
    x, y, groups = getattr(dataset, f"x_{which}"), getattr(dataset, f"y_{which}"), getattr(dataset, f"groups_{which}")
    empty = ImageFiles([], x.size, x.channels) if isinstance(x, ImageFiles) else x[:0]
    return Dataset(dataset.meta, x, y, empty, y[:0], dict(groups), {k: np.asarray(g)[:0] for k, g in groups.items()})


def load_pretrain_data(cfg: ExperimentConfig, data_root=None, download: bool = False,
                       load=load_dataset) -> Dataset | None:
    """The pretraining stage's own dataset (``[pretrain.data]``, its ``source_split`` applied), or None.

    ``load``: the loader (`pflkit.data.datasets.load_dataset`; the runner passes the one it uses).
    """
    st = cfg.pretrain
    if st is None or st.data is None:
        return None
    full = load(st.data.dataset, data_root, download=download, **st.data.options)
    return source_split(full, st.data.source_split)


def client_data(cfg: ExperimentConfig, dataset: Dataset, pre: Dataset | None) -> Dataset:
    """The clients' dataset as the run uses it: normalized with the pretraining data's per-channel
    statistics when ``pretrain.normalize = "pretrain"`` (the pretrained model's preprocessing)."""
    if pre is None or cfg.pretrain.normalize != "pretrain":
        return dataset
    meta = dataclasses.replace(dataset.meta, mean=tuple(pre.meta.mean), std=tuple(pre.meta.std))
    return dataclasses.replace(dataset, meta=meta)


def _classes(meta, task: str) -> tuple[str, ...]:
    """The class names a federation of ``task`` predicts (superclasses for pFedVEM's concept drift)."""
    if task == "superclass" and meta.superclass is not None:
        return tuple(meta.superclass_names or (str(i) for i in range(max(meta.superclass) + 1)))
    return tuple(meta.class_names)


def _input_shape(dataset: Dataset) -> tuple[int, ...]:
    x = dataset.x_train if len(dataset.y_train) else dataset.x_test
    return tuple(x.shape[1:])


def _shapes(cfg: ExperimentConfig, input_shape, num_classes: int) -> tuple[dict[str, tuple], set[str]]:
    """({name: shape} of every tensor of the experiment's model for these inputs and classes, the head's
    names); built without ``pretrained`` weights, which change no shape."""
    options = {k: v for k, v in cfg.model.options.items() if k != "pretrained"}
    model = build_model(cfg.model.name, num_classes=num_classes, input_shape=tuple(input_shape), **options)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}, set(head_param_names(model))


def _first_misfit(source: dict, target: dict, skip: set) -> str | None:
    """The first tensor of ``target`` (outside ``skip``) that ``source`` lacks or has in another shape."""
    for k, shape in target.items():
        if k not in skip and source.get(k) != shape:
            return f"{k}: {list(source[k]) if k in source else 'missing'} vs {list(shape)}"
    extra = sorted(set(source) - set(target) - skip)
    return f"{extra[0]}: not in the model" if extra else None


def check_pretrain_fits(cfg: ExperimentConfig, dataset: Dataset, pre: Dataset | None) -> None:
    """Before any training: the pretraining model's body fits the experiment's model, its classes are the
    clients' unless ``new_head``, and a ``weights`` file fits the stage's model. One-line `ConfigError`s."""
    st = cfg.pretrain
    if st is None:
        return
    classes = _classes(dataset.meta, cfg.data.task)
    target, head = _shapes(cfg, _input_shape(dataset), len(classes))
    source = target
    if pre is not None:
        d = st.data
        pre_classes = _classes(pre.meta, d.task)
        source, _ = _shapes(cfg, _input_shape(pre), len(pre_classes))
        if st.normalize == "pretrain" and _input_shape(pre)[:1] != _input_shape(dataset)[:1]:
            raise ConfigError(f"pretrain.normalize='pretrain': {d.dataset!r} has {_input_shape(pre)[0]} channel(s), "
                              f"the clients' {cfg.data.dataset!r} {_input_shape(dataset)[0]}; use "
                              "pretrain.normalize='data' or data of one channel count")
        bad = _first_misfit(source, target, head)
        if bad:
            raise ConfigError(f"pretrain.data.dataset={d.dataset!r}: its inputs {_input_shape(pre)} do not fit the "
                              f"{cfg.model.name} built for the clients' {_input_shape(dataset)} ({bad}); give both "
                              "data inputs of one shape (e.g. data.options.size)")
        if not st.new_head and pre_classes != classes:
            shown = lambda c: f"{len(c)}: {', '.join(c[:3])}{', ...' if len(c) > 3 else ''}"  # noqa: E731
            raise ConfigError(f"pretrain.new_head=false: the classes of {d.dataset!r} ({shown(pre_classes)}) are not "
                              f"the clients' ({shown(classes)}); set pretrain.new_head = true")
    if st.weights:
        file = {k: tuple(v.shape) for k, v in read_weights(st.weights).items()}
        bad = _first_misfit(file, source, head)
        if bad:
            raise ConfigError(f"pretrain.weights={st.weights!r}: does not fit the stage's {cfg.model.name} ({bad})")


def check_imagenet_weights(cfg: ExperimentConfig) -> None:
    """With ``model.options.pretrained``: torchvision's ImageNet ResNet-18 file is cached (else downloaded now,
    once), so that a missing file is a one-line `ConfigError` before any data is read or model trained.
    ``$PFLKIT_OFFLINE`` forbids the download."""
    if not cfg.model.options.get("pretrained"):
        return
    from pflkit.models.resnet import PRETRAINED_WEIGHTS, load_imagenet_state_dict, pretrained_cache_path

    path = pretrained_cache_path()
    if os.path.isfile(path):
        return
    if offline():
        raise ConfigError(f"model.options.pretrained=true: torchvision's ResNet-18 ImageNet weights are not at {path} "
                          f"and $PFLKIT_OFFLINE forbids downloading them; place {PRETRAINED_WEIGHTS.url} there "
                          "(or set TORCH_HOME to a folder whose hub/checkpoints/ holds it)")
    try:
        load_imagenet_state_dict()
    except RuntimeError as e:
        raise ConfigError(f"model.options.pretrained=true: {' '.join(str(e).split())}") from None


def read_weights(path: str) -> dict[str, torch.Tensor]:
    """A state dict from ``path``, read with ``weights_only`` (`pflkit.io.load_torch`: no code in the file runs)."""
    try:
        state = load_torch(Path(path).expanduser())
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise ConfigError(f"pretrain.weights={path!r}: not a readable weights file ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"pretrain.weights={path!r}: expected a state dict (name -> tensor), as "
                          "torch.save(model.state_dict()) writes it")
    return state


def load_start_weights(model: torch.nn.Module, stage: PretrainStage) -> torch.nn.Module:
    """The pretraining stage's start model: ``model`` (the seeded initial one), then the ``weights`` file
    if any (body exactly; head tensors only where their shape fits, else left as initialized)."""
    if stage.weights:
        state, own = read_weights(stage.weights), model.state_dict()
        head = set(head_param_names(model))
        fits = {k: v for k, v in state.items() if k not in head or tuple(v.shape) == tuple(own[k].shape)}
        set_state(model, {**own, **fits})
    return model


def carry_weights(state: dict, model: torch.nn.Module, new_head: bool, env: Env) -> dict:
    """The pretrained ``state`` in the experiment's ``model``: every body tensor (BN statistics
    included) copied exactly; the head copied, or with ``new_head`` re-initialized by its own
    default init from a seed of its own (FedL2P App. D: the pretrained model with a new head).
    """
    head = set(head_param_names(model))
    if not new_head:
        return get_state(set_state(model, state))
    env.seed_torch("new-head")
    model.head.reset_parameters()
    fresh = {k: v for k, v in model.state_dict().items() if k in head}
    return get_state(set_state(model, {**{k: v for k, v in state.items() if k not in head}, **fresh}))


def pretrain_provenance(cfg: ExperimentConfig, pre: Dataset | None) -> dict:
    """results.json's record of what the pretrained model came from, beside ``data``.

    ``pretrain_data``: the pretraining stage's own dataset (`dataset_record`, with the split it
    drew from and the per-channel statistics the clients were normalized with); ``weights``: the
    files of weights the model started from (``pretrain.weights``; torchvision's ImageNet file of
    ``model.options.pretrained``).
    """
    out: dict = {}
    st = cfg.pretrain
    if pre is not None:
        out["pretrain_data"] = {**dataset_record(pre), "source_split": st.data.source_split,
                                "normalize": st.normalize, "mean": list(pre.meta.mean), "std": list(pre.meta.std)}
        if is_user_dataset(pre.meta.name):  # no files need stand behind it: its arrays identify it
            out["pretrain_data"].update(origin="register_dataset", arrays_sha256=dataset_digest(pre))
    files = []
    if st is not None and st.weights:
        files.append(weights_record(Path(st.weights).expanduser(), "pretrain.weights"))
    if cfg.model.options.get("pretrained"):
        from pflkit.models.resnet import PRETRAINED_WEIGHTS, pretrained_cache_path

        path = Path(pretrained_cache_path())
        what = f"torchvision {type(PRETRAINED_WEIGHTS).__name__}.{PRETRAINED_WEIGHTS.name} ({PRETRAINED_WEIGHTS.url})"
        files.append(weights_record(path, what) if path.is_file() else {"what": what, "path": str(path)})
    if files:
        out["weights"] = files
    return out


def _eval_config():
    """FedAvg with no round: tests the given global model on every client (`run_rounds` with rounds=0)."""
    return get_algorithm("fedavg").config(rounds=0, eval_every=0, keep_best=False)


def _pretraining_summary(rec: dict) -> dict:
    return {k: rec.get(k) for k in ("status", "error", "best_round", "seconds", "summary", "missing")}


def run_pretrain(cfg: ExperimentConfig, fed: Federation, env: Env, pre: Dataset | None, seed_dir: Path,
                 resume: bool, progress: bool, train) -> tuple[dict, dict | None]:
    """The pretraining stage of one seed: (its record, the weights every fine-tuning method starts from).

    A plain stage (no own data, no new head, a training algorithm) trains on the clients and its
    global model is the start, as always. Otherwise the stage trains on its own federation (or the
    clients') in ``seed_dir/pretrain`` (``algorithm = "none"``: no training, its start model is the
    result), `carry_weights` moves the weights to the experiment's model, and that model is tested
    on every client (the record; ``pretraining`` holds the stage's own summary, ``history`` its rounds).
    """
    st = cfg.pretrain
    name = slug(st.label)
    done, weights = seed_dir / f"{name}.json", seed_dir / f"{name}.weights.pt"
    if not st.separate:
        rec = run_stage(st, fed, env, load_start_weights(initial_model(env), st), seed_dir, resume, progress, train)
        return rec, load_torch(weights) if rec["status"] != "diverged" and weights.exists() else None
    if resume and done.exists():
        rec = read_json(done)
        return rec, load_torch(weights) if weights.exists() else None
    extra, earlier = {}, 0.0
    if st.algorithm == NO_TRAINING:
        source = get_state(load_start_weights(initial_model(env), st))
        extra["pretraining"] = {"weights": st.weights or f"{cfg.model.name} as built"}
    else:
        pre_dir = seed_dir / "pretrain"
        pre_dir.mkdir(exist_ok=True)
        pre_fed, pre_env = fed, env
        if st.data is not None:
            pre_fed = federation_for(st.data, pre, env.seed)
            check_client_splits(pre_fed, data=st.data, key="pretrain.data", splits=("train",))
            pre_fed.save(pre_dir / "federation.npz")
            pre_env = make_env(cfg, pre_fed, env.seed, env.engine)
        start = load_start_weights(initial_model(pre_env), st)
        rec = run_stage(st, pre_fed, pre_env, start, pre_dir, resume, progress, train)
        trained = pre_dir / f"{name}.weights.pt"
        extra = {"pretraining": _pretraining_summary(rec), "history": rec["history"]}
        earlier = rec.get("seconds", 0.0)
        if rec["status"] == "diverged" or not trained.exists():
            return {**rec, "status": "diverged", "error": f"pretraining: {rec.get('error') or 'no weights'}",
                    "per_client": [], "summary": {"acc": math.nan}, **extra}, None
        source = load_torch(trained)
    state = carry_weights(source, initial_model(env), st.new_head, env)
    result = run_rounds(get_algorithm("fedavg"), _eval_config(), fed, set_state(initial_model(env), state), env,
                        desc=f"{st.label} (seed {env.seed}): test" if progress else None)
    record = {**stage_record(result), **extra}
    record["seconds"] = earlier + result.seconds
    save_torch(weights, state)
    write_json(done, record)
    return record, state
