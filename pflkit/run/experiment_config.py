"""A resolved experiment: its settings as frozen dataclasses, each value checked when it is made.

`ExperimentConfig` holds the data (`DataConfig`: dataset, partition, per-client splits), the model, an
optional pretraining stage and the methods; `pflkit.run.experiments.resolve` makes it from a file, a
preset and overrides. Every check here is a one-line `ConfigError` naming the key, before any data is
loaded: a partition's options (dry-run by the partition's own validators), a method's client group,
model options and ``start_from`` against the experiment (`check_methods`), the device and kernels
(`check_device`, `check_kernels`), keep-best's need for a validation split (`check_keep_best`).

The ``[pretrain]`` stage may bring its own data and weights (`PretrainStage`):
``[pretrain.data]`` (the fields of ``[data]`` plus ``source_split``) builds the
stage's own federation, e.g. FedL2P's CIFAR-10-C clients fine-tune the model
pretrained on clean CIFAR-10 (sec. 4.3, App. D); ``new_head = true`` re-initializes
the classifier head when the trained weights are carried to the experiment's model
(App. D: "a new head"); ``algorithm = "none"`` trains nothing, so the stage is only
a source of weights (the model as built, e.g. ``model.options.pretrained = true``
for torchvision's ImageNet ResNet-18, or the file ``weights``).

A method may also be trained on part of the federation, with its own model size, or from
another method's trained weights (`MethodStage`; pFedHN Table 2 trains each baseline per
budget group, sec. 5.2): ``clients = { group = 0, of = 3 }`` (the first of three equal
contiguous client groups, renumbered as a federation of their own), ``model = { width = 8 }``
(options over ``[model].options`` for this method only) and ``start_from = "FedAvg (S)"`` (the
global model of an earlier method of the file, as LG-FedAvg starts from FedAvg's, sec. 5).
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any

from pflkit.config import OMIT_DEFAULT, ConfigError, one_of, require, to_dict


@dataclass(frozen=True)
class DataConfig:
    """Dataset, partition and per-client splits (`pflkit.fl.federate.build_federation`)."""

    dataset: str = "digits"
    options: dict = field(default_factory=dict)
    scheme: str = "dirichlet"
    num_clients: int = 10
    partition: dict = field(default_factory=dict)
    split: str = "pool"
    test_fraction: float = 0.2
    val_fraction: float = 0.2
    task: str = "label"
    augment: str = "none"
    unseen_clients: int = 0
    # which clients are unseen: "random" (drawn from the seed, FedL2P sec. 4.3) or "last" (the last ones, pFedHN
    # sec. 5.3, whose novel clients are partitioned with their own alpha at the end of the list)
    unseen_pick: str = field(default="random", metadata=OMIT_DEFAULT)

    def __post_init__(self):
        from pflkit.data.partition import PARTITIONS
        from pflkit.data.transforms import AUGMENTS

        one_of("data.scheme", self.scheme, set(PARTITIONS))
        require(self.num_clients >= 1, "data.num_clients", self.num_clients, "must be >= 1")
        require(0 <= self.unseen_clients < self.num_clients, "data.unseen_clients", self.unseen_clients,
                "must be in [0, data.num_clients)")
        one_of("data.unseen_pick", self.unseen_pick, {"random", "last"})
        one_of("data.split", self.split, {"pool", "paired"})
        one_of("data.task", self.task, {"label", "superclass"})
        one_of("data.augment", self.augment, set(AUGMENTS))
        for key in ("test_fraction", "val_fraction"):
            v = getattr(self, key)
            require(0 <= v < 1, f"data.{key}", v, "must be in [0, 1)")
        params = inspect.signature(PARTITIONS[self.scheme]).parameters
        for k in self.partition:
            require(k in params and k not in ("labels", "num_clients", "seed"), f"data.partition.{k}",
                    self.partition[k], f"not an option of scheme {self.scheme!r}")
        _dry_run_partition(PARTITIONS[self.scheme], self.num_clients, self.partition)


def _dry_run_partition(scheme, num_clients: int, options: dict) -> None:
    """Check the partition options whose validity does not depend on the data, before it is loaded.

    Each is checked by the partition package's own validator; an invalid value is a `ConfigError`
    naming ``data.partition.KEY``. Size-dependent checks (enough samples per class, ...) need the
    real data and happen when the federation is built.
    """
    from pflkit.data.partition._common import check_alpha, check_positive_int

    checks = {"alpha": lambda v: check_alpha(v, num_clients),
              "classes_per_client": lambda v: check_positive_int(v, "classes_per_client"),
              "samples_per_client": lambda v: v is None or isinstance(v, (list, tuple))
              or check_positive_int(v, "samples_per_client"),
              "samples_per_class": lambda v: isinstance(v, (list, tuple)) or check_positive_int(v, "samples_per_class")}
    for key, value in options.items():
        if key in checks:
            try:
                checks[key](value)
            except (ValueError, TypeError) as e:
                raise ConfigError(f"data.partition.{key}={value!r}: {e}") from None


SOURCE_SPLITS = ("all", "train", "test")


@dataclass(frozen=True)
class PretrainDataConfig(DataConfig):
    """``[pretrain.data]``: the pretraining stage's own federation.

    The fields of `DataConfig` (checked by the same rules, errors name ``pretrain.data.KEY``)
    plus ``source_split``: which of the dataset's own splits the federation is made of,
    ``"all"`` (train and test pooled, as ``[data]``), ``"train"`` or ``"test"``. FedL2P's
    CIFAR-10-C clients are made of the CIFAR-10 test split, so their pretraining federation
    takes the train split only: no client image is seen, even uncorrupted, in pretraining.
    """

    source_split: str = "all"

    def __post_init__(self):
        from pflkit.data.datasets import DATASETS, dataset_options

        one_of("pretrain.data.source_split", self.source_split, set(SOURCE_SPLITS))
        require(self.dataset in DATASETS, "pretrain.data.dataset", self.dataset,
                f"unknown dataset; known: {', '.join(DATASETS)}")
        known = dataset_options(self.dataset)
        for key in self.options:
            require(key in known, f"pretrain.data.options.{key}", self.options[key],
                    f"not an option of dataset {self.dataset!r} (its options: {', '.join(known) or 'none'})")
        require(self.split == "pool" or self.source_split == "all", "pretrain.data.split", self.split,
                f"needs both of the dataset's splits; with source_split={self.source_split!r} use split='pool'")
        try:
            super().__post_init__()
        except ConfigError as e:  # DataConfig names its keys data.KEY
            msg = str(e)
            raise ConfigError(f"pretrain.{msg}" if msg.startswith("data.") else msg) from None


@dataclass(frozen=True)
class ModelConfig:
    name: str = "digits_cnn"
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StageConfig:
    """One trained method: its table label, algorithm and the algorithm's config."""

    label: str
    algorithm: str
    config: Any


