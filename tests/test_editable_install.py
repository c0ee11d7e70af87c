"""README's install, ``pip install -e .``, is one type checkers can follow.

setuptools' default editable install of a flat layout is an import hook (a meta path finder), which
mypy and pyright cannot follow: ``import syncreward`` in user code is ``import-not-found``. With the
package directory declared in pyproject.toml, the editable wheel is a plain path entry (a ``.pth``
holding the checkout's directory), as ``--config-settings editable_mode=compat`` would make it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_an_editable_install_is_a_path_entry_type_checkers_can_follow(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", minversion="77")  # pyproject's build requirement
    src = tmp_path / "checkout"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "syncreward", src / "syncreward", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "wheel"
    proc = subprocess.run(  # the PEP 660 hook pip calls for `pip install -e .`
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_editable({str(out)!r}))"],
        cwd=src, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheel = zipfile.ZipFile(out / proc.stdout.strip().splitlines()[-1])
    pth = [n for n in wheel.namelist() if n.endswith(".pth")]
    assert len(pth) == 1, wheel.namelist()
    entries = wheel.read(pth[0]).decode().split()
    assert entries == [str(src)], f"not a plain path entry (an import hook?): {entries}"
    assert not [n for n in wheel.namelist() if "finder" in n], wheel.namelist()
