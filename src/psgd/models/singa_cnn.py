"""The CNN of Apache SINGA's MNIST tutorial (28x28 inputs)."""

from torch import Tensor, nn


class SingaCNN(nn.Module):
    """Conv(20,5) -> ReLU -> pool -> Conv(50,5) -> ReLU -> pool -> Linear(800,500) -> ReLU -> Linear."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 20, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(20, 50, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(50 * 4 * 4, 500),
            nn.ReLU(),
            nn.Linear(500, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)
