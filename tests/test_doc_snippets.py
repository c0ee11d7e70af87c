"""The code in README.md and docs/ runs as written.

A fenced ``python`` block runs when the line before it is an HTML comment (invisible when rendered)::

    <!-- runnable: KIND [N] [+previous] [+output] -->

KIND says how:

* ``python``: ``python snippet.py`` in a fresh directory;
* ``pytest``: the block is a test module, run with ``python -m pytest`` (the repository's pytest settings
  do not apply);
* ``torchrun N``: ``torchrun --nproc_per_node N snippet.py`` on CPU ranks (gloo);
* ``accelerate N``: ``accelerate launch --multi_gpu --num_processes N snippet.py`` on CPU (the snippet
  creates ``Accelerator(cpu=True)`` when there is no GPU).

``+previous`` prepends the file's previous ``python`` block (a snippet that uses what the one before it
defines). ``+output``: every line of the first ``text`` block after the snippet must appear in its output
(in any order, and possibly run together: ranks print concurrently). Every run has a deadline; a
launcher and its ranks are killed as a group when it passes. Unmarked blocks (fragments with ``...``,
trainer calls that need a model) are not run; the rule is the marker, not a guess.
"""

from __future__ import annotations

import doctest
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from syncreward.testing import free_port

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"^<!--\s*runnable:\s*(?P<spec>[^>]*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
KINDS = {"python": 0, "pytest": 0, "torchrun": 1, "accelerate": 1}  # how many numbers follow the kind
DEADLINE = {"python": 120, "pytest": 180, "torchrun": 180, "accelerate": 180}


@dataclass
class Snippet:
    path: Path
    line: int  # 1-based line of the marker
    kind: str
    nproc: int
    code: str
    expected: list[str]

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _blocks(lines: list[str]) -> list[tuple[int, str, str]]:
    """(index of the opening fence, language, body) of every fenced block."""
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        out.append((i, m.group(1), "".join(line + "\n" for line in lines[i + 1 : j])))
        i = j + 1
    return out


def parse(path: Path) -> list[Snippet]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = _blocks(lines)
    snippets = []
    for n, line in enumerate(lines):
        m = MARKER.match(line)
        if m is None:
            continue
        where = f"{path.relative_to(ROOT)}:{n + 1}"
        words = m.group("spec").replace(",", " ").split()
        kind, flags = words[0], {w for w in words[1:] if w.startswith("+")}
        numbers = [w for w in words[1:] if not w.startswith("+")]
        if kind not in KINDS or len(numbers) != KINDS[kind] or not all(x.isdigit() for x in numbers):
            raise ValueError(f"{where}: bad marker {line.strip()!r}; see tests/test_doc_snippets.py")
        if flags - {"+previous", "+output"}:
            raise ValueError(f"{where}: unknown flag(s) {sorted(flags - {'+previous', '+output'})}")
        index = next((k for k, b in enumerate(blocks) if b[0] == n + 1), None)
        if index is None or blocks[index][1] != "python":
            raise ValueError(f"{where}: a runnable marker must be followed directly by a ```python block")
        code = blocks[index][2]
        if "+previous" in flags:
            previous = [b for b in blocks[:index] if b[1] == "python"]
            if not previous:
                raise ValueError(f"{where}: +previous, but there is no earlier python block")
            code = previous[-1][2] + "\n\n" + code
        expected: list[str] = []
        if "+output" in flags:
            text = next((b for b in blocks[index + 1 :] if b[1] == "text"), None)
            if text is None:
                raise ValueError(f"{where}: +output, but no ```text block follows")
            expected = [x.strip() for x in text[2].splitlines() if x.strip()]
        snippets.append(Snippet(path, n + 1, kind, int(numbers[0]) if numbers else 1, code, expected))
    return snippets


