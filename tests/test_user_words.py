"""What users read speaks their words: no internal terms they never learn, or each defined where they meet it.

User pages (README but its contributor Layout, the docs but Internals and the design notes), ``help()`` of
the public API a reward author uses, and the messages raised from the library's core say "call record",
"encoded columns", "inputs" and "results" -- not header, frame or turnstile (words of the wire and the
session, for contributors: docs/internals.md). "Exchange" and "fingerprint" are defined once, on Concepts.
"""

from __future__ import annotations

import ast
import pydoc
import re
from pathlib import Path

import pytest

import syncreward
from syncreward import testing

ROOT = Path(__file__).resolve().parents[1]
USER_PAGES = [
    ROOT / "README.md",
    *(ROOT / "docs" / name for name in ("index.md", "quickstart.md", "concepts.md", "troubleshooting.md", "api.md")),
    *(ROOT / "docs" / name for name in ("reliability.md", "performance.md")),
    *sorted((ROOT / "docs" / "guides").glob("*.md")),
]
INTERNAL = re.compile(r"\b(headers?|frames?|turnstiles?)\b", re.IGNORECASE)
# help() of what a reward author calls; the Backend protocol (for backend authors) defines its own `channel`
AUTHOR_API = [
    syncreward.synced_reward, syncreward.synced_rewards, syncreward.NotSynced, syncreward.SyncedReward,
    testing.run_threads, testing.run_ranks,
    *(getattr(syncreward, n) for n in syncreward.__all__ if n.endswith("Error")),
]  # fmt: skip


def _user_text(page: Path) -> str:
    text = page.read_text()
    if page.name == "README.md":  # its Layout section names the modules, for contributors
        text = re.sub(r"^## Layout\n.*?(?=^## |\Z)", "", text, flags=re.S | re.M)
    return text


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_user_pages_use_no_internal_words(page: Path) -> None:
    found = [line.strip() for line in _user_text(page).splitlines() if INTERNAL.search(line)]
    assert not found, found


def test_user_words_exchange_and_fingerprint_are_defined_on_concepts() -> None:
    concepts = (ROOT / "docs" / "concepts.md").read_text()
    assert re.search(r"two \*exchanges\*: its inputs go to the rank\(s\) that score", concepts)
    assert re.search(r"\*\*fingerprint\*\* \(a hash of", concepts)


@pytest.mark.parametrize("obj", AUTHOR_API, ids=lambda o: o.__name__)
def test_user_words_in_help_of_the_reward_authors_api(obj: object) -> None:
    text = pydoc.render_doc(obj, renderer=pydoc.plaintext)
    words = re.compile(r"\b(exchang\w*|headers?|frames?|turnstiles?|channels?|fingerprint\w*)\b", re.IGNORECASE)
    assert not [line.strip() for line in text.splitlines() if words.search(line)], obj


# raise sites whose words are for someone else
NOT_FOR_USERS = {
    "_modes/shard.py": "an internal consistency check (a lying sample count); reworded when shard.py is free",
    "_codec.py:frames must start": "an internal caller's bug (frames are aligned by syncreward)",
}


def _excused(rel: str, text: str) -> bool:
    return any(key.startswith(f"{rel}:") and text.startswith(key.split(":", 1)[1]) for key in NOT_FOR_USERS)


def test_user_words_in_messages_raised_by_the_core() -> None:
    bad = []
    for path in sorted((ROOT / "syncreward").rglob("*.py")):
        rel = path.relative_to(ROOT / "syncreward").as_posix()
        if rel.startswith("backends/") or rel in NOT_FOR_USERS:  # backends: their authors' words
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                for const in ast.walk(node.exc):
                    text = const.value if isinstance(const, ast.Constant) else None
                    if isinstance(text, str) and INTERNAL.search(text) and not _excused(rel, text):
                        bad.append(f"{rel}:{const.lineno}: {const.value!r}")
    assert not bad, bad
