"""The classes a config names (`model._target_`, `optimizer._target_`), judged before any worker starts:
imported, built and, for the network, run on the dataset's image shape. Each problem is one ConfigError line.
torch is imported by the functions that build, so that the package imports without it.
"""

import logging
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from psgd.choices import INFO
from psgd.console import text_lines
from psgd.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn


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


def model_arguments(model_cfg: DictConfig, data_name: str) -> tuple[type, dict[str, Any], int]:
    """The network's class, its constructor's keyword arguments (the config's and the dataset's channels and
    classes) and the image size it takes with this dataset, or a ConfigError: a class that cannot be
    imported, a model that needs other images than the dataset has."""
    params = OmegaConf.to_container(model_cfg, resolve=True)
    name, target = params.pop("name"), params.pop("_target_")
    cls = locate("model._target_", target)
    info = INFO[data_name]
    size, needed = info.size, getattr(cls, "input_size", None)
    if needed is not None and needed != size:
        if not getattr(cls, "resize_input", False):
            fits = [d for d, i in INFO.items() if i.size == needed]
            raise ConfigError(
                f"model={name} needs {needed}x{needed} inputs but data={data_name} has {size}x{size} images; "
                f"allowed data for {name}: {', '.join(fits)}"
            )
        size = needed
    return cls, {"in_channels": info.channels, "num_classes": info.num_classes, **params}, size


def build_model(model_cfg: DictConfig, data_name: str, device: str = "cpu") -> tuple["nn.Module", int]:
    """The network for this dataset, on `device`, and the image size it needs, run once on that shape;
    a setting the model has no argument for, a value it refuses or a shape it cannot take is a ConfigError."""
    import torch

    cls, arguments, size = model_arguments(model_cfg, data_name)
    name, info = model_cfg.name, INFO[data_name]
    try:
        with torch.device(device):
            net = cls(**arguments)
    except TypeError as e:  # a setting the model has no argument for
        raise ConfigError(f"model={name}: {e}") from e
    except ValueError as e:  # a value the model refuses, named in its message
        raise ConfigError(str(e)) from e
    try:  # a dry forward pass catches any other shape mismatch now, not in a worker mid-run
        net.eval()
        with torch.no_grad():
            net(torch.zeros(2, info.channels, size, size, device=device))
        net.train()
    except RuntimeError as e:
        raise ConfigError(
            f"model={name} does not fit data={data_name} ({info.channels}x{size}x{size}): {str(e).splitlines()[0]}"
        ) from e
    return net, size


def meta_network(model_cfg: DictConfig, data_name: str) -> tuple[Any, int]:
    """The job's network built on the meta device (no memory, no random numbers) and the image size it takes;
    model_arguments' ConfigError, or what its constructor raises (also what it cannot do on meta)."""
    import torch

    cls, arguments, size = model_arguments(model_cfg, data_name)
    with torch.device("meta"):
        return cls(**arguments), size


def check_optimizer(opt: DictConfig) -> None:
    """The optimizer built once on a stand-in parameter, so that a setting its constructor refuses is one
    line naming the settings before anything starts."""
    import torch
    from hydra.utils import instantiate

    locate("optimizer._target_", opt.get("_target_"))
    try:
        instantiate(opt, _convert_="all")([torch.zeros(1, requires_grad=True)])  # as run.py makes it
    except Exception as e:
        settings = " ".join(f"{k}={v}" for k, v in opt.items() if not str(k).startswith("_"))
        reason = text_lines(e.__cause__ or e)[-1]
        raise ConfigError(
            f"optimizer settings are invalid: {opt.get('_target_')} refuses them ({reason}); the settings were: "
            f"{settings}"
        ) from e


def check_targets(cfg: DictConfig) -> None:
    """The model and the optimizer a config names, built: the network on the meta device, and where it fails
    there (also for what meta tensors cannot do, such as .item()) on the CPU as the job will, which raises the
    job's error, with torch's random numbers left as they were."""
    import torch

    try:
        build_model(cfg.model, cfg.data.name, device="meta")
    except Exception:
        with torch.random.fork_rng(devices=[]):
            build_model(cfg.model, cfg.data.name)
    check_optimizer(cfg.optimizer)
