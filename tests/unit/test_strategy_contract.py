"""A strategy's identity stays in its own files: outside src/psgd/strategies/ no module compares a strategy's name
(the run, its checks, the fork server, resume and the report ask the strategy's config class, the contract of
psgd.strategies.contract), and the run's modules read the typed config, whose defaults are the YAML's, never a
`.get(key, default)` that would repeat one. Every strategy is a name Lightning knows."""

import ast
from pathlib import Path

import pytest
from conftest import ROOT, compose_cfg

from psgd.config import BUILTIN, check_values
from psgd.config.schema import Run
from psgd.strategies.contract import REGISTRY, StrategyConfig

SRC = ROOT / "src" / "psgd"
NAMES = set(REGISTRY)  # every strategy psgd registers (psgd.config imports their config classes)
# the modules that read a run's config
RUN_MODULES = ["run.py", "resume.py", "run_checks.py", "summary.py", "callbacks.py", "forkserver.py", "config"]


def outside_the_strategies() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if "strategies" not in p.relative_to(SRC).parts]


def name_tests(path: Path) -> list[str]:
    """Where `path` compares a string literal naming a registered strategy (==, !=, in, not in) or matches one
    (a case pattern)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            literals = [c for part in (node.left, *node.comparators) for c in ast.walk(part)]
        elif isinstance(node, ast.MatchValue):
            literals = [node.value]
        else:
            continue
        if any(isinstance(c, ast.Constant) and c.value in NAMES for c in literals):
            found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_the_strategies_compares_a_strategys_name():
    assert {"ddp", "model_averaging", "diloco", "elastic_averaging", "hogwild"} <= NAMES
    assert [hit for path in outside_the_strategies() for hit in name_tests(path)] == []


def test_the_name_check_finds_a_comparison(tmp_path):
    code = tmp_path / "x.py"
    code.write_text('if cfg.strategy.name in ("ddp", "x"):\n    pass\nmatch s:\n    case "hogwild":\n        pass\n')
    assert [hit.split(": ", 1)[1] for hit in name_tests_of(code)] == [
        "cfg.strategy.name in ('ddp', 'x')",
        "'hogwild'",
    ]


def name_tests_of(path: Path) -> list[str]:
    """name_tests for a file outside the package."""
    global SRC
    was, SRC = SRC, path.parent
    try:
        return name_tests(path)
    finally:
        SRC = was


def schema_keys() -> set[str]:
    """Every key the schema declares, at any depth, the builtin strategies' own among them."""
    keys: set[str] = set()

    def walk(model) -> None:
        for name, field in model.model_fields.items():
            keys.add(field.alias or name)
            if isinstance(field.annotation, type) and issubclass(field.annotation, StrategyConfig | Run.__base__):
                walk(field.annotation)

    for model in (Run, *BUILTIN):
        walk(model)
    return keys


def defaulted_gets(path: Path, keys: set[str]) -> list[str]:
    """Where `path` calls `.get("<key>", <default>)` for one of `keys`."""
    return [
        f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and len(node.args) + len(node.keywords) >= 2
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value in keys
    ]


def test_the_run_reads_no_schema_key_with_a_default_of_its_own():
    keys = schema_keys()
    assert {"partition", "compression", "period", "quiet", "limit_test_batches"} <= keys
    paths = [p for m in RUN_MODULES for p in ([SRC / m] if m.endswith(".py") else sorted((SRC / m).rglob("*.py")))]
    assert [hit for path in paths for hit in defaulted_gets(path, keys)] == []


def test_every_strategy_is_a_name_lightning_knows():
    import pytorch_lightning as L
    from pytorch_lightning.strategies import StrategyRegistry

    import psgd.strategies.registry  # noqa: F401  registers psgd's

    for cls in BUILTIN:
        name = cls.declared_name()
        assert name in StrategyRegistry or name == "ddp", name  # ddp is Lightning's own
    trainer = L.Trainer(strategy="diloco", accelerator="cpu", devices=2, logger=False, enable_progress_bar=False)
    assert (trainer.strategy.period, trainer.strategy.outer_factory.keywords) == (
        64,
        {"lr": 0.7, "momentum": 0.9, "nesterov": True},
    )


@pytest.mark.parametrize(
    "overrides",
    [("strategy=diloco",), ("strategy=model_averaging",), ("strategy=elastic_averaging",), ("strategy=hogwild",)],
)
def test_a_preset_strategy_keeps_its_own_name(overrides):
    """DiLoCo (model averaging's preset) is recorded, named and grouped as diloco."""
    name = overrides[0].split("=")[1]
    strategy = check_values(compose_cfg(*overrides)).strategy
    assert strategy.name == name and type(strategy) is REGISTRY[name]


def overrides_without_the_mark(module_names: list[str]) -> list[str]:
    """The methods of the classes defined in `module_names` that override a base class's method without
    typing_extensions.override's mark (dunder methods aside)."""
    import importlib
    import inspect

    missing = []
    for module_name in module_names:
        module = importlib.import_module(module_name)
        for cls in vars(module).values():
            if not (inspect.isclass(cls) and cls.__module__ == module_name):
                continue
            for name, member in vars(cls).items():
                function = getattr(member, "__func__", None) or getattr(member, "fget", None) or member
                if name.startswith("__") or not callable(function):
                    continue
                overridden = any(name in vars(base) for base in cls.__mro__[1:] if base is not object)
                if overridden and not getattr(function, "__override__", False):
                    missing.append(f"{cls.__name__}.{name}")
    return missing


def test_every_override_in_the_strategies_is_marked():
    import pkgutil

    import psgd.strategies

    names = [f"psgd.strategies.{m.name}" for m in pkgutil.iter_modules(psgd.strategies.__path__)]
    assert len(names) >= 10 and overrides_without_the_mark(names) == []
