"""Plain nn.Modules, chosen with `model=`; a class with an `input_size` gets its images resized to it."""

from psgd.choices import BUILTIN
from psgd.models.lab_cnn import LabCNN
from psgd.models.mlp import MLP
from psgd.models.singa_cnn import SingaCNN
from psgd.models.wide_resnet import WideResNet

__all__ = ["BUILTIN", "MLP", "LabCNN", "SingaCNN", "WideResNet"]
