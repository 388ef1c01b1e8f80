"""psgd's package shape: importing it changes no global state, and its modules import in layers, without circles.

Layers (docs/architecture.md), each importing only from its own layer or lower ones:
    1 leaves       the package, constants, errors, console output, file writing
    2 the process  signals, the process's settings, torchrun's workers, the fork server
    3 the science  data, models, optimizers, the LightningModule, callbacks, strategies
    4 the run      the configuration (the strategies' contract and config classes among it) and the run
    5 the study    reports and sweeps
    6 what the scripts call (psgd.command_line, psgd.cli; train.py and sweep.py import from any layer)
An import under `if TYPE_CHECKING:` is an annotation's, never run: it is no import here.
"""

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

SRC = ROOT / "src" / "psgd"

# module (or package: it covers the modules inside) -> layer. A module that is not here fails the test: add it.
LAYERS = {
    # 1 leaves: errors, console output, file writing
    "psgd": 1,
    "psgd.choices": 1,
    "psgd.console": 1,
    "psgd.environment": 1,
    "psgd.errors": 1,
    "psgd.io": 1,
    "psgd.overrides": 1,
    # 2 the process: its signals and settings, torchrun's workers, the fork server (which the strategies use)
    "psgd._in_forkserver": 2,
    "psgd.forkserver": 2,
    "psgd.process": 2,
    "psgd.signals": 2,
    "psgd.torchrun": 2,
    # 3 the science: data, models, optimizers, the LightningModule and its callbacks, the strategies
    "psgd.callbacks": 3,
    "psgd.data": 3,
    "psgd.models": 3,
    "psgd.module": 3,
    "psgd.optim": 3,
    "psgd.strategies": 3,
    "psgd.stragglers": 3,
    # 4 the configuration (the strategies' contract and config classes) and the run
    "psgd.config": 4,
    "psgd.outputs": 4,
    "psgd.rendezvous": 4,
    "psgd.resume": 4,
    "psgd.run": 4,
    "psgd.run_checks": 4,
    "psgd.stopped": 4,
    "psgd.summary": 4,
    # 5 the study: reports and sweeps
    "psgd.report": 5,
    "psgd.sweep": 5,
    # 6 what the scripts call
    "psgd.cli": 6,
    "psgd.command_line": 6,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in SRC.rglob("*.py")}


def type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The nodes under an `if TYPE_CHECKING:` block: imports for annotations, never run."""
    blocks = [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test).endswith("TYPE_CHECKING")]
    return {inner for block in blocks for statement in block.body for inner in ast.walk(statement)}


def imported(name: str, path: Path) -> set[str]:
    """The psgd modules that `path` (module `name`) imports anywhere in it, inside functions too (not for
    annotations alone: type_checking_only)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    for node in set(ast.walk(tree)) - type_checking_only(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per dot after the first
                above = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*above, *([node.module] if node.module else [])])
            for alias in node.names:  # `from psgd import signals` imports the module psgd.signals
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


IMPORTS = {name: imported(name, path) for name, path in MODULES.items()}


def layer(name: str) -> int | None:
    while name:
        if name in LAYERS:
            return LAYERS[name]
        name = name.rpartition(".")[0]
    return None


def test_every_module_has_a_layer():
    assert [name for name in sorted(MODULES) if layer(name) is None] == []


def test_no_module_imports_from_a_higher_layer():
    upward = [
        f"{name} (layer {layer(name)}) imports {other} (layer {layer(other)})"
        for name, others in sorted(IMPORTS.items())
        for other in sorted(others)
        if (layer(other) or 0) > (layer(name) or 0)
    ]
    assert upward == []


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_counting_imports_inside_functions():
    graph = {name: set(others) for name, others in IMPORTS.items()}
    assert circles(graph) == []


def test_the_circle_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# psgd modules that import neither torch nor Lightning: the scripts import them first
LIGHT = [
    "psgd",
    "psgd.signals",
    "psgd.torchrun",
    "psgd.forkserver",
    "psgd.process",
    "psgd.choices",
    "psgd.io",
    "psgd.config",
]
# what psgd's modules import that changes global state itself when imported
LIBRARIES = ["torch", "torchvision", "pytorch_lightning", "hydra", "omegaconf", "torch.utils.tensorboard"]

SNAPSHOT = textwrap.dedent(
    """
    import importlib, json, logging, os, signal, sys, warnings

    OOM = "/proc/self/oom_score_adj"

    def state():
        loggers = {"": logging.getLogger(), **logging.root.manager.loggerDict}
        return {
            "warnings": [repr(f) for f in warnings.filters],
            "loggers": {
                name: [logger.level, repr(logger.handlers), repr(logger.filters), logger.disabled, logger.propagate]
                for name, logger in loggers.items()
                if isinstance(logger, logging.Logger)
            },
            "signals": {s.name: repr(signal.getsignal(s)) for s in signal.Signals if s in signal.valid_signals()},
            "oom_score_adj": open(OOM).read() if os.path.exists(OOM) else None,
            "unraisablehook": repr(sys.unraisablehook),
            "excepthook": repr(sys.excepthook),
            "environ": dict(os.environ),
        }

    def imported(names):
        before = state()
        for name in names:
            importlib.import_module(name)
        after = state()
        # a logger a module makes for itself (logging.getLogger(__name__)) is new, not a change
        new = {k for k, v in after["loggers"].items() if k not in before["loggers"] and v[:3] == [0, "[]", "[]"]}
        after["loggers"] = {k: v for k, v in after["loggers"].items() if k not in new}
        return {key: [before[key], after[key]] for key in before if before[key] != after[key]}

    light, libraries, heavy = json.loads(sys.argv[1])
    changes = {"light": imported(light)}
    heavy_before = "torch" in sys.modules
    for name in libraries:
        importlib.import_module(name)
    changes["heavy"] = imported(heavy)
    print(json.dumps({"changes": changes, "light_imported_torch": heavy_before}))
    """
)


@pytest.mark.parametrize("environ", [{}, {"PSGD_QUIET": "1", "PSGD_LAUNCHER_PID": "1"}])
def test_importing_psgd_changes_no_global_state(environ):
    """Warning filters, loggers (levels, handlers, filters), signal handlers, the OOM score, hooks and the
    environment are as before `import psgd` and every psgd module, also where a run's variables are set
    (a worker's environment): what a run needs of its process, the run sets (psgd.process, psgd.signals)."""
    heavy = sorted(MODULES)
    proc = subprocess.run(
        [sys.executable, "-c", SNAPSHOT, json.dumps([LIGHT, LIBRARIES, heavy])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**__import__("os").environ, **environ},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["changes"] == {"light": {}, "heavy": {}}
    assert not result["light_imported_torch"]
