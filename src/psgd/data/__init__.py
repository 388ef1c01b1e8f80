"""Data: datasets decoded into tensors, partition schemes, batched augmentation, the DataModule."""

from psgd.choices import INFO
from psgd.data.datamodule import ClassificationData
from psgd.data.datasets import load_split
from psgd.data.partition import SCHEMES, partition
from psgd.errors import DataError

__all__ = ["INFO", "SCHEMES", "ClassificationData", "DataError", "load_split", "partition"]