@dataclass(frozen=True)
class ClientGroup:
    """``clients = { group = G, of = N }``: the clients of equal contiguous group ``group`` of ``of``.

    The groups are those of pFedHN's budgets (Table 2: clients [0, n/3) are S, and so on), so a preset
    that changes ``data.num_clients`` keeps the split. Attributes: ``group`` (0-based), ``of``.
    """

    group: int
    of: int

    def ids(self, num_clients: int) -> list[int]:
        """The client ids of the group, in order (`pflkit.fl.federate.contiguous_group`)."""
        from pflkit.fl.federate import contiguous_group

        return [i for i in range(num_clients) if contiguous_group(i, num_clients, self.of) == self.group]


@dataclass(frozen=True)
class MethodStage(StageConfig):
    """A method of ``[methods]``, with the settings that say where it trains and from what.

    Attributes:
        clients: train and test on this client group only, as a federation of its own (its clients
            renumbered 0..k-1); None: every client. pFedHN Table 2: baselines "cannot share across
            sizes", so each is trained per budget group (sec. 5.2, App. B).
        model: options replacing ``[model].options`` for this method (``{ width = 8 }``: LeNet S).
        start_from: the label of an earlier method whose global model this one starts from (its
            weights, same seed): LG-FedAvg from the FedAvg model of its group (sec. 5).
    """

    clients: ClientGroup | None = None
    model: dict = field(default_factory=dict)
    start_from: str = ""

    def extra_dict(self) -> dict:
        """The method-level settings that differ from their defaults (so runs made before they existed
        keep their fingerprints)."""
        out: dict = {}
        if self.clients is not None:
            out["clients"] = {"group": self.clients.group, "of": self.clients.of}
        if self.model:
            out["model"] = dict(self.model)
        if self.start_from:
            out["start_from"] = self.start_from
        return out


