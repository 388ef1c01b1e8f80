"""psgd: parallel SGD (DDP, model averaging, local SGD, HogWild) with PyTorch Lightning and Hydra."""

__version__ = "0.1.0"

import warnings

# Lightning 2.6 calls a torch pytree API that torch 2.14 deprecates; harmless, and printed by every worker.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
