"""Datasets (`load_dataset`, `register_dataset` for one's own), containers and partition schemes."""
from pflkit.data.base import Dataset, DatasetMeta, DatasetNotFoundError, ImageFiles, to_float
from pflkit.data.datasets import (DATASETS, check_dataset, dataset_digest, dataset_names, load_dataset,
                                  register_dataset, unregister_dataset)

__all__ = ["DATASETS", "Dataset", "DatasetMeta", "DatasetNotFoundError", "ImageFiles", "check_dataset",
           "dataset_digest", "dataset_names", "load_dataset", "register_dataset", "to_float", "unregister_dataset"]