NO_TRAINING = "none"  # pretrain.algorithm of a stage that is only a source of weights
NORMALIZE = ("pretrain", "data")


@dataclass(frozen=True)
class NoTrainingConfig:
    """The settings of ``pretrain.algorithm = "none"``: there are none, the stage trains nothing."""


@dataclass(frozen=True)
class PretrainStage(StageConfig):
    """The ``[pretrain]`` stage: a trained method whose global model the other methods start from.

    Attributes:
        data: its own federation (``[pretrain.data]``); None trains on the experiment's clients.
        new_head: when the stage's model is carried to the experiment's model, keep its body
            exactly and re-initialize the classifier ``head`` (seeded). Needed when the class
            sets differ; FedL2P App. D attaches a new head to the ImageNet ResNet-18.
        weights: a state-dict file (``torch.save(model.state_dict())``, e.g. another run's
            ``global.weights.pt``) loaded, with ``weights_only``, into the stage's start model:
            every body tensor must fit; head tensors of another shape are left as initialized.
        normalize: with ``data``, how the clients' images are normalized: ``"pretrain"`` with
            the pretraining data's per-channel mean and std (the pretrained model's
            preprocessing, as ImageNet statistics for DomainNet in FedL2P), ``"data"`` with
            their own dataset's.
    """

    data: PretrainDataConfig | None = None
    new_head: bool = False
    weights: str = ""
    normalize: str = "pretrain"

    @property
    def separate(self) -> bool:
        """True when the stage's model is not simply the experiment's model trained on its clients."""
        return self.data is not None or self.new_head or self.algorithm == NO_TRAINING

    def extra_dict(self) -> dict:
        """The stage-level settings that differ from their defaults (so runs made before they
        existed keep their fingerprints)."""
        out: dict = {}
        if self.data is not None:
            out.update(data=to_dict(self.data), normalize=self.normalize)
        if self.new_head:
            out["new_head"] = True
        if self.weights:
            out["weights"] = self.weights
        return out


@dataclass(frozen=True)
class ExperimentConfig:
    """A fully resolved experiment (file + preset + overrides)."""

    name: str
    paper: str
    table: str
    title: str
    preset: str
    data: DataConfig
    model: ModelConfig
    pretrain: PretrainStage | None
    methods: tuple[StageConfig, ...]
    published: dict = field(default_factory=dict)
    published_detail: dict = field(default_factory=dict)  # the paper's other numbers: per-group accuracies, ARIs
    seed: int = 0
    seeds: int = 1
    kernels: str = "auto"
    device: str = "auto"
    deviations: tuple[str, ...] = ()  # "key=value" of each setting the preset declares as not the paper's

    def to_dict(self) -> dict:
        def stage(s):
            if s is None:
                return None
            extra = s.extra_dict() if isinstance(s, (PretrainStage, MethodStage)) else {}
            return {"label": s.label, "algorithm": s.algorithm, **to_dict(s.config), **extra}

        return {"name": self.name, "paper": self.paper, "table": self.table, "title": self.title,
                "preset": self.preset, "seed": self.seed, "seeds": self.seeds, "kernels": self.kernels,
                "device": self.device, "data": to_dict(self.data), "model": to_dict(self.model),
                "pretrain": stage(self.pretrain), "methods": [stage(m) for m in self.methods],
                "published": self.published, "published_detail": self.published_detail,
                "deviations": list(self.deviations)}


