"""README's Quickstart blocks each do all of their own set-up, as .ci/run extracts and runs them.

.ci/run runs the second block exactly as written, in a checkout, after creating .venv and installing CPU
torch itself; a newcomer pastes either block alone on a fresh machine. So each block clones unless it
is already in a checkout, makes and activates its venv, installs CPU torch before anything that could
pull PyPI's CUDA build, then installs and runs. (Verified by hand for this change: each block alone in a
fresh venv installed torch 2.13.0+cpu; the demo block ran to its end, the test block's pytest started.)
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLONE = "[ -f pyproject.toml ] || { git clone https://github.com/syncreward/syncreward && cd syncreward; }"
VENV = "python3 -m venv .venv && . .venv/bin/activate"
TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"


def _blocks() -> list[str]:
    """The Quickstart's bash blocks, found as .ci/run finds them."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Quickstart\n(.*?)(?=^## )", text, re.S | re.M)
    assert section is not None
    return re.findall(r"```bash\n(.*?)```", section.group(1), re.S)


def _commands(block: str) -> list[str]:
    return [line.split("   #")[0].strip() for line in block.splitlines() if line.strip()]


def test_quickstart_has_the_two_blocks_ci_runs() -> None:
    assert len(_blocks()) == 2
    assert "blocks[1]" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize(("index", "install", "run"), [
    (0, "pip install -e .", "python -m syncreward demo"),
    (1, 'pip install -e ".[test]"', "python -m pytest -q"),
])  # fmt: skip
def test_quickstart_block_does_its_own_setup(index: int, install: str, run: str) -> None:
    assert _commands(_blocks()[index]) == [CLONE, VENV, TORCH, install, run]


def test_quickstart_clone_line_skips_the_clone_in_a_checkout(tmp_path: Path) -> None:
    # in a checkout (CI, or a newcomer who cloned first) the first line does nothing; elsewhere it clones
    env = {**os.environ, "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": f"url.{ROOT}.insteadOf",
           "GIT_CONFIG_VALUE_0": "https://github.com/syncreward/syncreward"}  # fmt: skip
    inside = subprocess.run(["bash", "-c", f"{CLONE} && pwd"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.strip() == str(ROOT)
    assert not (ROOT / "syncreward" / "syncreward").exists()
    fresh = subprocess.run(
        ["bash", "-c", f"{CLONE} && pwd && test -f pyproject.toml"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.strip() == str(tmp_path / "syncreward")


def test_quickstart_page_install_block_skips_the_clone_in_a_checkout() -> None:
    """docs/quickstart.md's install block starts as README's blocks do: no clone inside a checkout."""
    text = (ROOT / "docs" / "quickstart.md").read_text()
    section = re.search(r"^## Install\n(.*?)(?=^## )", text, re.S | re.M)
    assert section is not None
    install = re.findall(r"```bash\n(.*?)```", section.group(1), re.S)[0]
    assert _commands(install)[:3] == [CLONE, VENV, TORCH]
    assert "pip install -e ." in _commands(install)
