"""The soak's short form: 300 synced calls on 2 ranks leak no file descriptors, threads or process groups.

The full run (``python benchmarks/soak.py``, 10,000 calls) is in docs/reliability.md; this one keeps
the script working and catches a per-call leak, which 300 calls make obvious (300 fds, 300 threads).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "soak.py"


def test_short_soak_leaks_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(SCRIPT), "--calls", "300", "--warmup", "60", "--sample-every", "100", "--json", str(out)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["world_size"] == 2
    for rank in report["ranks"]:
        g = rank["growth"]
        assert rank["calls"] >= 300
        assert rank["errors_seen"] >= 3  # the error path ran too
        assert g["rss_mb"] < 30, g  # loose: the 10,000-call goal is < 20 MB
        assert g["fds"] <= 0, g
        assert g["process_groups"] == 0, g
        assert g["syncreward_links"] == 0, g
        assert g["threads_os"] - g["threads_pool"] <= 0, g
        assert rank["after"]["threads_pool"] <= rank["pool_max_workers"]
