"""Plain nn.Modules, chosen with `model=`: each class states the input size it needs (None: any)."""

from psgd.models.lab_cnn import LabCNN
from psgd.models.mlp import MLP
from psgd.models.singa_cnn import SingaCNN
from psgd.models.wide_resnet import WideResNet

# each `model=<name>` choice of conf/model and the class it builds (`model.name` is the run's label)
BUILTIN = {
    "lab_cnn": "psgd.models.LabCNN",
    "mlp": "psgd.models.MLP",
    "singa_cnn": "psgd.models.SingaCNN",
    "wide_resnet": "psgd.models.WideResNet",
}

__all__ = ["BUILTIN", "MLP", "LabCNN", "SingaCNN", "WideResNet"]
