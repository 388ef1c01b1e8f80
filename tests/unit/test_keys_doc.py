"""docs/configuration.md's table of every key is what `python train.py --help` lists (psgd.config.describe), so
that the documentation and --help come from the same declarations (the schema and the strategies' config
classes). `PSGD_UPDATE_DOCS=1 pytest tests/unit/test_keys_doc.py` rewrites the table after a key changes."""

import os

from conftest import ROOT

from psgd.config import describe

DOC = ROOT / "docs" / "configuration.md"
BEGIN, END = "<!-- keys: begin (tests/unit/test_keys_doc.py) -->", "<!-- keys: end -->"


def keys_table() -> str:
    rows = ["| key | takes | meaning |", "|---|---|---|"]
    for key, allowed, meaning in describe():
        cell = " ".join(meaning.split()).replace("|", "\\|")
        rows.append(f"| `{key}` | {allowed.replace('|', chr(92) + '|')} | {cell} |")
    return "\n".join([BEGIN, *rows, END])


def test_the_documented_keys_are_the_ones_help_lists():
    text = DOC.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    if os.environ.get("PSGD_UPDATE_DOCS"):
        DOC.write_text(text[:start] + keys_table() + text[end:])
        text = DOC.read_text()
        start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == keys_table()
