"""The classes a config names (`model._target_`, `optimizer._target_`), judged before any worker starts:
imported, built and, for the network, run on the dataset's image shape. Each problem is one ConfigError line.
torch is imported by the functions that build, so that the package imports without it.
"""

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from psgd.choices import INFO
from psgd.console import text_lines
from psgd.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from psgd.config.schema import Run


def locate(key: str, target: object) -> type:
    """The class a `_target_` names, imported; else a ConfigError naming `key` and why (a module not
    installed, a misspelt name), without Hydra's ERROR log lines."""
    from hydra.utils import get_class

    log = logging.getLogger("hydra.utils")
    was, log.disabled = log.disabled, True
    try:
        return get_class(str(target))
    except ImportError as e:
        raise ConfigError(f"{key}={target} cannot be imported ({text_lines(e.__cause__ or e)[-1]})") from e
    except ValueError as e:  # it names something other than a class
        raise ConfigError(f"{key}={target} is invalid: {text_lines(e)[-1]}") from e
    finally:
        log.disabled = was


def build_model(model: Mapping[str, Any], data_name: str, device: str = "cpu") -> tuple["nn.Module", int]:
    """The network `model` describes (its `name`, `_target_` and the class's own arguments) for this dataset,
    on `device`, and the image size it takes (the model class's `input_size` where it has one, else the
    dataset's), run once on that shape. A class that cannot be imported, a setting the model has no argument
    for, a value it refuses or a shape it cannot take is a ConfigError."""
    import torch

    params = OmegaConf.to_container(model, resolve=True) if OmegaConf.is_config(model) else dict(model)
    name, cls = params.pop("name"), locate("model._target_", params.pop("_target_"))
    info = INFO[data_name]
    size = getattr(cls, "input_size", None) or info.size
    try:
        with torch.device(device):
            net = cls(**{"in_channels": info.channels, "num_classes": info.num_classes, **params})
    except TypeError as e:  # a setting the model has no argument for
        raise ConfigError(f"model={name}: {e}") from e
    except ValueError as e:  # a value the model refuses, named in its message
        raise ConfigError(str(e)) from e
    try:  # a dry forward pass catches a shape the network cannot take now, not in a worker mid-run
        net.eval()
        with torch.no_grad():
            net(torch.zeros(2, info.channels, size, size, device=device))
        net.train()
    except RuntimeError as e:
        raise ConfigError(
            f"model={name} does not fit data={data_name} ({info.channels}x{size}x{size}): {str(e).splitlines()[0]}"
        ) from e
    return net, size


def check_targets(run: "Run") -> None:
    """The model and the optimizer a config names, built: the network on the meta device, and where it fails
    there (also for what meta tensors cannot do, such as .item()) on the CPU as the job will, which raises the
    job's error, with torch's random numbers left as they were; the optimizer (and those the strategy names)
    on a stand-in parameter, as the run makes it, so that a setting its constructor refuses is one line naming
    the settings."""
    import torch
    from hydra.utils import instantiate

    model = run.model.settings()
    try:
        build_model(model, run.data.name, device="meta")
    except Exception:
        with torch.random.fork_rng(devices=[]):
            build_model(model, run.data.name)
    for key, optimizer in {"optimizer": run.optimizer, **run.strategy.optimizers()}.items():
        opt = optimizer.settings()
        locate(f"{key}._target_", opt["_target_"])
        try:
            instantiate(opt, _convert_="all")([torch.zeros(1, requires_grad=True)])
        except Exception as e:
            settings = " ".join(f"{k}={v}" for k, v in opt.items() if not str(k).startswith("_"))
            reason = text_lines(e.__cause__ or e)[-1]
            raise ConfigError(
                f"{key} settings are invalid: {opt['_target_']} refuses them ({reason}); the settings were: {settings}"
            ) from e