def check_methods(methods: tuple[MethodStage, ...], data: DataConfig, model: ModelConfig, has_pretrain: bool) -> None:
    """The method-level settings against the experiment: groups that exist, model options the model
    takes, a ``start_from`` method that comes earlier, exports a global model and has the same clients
    and model (so its weights fit). One-line errors naming ``methods.LABEL.KEY``."""
    from pflkit.algorithms import ALGORITHMS
    from pflkit.models import MODELS, model_options

    known = model_options(model.name) if model.name in MODELS else {}
    earlier: dict[str, MethodStage] = {}
    for m in methods:
        key = f"methods.{m.label}"
        if m.clients is not None:
            require(m.clients.of <= data.num_clients, f"{key}.clients.of", m.clients.of,
                    f"more groups than clients (data.num_clients={data.num_clients})")
            require(data.unseen_clients == 0, f"{key}.clients", m.extra_dict()["clients"],
                    "a client group cannot be combined with data.unseen_clients")
        for k, v in m.model.items():
            require(k in known, f"{key}.model.{k}", v,
                    f"not an option of model {model.name!r} (its options: {', '.join(known) or 'none'})")
        if m.start_from:
            src = earlier.get(m.start_from)
            require(src is not None, f"{key}.start_from", m.start_from,
                    f"not the label of an earlier method; earlier: {', '.join(earlier) or 'none'}")
            require(ALGORITHMS[src.algorithm].exports_global, f"{key}.start_from", m.start_from,
                    f"its algorithm {src.algorithm!r} has no global model to start from")
            require(src.clients == m.clients and src.model == m.model, f"{key}.start_from", m.start_from,
                    "must have the same clients and model settings as this method (its weights must fit)")
        if data.unseen_clients and ALGORITHMS[m.algorithm].fit_unseen is not None:
            novel_fit = getattr(m.config, "novel_fit", "converge")  # pFedHN's unseen clients (sec. 5.3)
            require(novel_fit == "converge", f"{key}.novel_fit", novel_fit,
                    "data.unseen_clients fits each unseen client's embedding until it converges; use 'converge'")
        require(has_pretrain or m.start_from or not ALGORITHMS[m.algorithm].needs_pretrained, key, m.algorithm,
                "starts from a pretrained model, but the experiment has no [pretrain] stage (or set start_from)")
        earlier[m.label] = m


DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def check_device(device: str) -> None:
    """A device name pflkit accepts: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.

    ``auto`` means CUDA when available, else the CPU (`pflkit.run.environment.resolve_device`). A CUDA or
    MPS device the machine does not have is an error here, before any data is loaded.
    """
    require(bool(DEVICE_PATTERN.match(device)), "device", device, "must be auto, cpu, cuda, cuda:N or mps")
    if device.startswith("cuda"):
        require(torch_cuda_count() > 0, "device", device, "CUDA is not available on this machine "
                "(use device=auto or device=cpu)")
        index = int(device.split(":")[1]) if ":" in device else 0
        require(index < torch_cuda_count(), "device", device,
                f"this machine has {torch_cuda_count()} CUDA device(s)")
    if device == "mps":
        import torch

        require(torch.backends.mps.is_available(), "device", device, "MPS is not available on this machine")


def torch_cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_kernels(kernels: str, device: str) -> None:
    """``kernels=triton`` needs CUDA (or Triton's CPU interpreter, ``TRITON_INTERPRET=1``, for tests)."""
    if kernels != "triton":
        return
    from pflkit.kernels import triton_importable
    from pflkit.kernels._triton_common import interpreter_enabled

    require(triton_importable(), "kernels", kernels, "Triton is not installed (use kernels=auto or reference)")
    on_cuda = device.startswith("cuda") or (device == "auto" and torch_cuda_count() > 0)
    require(on_cuda or (device in ("cpu", "auto") and interpreter_enabled()), "kernels", kernels,
            f"the Triton kernels need a CUDA device (device={device!r} here; use kernels=auto or reference)")


def check_keep_best(data: DataConfig, stages, where: str = "data") -> None:
    """Keep-best on validation scores needs a validation split (else every score is NaN).

    ``where`` names the data the stages train on (``pretrain.data`` for a pretraining stage with its own).
    """
    if data.val_fraction > 0:
        return
    for st in stages:
        c = getattr(st, "config", None)
        if getattr(c, "keep_best", False) and c.eval_every and c.select in ("val_acc", "val_loss"):
            key = "pretrain" if isinstance(st, PretrainStage) else f'methods."{st.label}"'
            raise ConfigError(f"{where}.val_fraction=0.0: stage {st.label!r} keeps its best state by {c.select}, "
                              f"which needs a validation split (set {where}.val_fraction > 0, or "
                              f"{key}.keep_best=false)")
