"""Datasets (`load_dataset`), containers and partition schemes."""
from pflkit.data.base import Dataset, DatasetMeta, DatasetNotFoundError, ImageFiles, to_float
from pflkit.data.datasets import DATASETS, dataset_names, load_dataset

__all__ = ["DATASETS", "Dataset", "DatasetMeta", "DatasetNotFoundError", "ImageFiles", "dataset_names",
           "load_dataset", "to_float"]
