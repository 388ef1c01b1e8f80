"""Data: datasets decoded into tensors, partition schemes, batched augmentation, the DataModule."""

from psgd.data.datamodule import ClassificationData
from psgd.data.datasets import INFO, DataError, load_split
from psgd.data.partition import SCHEMES, partition

__all__ = ["INFO", "SCHEMES", "ClassificationData", "DataError", "load_split", "partition"]
