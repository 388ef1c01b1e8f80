"""psgd: parallel SGD (DDP, model averaging, local SGD, HogWild) with PyTorch Lightning and Hydra."""

__version__ = "0.1.0"
