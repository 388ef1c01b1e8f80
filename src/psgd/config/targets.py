"""The classes a config names (`model._target_`, `optimizer._target_`), judged before any worker starts:
imported, given only arguments they take, built on the meta device (no memory, no random numbers) and,
for the network, run on the dataset's image shape. Each problem is one ConfigError line.
"""

import inspect
import logging
import os
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from psgd.choices import INFO
from psgd.config.schema import ConfigError
from psgd.console import text_lines

if TYPE_CHECKING:
    from torch import nn

# the way out for an optimizer that refuses sparse gradients: said before a run, and by cli after torch's error
SPARSE_GRADIENTS_WAY_OUT = "use optimizer=sgd optimizer.fused=false, whose per-tensor update takes them"


def locate(key: str, target: object) -> type:
    """The class a `_target_` names, imported; else a ConfigError naming `key` and why (a module not
    installed, a misspelt name), without Hydra's ERROR log lines."""
    from hydra.utils import get_class

    if not (isinstance(target, str) and "." in target):
        raise ConfigError(f"{key}={target!r} is invalid: must name a class as module.Class")
    log = logging.getLogger("hydra.utils")
    was, log.disabled = log.disabled, True
    try:
        return get_class(target)
    except ImportError as e:
        cause = e.__cause__ or e
        module, _, name = target.rpartition(".")
        if isinstance(cause, ModuleNotFoundError) and cause.name == target:  # the module is there, the name not
            why = f"module {module} has no {name}"
        else:
            why = f"{type(cause).__name__}: {text_lines(cause)[-1]}"
        top = target.split(".")[0]
        if (
            isinstance(cause, ModuleNotFoundError)
            and cause.name == top
            and (os.path.isfile(f"{top}.py") or os.path.isdir(top))
        ):
            # python train.py puts the script's folder on the path, not the current one
            why += f"; {top} is in the current folder, which is not on Python's path: run with PYTHONPATH=."
        raise ConfigError(f"{key}={target} cannot be imported ({why})") from e
    except ValueError as e:  # it names something other than a class
        raise ConfigError(f"{key}={target} is invalid: {text_lines(e)[-1]}") from e
    finally:
        log.disabled = was


def _foreign(cls: type, params: dict[str, Any], skip: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the arguments `cls` takes, the keys of `params` it has no argument for); none found where its
    signature cannot be read or takes **kwargs."""
    try:
        signature = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return [], []
    takes = [k for k, p in signature.items() if k not in skip and p.kind is not p.VAR_POSITIONAL]
    if any(p.kind is p.VAR_KEYWORD for p in signature.values()):
        return takes, []
    return takes, [k for k in params if k not in signature]


def model_arguments(model_cfg: DictConfig, data_name: str) -> tuple[type, dict[str, Any], int]:
    """The network's class, its constructor's keyword arguments (the config's and the dataset's channels and
    classes) and the image size it takes with this dataset, or a ConfigError: a class that cannot be
    imported, a model that needs other images than the dataset has, a setting it has no argument for."""
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
    given = {"in_channels": info.channels, "num_classes": info.num_classes}  # psgd's, from the dataset
    takes, foreign = _foreign(cls, params, tuple(given))
    if foreign:
        settings = " and ".join(f"model.{k}={params[k]}" for k in foreign)
        one = len(foreign) == 1
        raise ConfigError(
            f"{settings} {'is not a setting' if one else 'are not settings'} of model={name} "
            f"({target} takes: {', '.join(takes) or 'none'}); leave {'it' if one else 'them'} out"
        )
    try:
        inspect.signature(cls).bind(**given, **params)
    except TypeError as e:  # a required argument not given
        raise ConfigError(f"model={name}: {e}") from e
    except ValueError:  # no signature to read (a class made in C): the constructor judges
        pass
    return cls, {**given, **params}, size


def meta_network(model_cfg: DictConfig, data_name: str) -> tuple[Any, int]:
    """The job's network built on the meta device and the image size it takes; model_arguments'
    ConfigError, or what its constructor raises (also what it cannot do on meta)."""
    import torch

    cls, arguments, size = model_arguments(model_cfg, data_name)
    with torch.device("meta"):
        return cls(**arguments), size


def check_model(model_cfg: DictConfig, data_name: str) -> "nn.Module | None":
    """model_arguments' checks, the constructor's own and a forward pass of the dataset's image shape on the
    meta device, so that a sweep refuses such a job before its first job runs. Returns the network on the
    meta device, or None where its constructor cannot build it there (the job then judges it)."""
    import torch

    try:
        net, size = meta_network(model_cfg, data_name)
    except ConfigError:
        raise
    except ValueError as e:  # a value the model refuses, named in its message (build_model says the same)
        raise ConfigError(str(e)) from e
    except Exception:
        return None
    info = INFO[data_name]
    try:
        net.eval()
        with torch.no_grad():
            net(torch.zeros(2, info.channels, size, size, device="meta"))
    except Exception:
        # a shape that does not fit, or what meta tensors cannot do (.item()): built and run on the CPU as the
        # job will, which raises the job's line, with torch's random numbers left as they were
        from psgd.run import build_model

        with torch.random.fork_rng(devices=[]):
            build_model(model_cfg, data_name)
    return net


def sparse_gradient_modules(net: "nn.Module") -> list[str]:
    """`net`'s modules that make sparse gradients (nn.Embedding / nn.EmbeddingBag with sparse=True), by name."""
    import torch

    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return [
        f"{name or 'network'} ({type(m).__name__}, sparse=True)"
        for name, m in net.named_modules()
        if isinstance(m, kinds) and m.sparse
    ]


