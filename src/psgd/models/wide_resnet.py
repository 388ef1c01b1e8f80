"""The WideResNet of the data-parallel workshop (Fundamentals of Deep Learning for Multi-GPUs)."""

from torch import Tensor, nn


def conv_bn_relu(in_channels: int, out_channels: int) -> nn.Sequential:
    """3x3 same-padded conv without bias, then BatchNorm and ReLU (the workshop's `cbr`)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class ResidualBlock(nn.Module):
    """cbr(in,out) -> Dropout(0.01) -> cbr(out,out), plus the input (through a 1x1 conv when `scale`)."""

    def __init__(self, in_channels: int, out_channels: int, scale: bool = False, dropout: float = 0.01):
        super().__init__()
        self.body = nn.Sequential(
            conv_bn_relu(in_channels, out_channels),
            nn.Dropout(dropout),
            conv_bn_relu(out_channels, out_channels),
        )
        self.shortcut = nn.Conv2d(in_channels, out_channels, 1, bias=False) if scale else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x) + self.shortcut(x)


class WideResNet(nn.Module):
    """cbr(C,16) -> 3 stages of (scaling block, block) at 160/320/640 channels -> global pool -> linear.

    The workshop pooled with AvgPool2d(7), which is global only at 28x28; here the pool is global at
    every input size, so the same network serves MNIST-sized and CIFAR-sized images.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, dropout: float = 0.01):
        super().__init__()
        self.features = nn.Sequential(
            conv_bn_relu(in_channels, 16),
            ResidualBlock(16, 160, scale=True, dropout=dropout),
            ResidualBlock(160, 160, dropout=dropout),
            nn.MaxPool2d(2),
            ResidualBlock(160, 320, scale=True, dropout=dropout),
            ResidualBlock(320, 320, dropout=dropout),
            nn.MaxPool2d(2),
            ResidualBlock(320, 640, scale=True, dropout=dropout),
            ResidualBlock(640, 640, dropout=dropout),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(640, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
