"""psgd: parallel SGD (DDP, model averaging, local SGD, HogWild) with PyTorch Lightning and Hydra."""

__version__ = "0.1.0"

import logging
import os
import warnings

# Lightning 2.6 calls a torch pytree API that torch 2.14 deprecates; harmless, and printed by every worker.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")

QUIET_ENV = "PSGD_QUIET"  # set by a quiet run for its worker processes, which import psgd when they start


def quiet_lightning() -> None:
    """No Lightning info lines ("Initializing distributed", banners) and no advisory warnings."""
    os.environ[QUIET_ENV] = "1"
    # import first: importing Lightning sets its loggers to INFO, which would undo the levels set here
    import pytorch_lightning  # noqa: F401
    from lightning_fabric.utilities.warnings import PossibleUserWarning

    for name in ("pytorch_lightning", "lightning_fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)

    warnings.filterwarnings("ignore", category=PossibleUserWarning)


if os.environ.get(QUIET_ENV) == "1":
    quiet_lightning()