SNIPPETS = [s for path in SOURCES for s in parse(path)]


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")
        and not k.startswith(("MASTER_", "ACCELERATE_", "TORCHELASTIC_", "PYTEST_"))
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _command(snippet: Snippet, script: Path) -> list[str]:
    if snippet.kind == "python":
        return [sys.executable, str(script)]
    if snippet.kind == "pytest":
        return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
                "--rootdir", str(script.parent), str(script)]  # fmt: skip
    if snippet.kind == "torchrun":
        return [str(BIN / "torchrun"), "--nproc_per_node", str(snippet.nproc), "--nnodes", "1",
                "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script)]  # fmt: skip
    return [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", str(snippet.nproc),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port()), str(script)]  # fmt: skip


def _run(cmd: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its ranks
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout}s:\n{out[-4000:]}")
    return proc.returncode, out


@pytest.mark.parametrize(
    "snippet",
    [
        pytest.param(s, id=s.id, marks=[pytest.mark.multiprocess] if s.kind in ("torchrun", "accelerate") else [])
        for s in SNIPPETS
    ],
)
def test_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    if snippet.kind == "accelerate":
        pytest.importorskip("accelerate")
    name = "test_snippet.py" if snippet.kind == "pytest" else "snippet.py"
    script = tmp_path / name
    script.write_text(snippet.code, encoding="utf-8")
    rc, out = _run(_command(snippet, script), tmp_path, DEADLINE[snippet.kind])
    assert rc == 0, f"{snippet.id} ({snippet.kind}) exited with {rc}:\n{out[-4000:]}"
    # Substrings, not whole lines: ranks print concurrently, and a rank's newline may land after another
    # rank's text (print writes the text and its end separately), but each text is written in one piece.
    missing = [line for line in snippet.expected if line not in out]
    assert not missing, f"{snippet.id}: documented output lines not printed: {missing}\n--- output:\n{out[-4000:]}"


def test_the_guides_are_runnable() -> None:
    """The launcher guides are complete programs (they once called an undefined generate_my_slice)."""
    kinds = {(s.path.relative_to(ROOT).as_posix(), s.kind) for s in SNIPPETS}
    assert ("docs/guides/torchrun.md", "torchrun") in kinds
    assert ("docs/guides/accelerate.md", "accelerate") in kinds
    assert ("docs/quickstart.md", "pytest") in kinds


def test_marker_parsing(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable: torchrun 3 +output -->\n```python\nprint('a')\n```\n\n```text\na\n```\n")
    (s,) = parse_relative(page)
    assert (s.kind, s.nproc, s.code, s.expected) == ("torchrun", 3, "print('a')\n", ["a"])
    page.write_text("<!-- runnable: torchrun -->\n```python\nx\n```\n")
    with pytest.raises(ValueError, match="bad marker"):
        parse_relative(page)
    page.write_text("<!-- runnable: python -->\n\n```python\nx\n```\n")
    with pytest.raises(ValueError, match="followed directly"):
        parse_relative(page)


def parse_relative(page: Path) -> list[Snippet]:
    global ROOT
    saved, ROOT = ROOT, page.parent  # parse() names snippets relative to ROOT
    try:
        return parse(page)
    finally:
        ROOT = saved


@pytest.mark.parametrize("module", ["syncreward", "syncreward._decorator"])
def test_docstring_examples(module: str) -> None:
    """The ``>>>`` examples in the public docstrings (``help(syncreward)``, the API reference) pass."""
    import importlib

    failed, attempted = doctest.testmod(importlib.import_module(module), verbose=False)
    assert attempted > 0
    assert failed == 0


def test_help_shows_no_cross_reference_syntax() -> None:
    """``help()`` prints docstrings raw: mkdocs' ``[`X`][syncreward.X]`` links would show as they are typed."""
    import syncreward

    shown = {"syncreward": syncreward.__doc__ or ""}
    shown.update({name: getattr(syncreward, name).__doc__ or "" for name in ("synced_reward", "synced_rewards")})
    bad = {name: re.findall(r"\[[^\]]*\]\[[\w.]+\]", doc) for name, doc in shown.items()}
    assert not {name: found for name, found in bad.items() if found}
