"""A mode says who scores what and who gets which rows; it moves nothing by hand (docs/internals.md).

So no mode file imports the codec (frame layouts) or the wire arithmetic (status rows, result blocks):
its transfers go through ``_transfers`` and ``_exchange``, its data through ``_batch``; and the call's
record (``_call``) calls none of them. No ranks needed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import syncreward

MODES_DIR = Path(syncreward.__file__).parent / "_modes"


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_mode_files_import_neither_the_codec_nor_the_wire() -> None:
    files = sorted(MODES_DIR.glob("*.py"))
    assert {p.name for p in files} >= {"main.py", "replicate.py", "shard.py", "group.py", "_base.py"}
    found = {p.name: sorted(m for m in _imported(p) if m.rsplit(".", 1)[-1] in ("_codec", "_wire")) for p in files}
    assert {name: mods for name, mods in found.items() if mods} == {}


def test_mode_files_catch_no_exception_themselves() -> None:
    """A mode's local work runs through ``_outcome.local`` (docs/internals.md, "Writing a mode"): no mode file
    has an ``except`` clause of its own, so no mode can swallow a failure it should send."""
    found = {
        f"{p.name}:{node.lineno}"
        for p in sorted(MODES_DIR.glob("*.py"))
        for node in ast.walk(ast.parse(p.read_text(), str(p)))
        if isinstance(node, ast.ExceptHandler)
    }
    assert found == set()


def test_call_record_imports_neither_the_modes_toolbox_nor_the_transfers() -> None:
    """``_call`` is the call's record only (docs/internals.md, "A call is a record"): what a mode does with a
    call is in ``_transfers``, below the modes, so a call runs one way (lifecycle -> mode -> ``_transfers``
    -> ``_exchange``/``_batch``) and never back from the record into the modes' helpers."""
    package = MODES_DIR.parent
    record = {m.rsplit(".", 1)[-1] for m in _imported(package / "_call.py")}
    assert record & {"_transfers", "_exchange", "_batch", "_modes", "_lifecycle"} == set()
    toolbox = _imported(package / "_transfers.py")
    assert {m.rsplit(".", 1)[-1] for m in toolbox} >= {"_call", "_exchange", "_batch"}
    assert {m for m in toolbox if "_modes" in m or m.endswith(("_lifecycle", "_decorator"))} == set()
