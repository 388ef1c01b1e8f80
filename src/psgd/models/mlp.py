"""The one-hidden-layer perceptron of the ThreadPool data-parallelism exercise."""

from torch import Tensor, nn


class MLP(nn.Module):
    """784 -> 256 sigmoid -> 10, with its own L2 strength per weight matrix.

    The exercise regularises the first weight matrix with 1e-2 and the second with 1e-5; that is
    expressed as per-parameter-group weight decay (see `param_groups`), which every optimizer honours.
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        hidden: int = 256,
        weight_decay_hidden: float = 1e-2,
        weight_decay_output: float = 1e-5,
    ):
        super().__init__()
        if not (isinstance(hidden, int) and not isinstance(hidden, bool) and hidden >= 1):
            raise ValueError(f"model.hidden={hidden!r} is invalid: must be an integer >= 1 (hidden units)")
        for key, decay in (("weight_decay_hidden", weight_decay_hidden), ("weight_decay_output", weight_decay_output)):
            if not (isinstance(decay, int | float) and not isinstance(decay, bool) and decay >= 0):
                raise ValueError(f"model.{key}={decay!r} is invalid: must be a number >= 0")
        self.hidden = nn.Linear(in_channels * 28 * 28, hidden)
        self.output = nn.Linear(hidden, num_classes)
        self.weight_decay_hidden = weight_decay_hidden
        self.weight_decay_output = weight_decay_output

    def forward(self, x: Tensor) -> Tensor:
        return self.output(self.hidden(x.flatten(1)).sigmoid())

    def param_groups(self) -> list[dict]:
        """Weight matrices with their own decay; biases undecayed."""
        return [
            {"params": [self.hidden.weight], "weight_decay": self.weight_decay_hidden},
            {"params": [self.output.weight], "weight_decay": self.weight_decay_output},
            {"params": [self.hidden.bias, self.output.bias], "weight_decay": 0.0},
        ]
