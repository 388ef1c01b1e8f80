"""The lab CNN of the parallel-SGD lab (MNIST at 32x32), layer for layer."""

from torch import Tensor, nn


class LabCNN(nn.Module):
    """Conv(16,5) -> pool -> ReLU -> Conv(32,5) -> pool -> ReLU -> Dropout -> pool -> 3 linear layers.

    The lab's exact layer order is kept: a third max-pool after the dropout, no ReLU between the last
    two linear layers, and a log-softmax output. Needs 32x32 inputs (32*2*2 = 128 features).
    """

    input_size = 32  # the images are resized to this (the lab resizes MNIST/FashionMNIST from 28 to 32)

    def __init__(self, in_channels: int = 1, num_classes: int = 10, dropout: float = 0.4, batch_norm: bool = False):
        super().__init__()

        def norm(c: int) -> nn.Module:
            return nn.BatchNorm2d(c) if batch_norm else nn.Identity()

        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 5),
            norm(16),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Conv2d(16, 32, 5),
            norm(32),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * 2 * 2, 512),
            nn.ReLU(),
            nn.Linear(512, 256),
            nn.Linear(256, num_classes),
            nn.LogSoftmax(dim=1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
