"""The data checks of a run, before any training: one-line `ConfigError`s naming the setting to change.

``[data]`` names a registered dataset and its options (`check_data_setting`); every client gets
training and test samples (`check_client_splits`); a dataset or federation handed to `run_experiment`
fits the config and each other (`check_given_data`, `check_given_splits`, `check_federation_fits`).
`user_data_record` and `federation_record` are what results.json says about such data of one's own.
"""
from __future__ import annotations

from pflkit.config import ConfigError
from pflkit.data.datasets import DATASETS, check_dataset, dataset_options
from pflkit.fl.federation import Federation
from pflkit.run.experiment_config import DataConfig, ExperimentConfig


def check_client_splits(fed: Federation, cfg: ExperimentConfig | None = None, *, data: DataConfig | None = None,
                        key: str = "data", splits=("train", "test")) -> None:
    """Every client needs training and test samples: else its accuracy would be NaN (before any training).

    ``data`` / ``key`` name other data settings (``pretrain.data``, whose clients need only ``splits=("train",)``).
    """
    data = data if data is not None else cfg.data
    for split in splits:
        empty = [c.id for c in fed.clients if c.num(split) == 0]
        if empty:
            shown = ", ".join(map(str, empty[:5])) + (", ..." if len(empty) > 5 else "")
            raise ConfigError(f"{key}.num_clients={data.num_clients}: {len(empty)} of {fed.num_clients} clients get "
                              f"no {split} samples from {data.dataset!r} (clients {shown}); use fewer clients"
                              + (f" or a larger {key}.test_fraction" if split == "test" else ""))


def check_data_setting(cfg: ExperimentConfig) -> None:
    """``data.dataset`` is a registered name and ``data.options`` its options: one-line `ConfigError`s
    before the output folder is touched (a dataset of one's own: `pflkit.data.register_dataset`)."""
    d = cfg.data
    if d.dataset not in DATASETS:
        raise ConfigError(f"data.dataset={d.dataset!r}: unknown dataset; known: {', '.join(DATASETS)} (add your own "
                          "with pflkit.data.register_dataset, or pass run_experiment(dataset=...))")
    known = dataset_options(d.dataset)
    for key, value in d.options.items():
        if key not in known:
            raise ConfigError(f"data.options.{key}={value!r}: not an option of dataset {d.dataset!r} "
                              f"(its options: {', '.join(known) or 'none'})")


def check_given_data(cfg: ExperimentConfig, dataset, federation) -> None:
    """One-line `ConfigError`s, before any work, for a dataset or federation handed to `run_experiment`:
    its type, the config naming another dataset or client count (whether the trainer takes such objects
    at all: `pflkit.run.trainer.Trainer.check`)."""
    if dataset is not None:
        try:
            check_dataset(dataset)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"run_experiment(dataset=...): {e}") from None
        if dataset.meta.name != cfg.data.dataset or cfg.data.options:
            raise ConfigError(f"data.dataset={cfg.data.dataset!r}: the dataset given is {dataset.meta.name!r}; set "
                              f"data.dataset = {dataset.meta.name!r} and no data.options")
    if federation is not None:
        if not isinstance(federation, Federation):
            raise ConfigError(f"run_experiment(federation=...): a {type(federation).__name__}, not a Federation")
        if federation.num_clients != cfg.data.num_clients:
            raise ConfigError(f"data.num_clients={cfg.data.num_clients}: the federation given has "
                              f"{federation.num_clients} clients")
        for key in ("task", "augment"):
            if federation.recipe.get(key, "label" if key == "task" else "none") != getattr(cfg.data, key):
                raise ConfigError(f"data.{key}={getattr(cfg.data, key)!r}: the federation given was made with "
                                  f"{key}={federation.recipe.get(key)!r}")
        check_given_splits(cfg, federation)


def check_given_splits(cfg: ExperimentConfig, fed: Federation) -> None:
    """Every client of a given federation has test samples, and validation samples when a stage trained on it
    keeps its best state by a validation score (else that score would be NaN)."""
    no_test = [c.id for c in fed.clients if c.num("test") == 0]
    if no_test:
        raise ConfigError(f"run_experiment(federation=...): clients {no_test[:5]} have no test samples; every "
                          "client is tested")
    no_val = [c.id for c in fed.clients if c.num("val") == 0]
    own = [cfg.pretrain] if cfg.pretrain is not None and cfg.pretrain.data is None else []
    for st in own + list(cfg.methods):
        c = st.config
        if no_val and getattr(c, "keep_best", False) and c.eval_every and c.select in ("val_acc", "val_loss"):
            raise ConfigError(f"run_experiment(federation=...): clients {no_val[:5]} have no validation samples, but "
                              f"stage {st.label!r} keeps its best state by {c.select}; give val index sets or set "
                              "its keep_best = false")


def check_federation_fits(federation: Federation | None, dataset) -> None:
    """The federation given was made over this dataset: the same name and number of pooled samples."""
    if federation is None:
        return
    n = len(dataset.y_train) + len(dataset.y_test)
    if federation.recipe.get("dataset") != dataset.meta.name or len(federation.y) != n:
        raise ConfigError(f"run_experiment(federation=...): made over {federation.recipe.get('dataset')!r} with "
                          f"{len(federation.y)} samples, but the run's dataset is {dataset.meta.name!r} with {n}")


def user_data_record(dataset, fp: dict, given: bool) -> dict:
    """results.json's ``data`` entries on a dataset of one's own: where it came from, its sample counts and
    the sha256 of its arrays (its ``files`` may be empty: then the arrays are all that identify it)."""
    if "arrays_sha256" not in fp["data"]:
        return {}
    origin = "run_experiment(dataset=...)" if given else "register_dataset"
    return {"origin": origin, "arrays_sha256": fp["data"]["arrays_sha256"],
            "samples": {"train": len(dataset.y_train), "test": len(dataset.y_test)}}


def federation_record(fed: Federation) -> dict:
    """results.json's ``federation`` of a run given its clients (`Federation.from_indices`)."""
    keys = ("scheme", "num_clients", "unseen", "task", "augment", "domains", "domain_names")
    return {"given": True, **{k: fed.recipe.get(k) for k in keys}, "indices_sha256": fed.digest(),
            "sizes": {s: fed.sizes(s).tolist() for s in ("train", "val", "test")}}
