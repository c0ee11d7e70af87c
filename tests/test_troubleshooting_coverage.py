"""Every message syncreward can raise has an entry in docs/troubleshooting.md.

The messages are read from the source, not listed by hand: every ``raise SomeError(<message>)`` in
``syncreward/`` (and every row of the backends' failure tables) gives a *site*, its exception type and
the fixed words of its message -- the string pieces between the f-string's ``{...}`` fields, followed
into the helper that builds the message where the raise calls one (``timeout_message(...)``,
``self._misfit(e)``, ``problem = _array_problem(a)``). A site is covered when a section of the page
whose heading names the exception type quotes one of those pieces (three words or more, before
``HINT:``) verbatim. So a new message, or a reworded one whose words no entry quotes any more, fails
here, naming the file, line, type and words -- add (or update) its entry.

Two kinds of site are exempt, each for a stated reason: ``CodecError`` (one entry covers every way a
payload can be corrupt or hostile: the words name the byte that is wrong, the fix is the same), and the
sites in ``NOT_USER_MESSAGES`` below.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import syncreward

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "syncreward"
PAGE = ROOT / "docs" / "troubleshooting.md"

ERROR_TYPES = {*syncreward.__all__, "TypeError", "ValueError", "ImportError", "RanksFailed"} - {
    "synced_reward",
    "synced_rewards",
}
TYPE_LEVEL = {"CodecError": "every corrupt or hostile payload: one cause, one entry"}
NOT_USER_MESSAGES = {  # (file, enclosing function, type): why the site needs no entry of its own
    ("_codec.py", "encode_frame", "ValueError"): "an internal caller's bug (frames are aligned by syncreward)",
    ("_call.py", "open_call", "MismatchError"): "re-raises a message the session built (its entries cover it)",
    ("_demo.py", "run_demo", "ValueError"): "the demo's command line (`python -m syncreward demo --help`)",
    ("_lifecycle.py", "call_async", "MismatchError"): "re-raises the session's message for ambiguous async calls",
    ("_modes/__init__.py", "register", "ValueError"): "a mode author's registration (a private seam), not a call's",
    ("testing.py", "exchange", "CommunicationError"): (
        "the test double repeats a failure of another thread-rank; run_threads reports it under RanksFailed"
    ),
    ("testing.py", "receive", "CommunicationError"): (
        "the test double's point-to-point receive repeats a failure of another thread-rank, as exchange does"
    ),
}
_FIELD = re.compile(r"\{[^{}]*\}")


@dataclass
class Site:
    where: str
    function: str
    type: str
    pieces: list[str]

    def key(self) -> tuple[str, str, str]:
        return (self.where.split(":")[0], self.function, self.type)


def _docstrings(node: ast.AST) -> set[int]:
    """The ids of the docstring nodes in ``node`` (they are not message text)."""
    out = set()
    for sub in ast.walk(node):
        body = getattr(sub, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.add(id(value))
    return out


def _strings(node: ast.AST) -> list[str]:
    """The string literals in ``node``, docstrings left out."""
    skip = _docstrings(node)
    return [
        sub.value
        for sub in ast.walk(node)
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and id(sub) not in skip
    ]


class _Index:
    """Every function of the package by name, to follow a message into the helper that builds it."""

    def __init__(self, trees: dict[str, ast.Module]) -> None:
        self.functions: dict[str, list[ast.AST]] = {}
        for tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.functions.setdefault(node.name, []).append(node)

    def pieces(self, expr: ast.AST, scope: ast.AST | None, depth: int = 0) -> list[str]:
        out: list[str] = []
        for text in _strings(expr):
            out.extend(_FIELD.split(text))
            if depth <= 2:  # a template field naming a helper (ray's "{timeout_message}"): its words
                for field in _FIELD.findall(text):
                    for fn in self.functions.get(field.strip("{}").split("!")[0].split(":")[0], []):
                        out.extend(self.pieces(fn, fn, depth + 1))
        if depth > 2:
            return out
        for sub in ast.walk(expr):
            if isinstance(sub, ast.Call):
                name = sub.func.attr if isinstance(sub.func, ast.Attribute) else getattr(sub.func, "id", None)
                for fn in self.functions.get(name or "", []):
                    out.extend(self.pieces(fn, fn, depth + 1))
            elif isinstance(sub, ast.Name) and scope is not None:
                for node in ast.walk(scope):
                    if isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == sub.id for t in node.targets
                    ):
                        out.extend(self.pieces(node.value, scope, depth + 1))
        return out


def _type_name(node: ast.AST) -> str | None:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name if name in ERROR_TYPES else None


def _enclosing(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def _sites() -> list[Site]:
    trees = {str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}
    index = _Index(trees)
    sites: list[Site] = []
    for path, tree in trees.items():
        parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node

        for node in ast.walk(tree):
            kind, message = None, None
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                kind = _type_name(node.exc.func)
                message = node.exc.args[0] if node.exc.args else None
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_Failure" and len(node.args) == 4:
                kind, message = _type_name(node.args[2]), node.args[3]  # torch_distributed's failure table
            elif (
                isinstance(node, ast.Tuple)
                and len(node.elts) == 3
                and isinstance(node.elts[2], (ast.Constant, ast.JoinedStr, ast.BinOp))
            ):
                kind, message = _type_name(node.elts[0]), node.elts[2]  # ray's failure table (type, words, message)
            if kind is None or message is None:
                continue
            scope = _enclosing(node, parents)
            pieces = index.pieces(message, scope)
            sites.append(Site(f"{path}:{node.lineno}", getattr(scope, "name", "<module>"), kind, pieces))
    return sites


def _normal(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def _usable(pieces: list[str]) -> list[str]:
    """The pieces worth quoting: three words or more before ``HINT:`` (two, where a message has no longer).

    An entry quotes the start of a long piece: its first six words are enough. The torch backend's abort
    records start with a one-letter tag (``F``: a transport failed) that the message does not show.
    """
    words = [re.sub(r"^[FT](?=[a-z])", "", _normal(piece.split("HINT:")[0])).strip(" .:;,(") for piece in pieces]
    for least in (3, 2):
        out = [" ".join(w.split()[:6]) for w in words if len(w.split()) >= least]
        if out:
            return out
    return []


def _sections() -> list[tuple[str, str]]:
    """The page's ``###`` sections as (heading, heading and body), whitespace and backticks normalised."""
    parts = re.split(r"^### ", PAGE.read_text(), flags=re.M)[1:]
    return [(_normal(p.splitlines()[0]), _normal(p)) for p in parts]


