"""A rank is a fresh process whichever way it starts: what it sees of this process, and what it leaves behind.

What a spawned rank gets by starting its own interpreter, a rank forked from the fork server must get too (the
parent's time zone, temporary directory, locale, sys.path, atexit handlers at its exit): those cases run forked.
The cases where run_ranks itself was at fault (a hang, the parent's environment, standard output) run with both
start methods. Found by an adversarial pass; each failed on the code before the fix.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from syncreward.testing import RanksFailed, run_ranks

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(sys.platform != "linux", reason="the fork server is used on Linux only"),
]
METHODS = ["spawn", "forkserver"]
# what a spawned rank gets by starting its own interpreter (a spawned rank passed these before the fork server came)
FORKED = ["forkserver"]
ROOT = Path(__file__).resolve().parents[1]


def _tz(rank: int, world_size: int) -> tuple[str, ...]:
    return (*time.tzname, time.strftime("%Z", time.localtime(0)))


def _tmpdir(rank: int, world_size: int) -> str:
    return tempfile.gettempdir()


def _locale(rank: int, world_size: int) -> tuple[str, int]:
    import locale

    return locale.setlocale(locale.LC_CTYPE), sys.flags.utf8_mode


def _env_value(rank: int, world_size: int) -> str | None:
    return os.environ.get("ADV_VALUE")


def _atexit(rank: int, world_size: int, path: str) -> int:
    atexit.register(lambda: Path(path, f"atexit{rank}").write_text("ran"))
    return rank


def _killed_while_posting(rank: int, world_size: int) -> bytes:
    import syncreward.testing as testing

    def post(log_path: str, outcome: object) -> None:  # half the result written, then the OOM killer
        with open(log_path + ".result.part", "wb") as f:
            f.write(b"x" * (1 << 20))
        os.kill(os.getpid(), signal.SIGKILL)

    testing._post = post  # type: ignore[assignment]
    return b"y" * (64 << 20)


@pytest.mark.parametrize("method", METHODS)
def test_run_ranks_a_rank_killed_while_posting_its_result_is_reported_not_waited_for(method: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(RanksFailed) as info:
        run_ranks(_killed_while_posting, 2, start_method=method, timeout=60, backend="none")
    assert time.monotonic() - t0 < 30
    assert set(info.value.failures) == {0, 1}
    assert all("process exited with code -9" in text for text in info.value.failures.values()), info.value


@pytest.mark.parametrize("method", FORKED)
def test_run_ranks_ranks_see_the_time_zone_set_now(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run_ranks(_tz, 1, start_method=method, timeout=60, backend="none")
    monkeypatch.setenv("TZ", "EST5EDT")
    got = run_ranks(_tz, 1, start_method=method, timeout=60, backend="none")
    assert got[0] == ("EST", "EDT", "EST"), got


@pytest.mark.parametrize("method", FORKED)
def test_run_ranks_ranks_see_tmpdir_set_now(method: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    run_ranks(_tmpdir, 1, start_method=method, timeout=60, backend="none")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    got = run_ranks(_tmpdir, 1, start_method=method, timeout=60, backend="none")
    assert got == [str(tmp_path)], got


@pytest.mark.parametrize("method", FORKED)
def test_run_ranks_env_lc_all_sets_the_ranks_locale(method: str) -> None:
    # a spawned rank with LC_ALL=C starts in the C locale (and UTF-8 mode, PEP 540); a forked one keeps the server's
    run_ranks(_locale, 1, start_method=method, timeout=60, backend="none")  # (the fork server runs from here on)
    got = run_ranks(_locale, 1, start_method=method, timeout=60, backend="none", env={"LC_ALL": "C"})
    assert got == [("C", 1)], got


@pytest.mark.parametrize("method", METHODS)
def test_run_ranks_two_concurrent_calls_leave_this_process_environment_unchanged(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ADV_VALUE", raising=False)
    monkeypatch.setenv("RANK", "7")
    out: dict = {}
    for attempt in range(2):
        threads = [
            threading.Thread(
                target=lambda v=v: out.setdefault(v, []).append(
                    run_ranks(_env_value, 2, start_method=method, timeout=60, backend="none", env={"ADV_VALUE": v})
                )
            )
            for v in ("a", "b")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert "ADV_VALUE" not in os.environ, (attempt, os.environ.get("ADV_VALUE"))
        assert os.environ.get("RANK") == "7", (attempt, os.environ.get("RANK"))
    assert out == {"a": [["a", "a"]] * 2, "b": [["b", "b"]] * 2}


@pytest.mark.parametrize("method", FORKED)
def test_run_ranks_atexit_handlers_run_when_a_rank_exits(method: str, tmp_path: Path) -> None:
    run_ranks(_atexit, 2, str(tmp_path), start_method=method, timeout=60, backend="none")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atexit0", "atexit1"]


CLOSED_STDOUT = """
import os, sys
from syncreward.testing import run_ranks

def body(rank, world_size):
    print(f"rank {rank} printed", flush=True)
    return rank

if __name__ == "__main__":
    run_ranks(body, 1, start_method=sys.argv[1], timeout=60, backend="none")  # (a suite's earlier test)
    saved = os.dup(1)
    os.close(1)  # no standard output: the ranks' prints go nowhere
    got = run_ranks(body, 2, start_method=sys.argv[1], timeout=60, backend="none")
    os.dup2(saved, 1)
    print("got", got, flush=True)
"""


@pytest.mark.parametrize("method", METHODS)
def test_run_ranks_with_standard_output_closed_runs_the_ranks(method: str, tmp_path: Path) -> None:
    (tmp_path / "closed.py").write_text(CLOSED_STDOUT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "closed.py", method], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.strip().splitlines()[-1:] == ["got [0, 1]"], proc.stdout + proc.stderr


WHICH_COPY = """
import sys
sys.path.insert(0, sys.argv[2])  # a checkout put first on sys.path at run time (not the installed copy)
import syncreward.testing
from syncreward.testing import run_ranks

def body(rank, world_size):
    import syncreward.testing
    return syncreward.testing.__file__

if __name__ == "__main__":
    print(repr((syncreward.testing.__file__, run_ranks(body, 2, start_method=sys.argv[1], timeout=60))))
"""


@pytest.mark.parametrize("method", FORKED)
def test_run_ranks_ranks_import_syncreward_from_this_process_sys_path(method: str, tmp_path: Path) -> None:
    import shutil

    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "syncreward", checkout / "syncreward", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "which.py").write_text(WHICH_COPY)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "which.py", method, str(checkout)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    import ast

    mine, ranks = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert mine.startswith(str(checkout))
    assert ranks == [mine, mine], (mine, ranks)
