"""The documentation (README.md and docs/) tells the truth: its commands run, its error examples are what psgd
prints, and its links lead somewhere."""

import os
import re
import shlex
from pathlib import Path

import pytest
from conftest import CONF, ROOT
from integration.helpers import documentation, documentation_files

from psgd.command_line import command_line_problem


def documented_commands() -> list[list[str]]:
    """Every `python train.py ...` / `python sweep.py ...` the documentation and the config files' comments
    show, but those with placeholders."""
    commands = []
    for doc in [*documentation_files(), *sorted(CONF.rglob("*.yaml"))]:
        for found in re.finditer(r"(?<!\$ )python (train|sweep)\.py\b([^#`|>&\n]*)", doc.read_text()):
            if not re.search(r"<|\.\.\.|--cfg", found.group(2)):  # "$ python ...": an error example
                commands.append([found.group(1), *shlex.split(found.group(2))])
    return commands


def test_every_documented_command_passes(capsys):
    """Every train.py command composes and passes; every sweep.py command parses. (Each job of every
    sweep is composed and checked by the slow test below.)"""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from psgd.config import checked_runs

    commands = documented_commands()
    assert commands, "no python train.py / sweep.py command found in the documentation"
    for script, *argv in commands:
        if script == "train":
            assert command_line_problem(script, argv, CONF) is None, f"python {script}.py {' '.join(argv)}"
            # and warns of nothing: a documented example whose setting changes nothing (scheduler=warmup on one
            # worker, a constant lr) shows the reader what does not happen
            assert command_line_problem(script, argv, CONF, job_check=lambda jobs: checked_runs(jobs, True)[0]) is None
            assert capsys.readouterr().err == "", f"python {script}.py {' '.join(argv)}"
        else:
            OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")])  # flags: Hydra's


@pytest.mark.slow  # every documented sweep's jobs are composed and checked
def test_every_documented_sweep_passes_psgds_value_checks(tmp_path, monkeypatch, capsys):
    import torch

    from psgd.config import checked_runs, sweep_values_problem

    (tmp_path / "srun").write_text("#!/bin/sh\n")  # the SLURM sweeps, as on a SLURM login node
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    sweeps = [argv for script, *argv in documented_commands() if script == "sweep"]
    assert sweeps, "no python sweep.py command found in the documentation"
    for argv in sweeps:
        if "trainer.accelerator=gpu" in argv and not torch.cuda.is_available():
            continue
        assert command_line_problem("sweep", argv, CONF, job_check=sweep_values_problem) is None, " ".join(argv)
        assert command_line_problem("sweep", argv, CONF, job_check=lambda jobs: checked_runs(jobs, True)[0]) is None
        assert capsys.readouterr().err == "", " ".join(argv)  # no setting of it changes nothing


def test_the_documented_mistyped_examples_show_what_the_check_prints():
    """Each `$ python train.py ...` example followed by a `psgd: error: ...` line is what the command-line check
    prints for it (the examples it does not catch are psgd's later config checks: tests/integration/
    test_cli_errors.py)."""
    examples = re.findall(r"^\$ python (train|sweep)\.py (.*)\npsgd: error: (.*)$", documentation(), re.MULTILINE)
    checked = 0
    for script, args, shown in examples:
        problem = command_line_problem(script, shlex.split(args), CONF)
        if problem is not None:
            assert problem.startswith(shown.removesuffix("...")), (args, problem)
            checked += 1
    assert checked, "no '$ python train.py ...' example of a command-line error found in the documentation"


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    """The anchors of a markdown file's headings (a repeated heading's second anchor ends in -1, and so on)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", without_fences(markdown.read_text()), re.MULTILINE):
        anchor = github_anchor(heading)
        found.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
        seen[anchor] = seen.get(anchor, 0) + 1
    return found


def without_fences(text: str) -> str:
    """Markdown text without its fenced code blocks, where a heading or a link is not one."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def without_code(text: str) -> str:
    """Markdown text without its fenced code blocks and inline code, where a link is not a link."""
    return re.sub(r"`[^`\n]*`", "", without_fences(text))


def relative_links(markdown: Path) -> list[str]:
    """The targets of a markdown file's inline links and images that point into the repository."""
    targets = re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", without_code(markdown.read_text()))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: ...


def broken_links(markdown: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of `markdown` whose file, or heading, is missing, as '<file>: <target> (why)'."""
    broken = []
    for target in relative_links(markdown):
        path, _, anchor = target.partition("#")
        linked = (markdown.parent / path).resolve() if path else markdown
        if not linked.exists():
            broken.append(f"{markdown.relative_to(root)}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{markdown.relative_to(root)}: {target} (no heading #{anchor} in {linked.name})")
    return broken


def test_every_relative_link_in_the_documentation_resolves():
    """A link in README.md or docs/ (its sweep reports included) names a file that exists, and a heading of it
    where it names one."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert [broken for markdown in files for broken in broken_links(markdown)] == []


def test_a_broken_link_is_named(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, with `code`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading-with-code) [web](https://example.org) `[code](nowhere.md)`\n"
        "[gone](nowhere.md) [no anchor](there.md#elsewhere) ![img](missing.png)\n```\n[fenced](nowhere.md)\n```\n"
    )
    assert broken_links(page, tmp_path) == [
        "page.md: nowhere.md (no such file)",
        "page.md: there.md#elsewhere (no heading #elsewhere in there.md)",
        "page.md: missing.png (no such file)",
    ]


def test_the_readme_sets_a_laptop_up_without_cuda_and_starts_with_a_short_run():
    """pip's default torch brings CUDA (a 5.7 GB environment): the README gives torch's CPU index too, and a first
    run of one epoch before the default's eight."""
    setup = (ROOT / "README.md").read_text().split("## Setup", 1)[1].split("\n## ", 1)[0]
    assert "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu" in setup
    assert "python train.py trainer.max_epochs=1" in setup