def test_troubleshooting_coverage_finds_the_messages() -> None:
    # the collector itself: it must see the messages this page is about (not silently find nothing)
    sites = _sites()
    assert len(sites) > 100
    found = {s.type for s in sites}
    assert {"InputError", "MismatchError", "SyncTimeoutError", "BackendError", "CommunicationError"} <= found
    assert any("did not arrive within timeout=" in p for s in sites for p in s.pieces), "helpers not followed"
    assert any("is not a per-sample argument of this call" in p for s in sites for p in s.pieces)


def test_troubleshooting_coverage_every_message_has_an_entry() -> None:
    sections = _sections()
    missing = []
    for site in _sites():
        if site.type in TYPE_LEVEL or site.key() in NOT_USER_MESSAGES:
            continue
        pieces = _usable(site.pieces)
        typed = [body for heading, body in sections if re.search(rf"\b{site.type}\b", heading)]
        if not pieces:
            missing.append(f"{site.where} ({site.function}) raises {site.type} with no fixed words to quote")
        elif not any(p in body for p in pieces for body in typed):
            missing.append(f"{site.where} ({site.function}) {site.type}: {pieces[0]!r}")
    assert not missing, (
        f"{len(missing)} message(s) lack an entry in docs/troubleshooting.md (a `### `{{Type}}: ...`` section "
        "quoting one of the message's fixed phrases):\n" + "\n".join(missing)
    )


def test_troubleshooting_coverage_type_level_entries_exist() -> None:
    headings = [heading for heading, _ in _sections()]
    for kind in TYPE_LEVEL:
        assert any(re.search(rf"\b{kind}\b", h) for h in headings), kind