def check_sparse_gradients(opt: DictConfig, model_name: str | None, module: str) -> None:
    """An optimizer that refuses the sparse gradients `module` makes, at the first step in every worker:
    Adam and NovoGrad whatever their settings, SGD's fused update. torch's per-tensor SGD takes them."""
    import torch
    import torch_optimizer

    target = opt.get("_target_")
    cls = locate("optimizer._target_", target)
    if isinstance(cls, type) and issubclass(cls, (torch.optim.Adam, torch_optimizer.NovoGrad)):  # AdamW too
        raise ConfigError(
            f"optimizer._target_={target} is invalid with model={model_name}: its {module} makes sparse "
            f"gradients, which {cls.__name__} refuses; {SPARSE_GRADIENTS_WAY_OUT}"
        )
    if opt.get("fused"):
        raise ConfigError(
            f"optimizer.fused=true is invalid with model={model_name}: its {module} makes sparse "
            "gradients, which the fused update refuses; set optimizer.fused=false"
        )


def check_optimizer(opt: DictConfig) -> None:
    """The optimizer built once on a stand-in parameter, so that a value its constructor refuses is one line
    naming the settings before anything starts. Its switches take only true or false, its numbers no
    true; a key it has no argument for is named with what it takes."""
    import torch
    from hydra.utils import instantiate

    cls = locate("optimizer._target_", opt.get("_target_"))
    settings = {str(k): v for k, v in opt.items() if not str(k).startswith("_")}
    takes, foreign = _foreign(cls, settings, ("params",))
    defaults = {k: p.default for k, p in inspect.signature(cls).parameters.items()} if takes else {}
    for key, value in settings.items():
        default = defaults.get(key)
        number = isinstance(default, int | float) and not isinstance(default, bool)
        if isinstance(value, bool) and number:  # Python's bool is an int: eps=true would run as eps=1
            raise ConfigError(f"optimizer.{key}={value} is invalid: must be a number (the default is {default})")
        # a switch (torch's fused and foreach default to None: its own choice)
        switch = isinstance(default, bool) or (key in ("fused", "foreach") and value is not None)
        if switch and not isinstance(value, bool):
            shown = "null" if value is None else repr(value)
            raise ConfigError(f"optimizer.{key}={shown} is invalid: must be true or false")
    if foreign:  # often a preset's setting for another optimizer
        said = " and ".join(f"optimizer.{k}={opt[k]}" for k in foreign)
        drop = "it" if len(foreign) == 1 else "them"
        raise ConfigError(
            f"{said} {'is not a setting' if len(foreign) == 1 else 'are not settings'} of "
            f"{opt.get('_target_')} (it takes: {', '.join(takes)}); leave {drop} out (where a preset set "
            f"{drop} for another optimizer, drop {drop} with {' '.join(f'~optimizer.{k}' for k in foreign)})"
        )
    try:
        instantiate(opt, _convert_="all")([torch.zeros(1, requires_grad=True)])  # as run.py makes it
    except Exception as e:
        said = " ".join(f"{k}={v}" for k, v in settings.items())
        reason = text_lines(e.__cause__ or e)[-1]
        raise ConfigError(
            f"optimizer settings are invalid: {opt.get('_target_')} refuses them ({reason}); the settings were: {said}"
        ) from e


def check_targets(cfg: DictConfig) -> None:
    """The model and the optimizer a config names, and the pair (sparse gradients)."""
    net = check_model(cfg.model, cfg.data.name)
    check_optimizer(cfg.optimizer)
    if net is not None and (sparse := sparse_gradient_modules(net)):
        check_sparse_gradients(cfg.optimizer, cfg.model.get("name"), sparse[0])
