import pytest
import torch
from torch import nn

from psgd.models import MLP, LabCNN, SingaCNN, WideResNet


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def cbr(i: int, o: int) -> int:  # 3x3 conv without bias + BatchNorm weight and bias
    return 9 * i * o + 2 * o


def block(i: int, o: int, scale: bool) -> int:
    return cbr(i, o) + cbr(o, o) + (i * o if scale else 0)


def wide_resnet_params(c: int) -> int:
    return (
        cbr(c, 16)
        + block(16, 160, True)
        + block(160, 160, False)
        + block(160, 320, True)
        + block(320, 320, False)
        + block(320, 640, True)
        + block(640, 640, False)
        + 640 * 10
        + 10
    )


@pytest.mark.parametrize("channels", [1, 3])
def test_lab_cnn_shape_and_parameter_count(channels):
    model = LabCNN(in_channels=channels)
    out = model(torch.randn(4, channels, 32, 32))
    assert out.shape == (4, 10)
    # log-softmax output: each row exponentiates to a probability distribution
    assert torch.allclose(out.exp().sum(1), torch.ones(4), atol=1e-5)
    expected = (channels * 16 * 25 + 16) + (16 * 32 * 25 + 32) + (128 * 512 + 512) + (512 * 256 + 256) + (256 * 10 + 10)
    assert n_params(model) == expected


def test_lab_cnn_layer_order_is_the_labs():
    kinds = [type(m).__name__ for m in LabCNN().features] + [type(m).__name__ for m in LabCNN().classifier]
    assert kinds == [
        "Conv2d",
        "Identity",
        "MaxPool2d",
        "ReLU",
        "Conv2d",
        "Identity",
        "MaxPool2d",
        "ReLU",
        "Dropout",
        "MaxPool2d",
        "Flatten",
        "Linear",
        "ReLU",
        "Linear",
        "Linear",
        "LogSoftmax",
    ]
    assert LabCNN().features[8].p == 0.4
    assert LabCNN(dropout=0.1).features[8].p == 0.1


def test_lab_cnn_batch_norm_option_adds_bn_after_each_conv():
    model = LabCNN(batch_norm=True)
    kinds = [type(m).__name__ for m in model.features]
    assert kinds[:2] == ["Conv2d", "BatchNorm2d"] and kinds[4:6] == ["Conv2d", "BatchNorm2d"]
    assert n_params(model) == n_params(LabCNN()) + 2 * 16 + 2 * 32


def test_lab_cnn_feature_map_is_32x2x2_at_32x32():
    assert LabCNN().features(torch.randn(2, 1, 32, 32)).shape == (2, 32, 2, 2)


@pytest.mark.parametrize("channels,size", [(1, 28), (3, 32)])
def test_wide_resnet_shape_and_parameter_count(channels, size):
    model = WideResNet(in_channels=channels).eval()
    with torch.no_grad():
        out = model(torch.randn(2, channels, size, size))
    assert out.shape == (2, 10)
    assert n_params(model) == wide_resnet_params(channels)


def test_wide_resnet_pool_is_global_at_both_sizes():
    model = WideResNet().eval()
    shapes = []

    def record(module, inputs, output):
        shapes.append((tuple(inputs[0].shape[-2:]), tuple(output.shape[-2:])))

    model.features[-2].register_forward_hook(record)
    with torch.no_grad():
        model(torch.randn(1, 1, 28, 28))
        model(torch.randn(1, 1, 32, 32))
    assert shapes == [((7, 7), (1, 1)), ((8, 8), (1, 1))]  # AvgPool2d(7) would leave 2x2 at 32x32
    shortcuts = [b.shortcut for b in model.features if hasattr(b, "shortcut")]
    assert [type(s).__name__ for s in shortcuts] == ["Conv2d", "Identity"] * 3


def test_singa_cnn_shape_and_parameter_count():
    model = SingaCNN()
    assert model(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    assert n_params(model) == (1 * 20 * 25 + 20) + (20 * 50 * 25 + 50) + (800 * 500 + 500) + (500 * 10 + 10)


def test_mlp_shape_parameter_count_and_per_layer_weight_decay():
    model = MLP()
    assert model(torch.randn(5, 1, 28, 28)).shape == (5, 10)
    assert n_params(model) == 784 * 256 + 256 + 256 * 10 + 10
    groups = model.param_groups()
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert decay[id(model.hidden.weight)] == 1e-2
    assert decay[id(model.output.weight)] == 1e-5
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    # the groups really reach the optimizer: one SGD step shrinks the hidden weights by lr*1e-2*w
    opt = torch.optim.SGD(groups, lr=1.0)
    before = model.hidden.weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.allclose(model.hidden.weight, before * (1 - 1e-2))


def test_the_steps_every_averaging_worker_takes_per_epoch_are_lightnings():
    """F, the steps model averaging's period counts in an epoch: the fewest any worker takes, as
    Lightning runs them. Lightning steps after an epoch's last batch whatever the accumulation holds:
    5 batches accumulated by 2 are 3 steps (F was 2, so each epoch's last step never counted)."""
    from psgd.strategies.model_averaging import common_steps

    assert common_steps([8, 5], None, 1) == 5  # uneven shards: the smaller one's
    assert common_steps([5, 5], None, 2) == 3
    assert common_steps([6, 6], None, 2) == 3
    assert common_steps([8, 5], 3, 1) == 3  # trainer.limit_train_batches=3: 3 batches at most
    assert common_steps([8, 6], 0.5, 1) == 3  # a fraction of each worker's batches
    assert common_steps([8, 6], 1.0, 1) == 6  # all of them
