"""How run_ranks starts its ranks: spawned, or forked from a fork server that imported torch once.

Either way a rank is a fresh process with this process's environment, working directory, ``sys.path`` and
standard output as they are when ``run_ranks`` starts it; a forked rank only starts faster. What cannot be
the same (a forked rank has the server's interpreter, started once) makes ``run_ranks`` spawn instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from syncreward.testing import RanksFailed, run_ranks

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(sys.platform != "linux", reason="the fork server is used on Linux only"),
]

METHODS = ["spawn", "forkserver"]


def _environment(rank: int, world_size: int) -> tuple[str | None, str, str, bool]:
    return (
        os.environ.get("SYNCREWARD_PROBE"),
        os.environ["RANK"],
        os.getcwd(),
        os.getppid() == int(os.environ["PARENT"]),
    )


@pytest.mark.parametrize("method", METHODS)
def test_run_ranks_ranks_see_the_environment_as_it_is_now(
    method: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PARENT", str(os.getpid()))
    run_ranks(_environment, 2, start_method=method, timeout=120)  # (starts the fork server, if it is not running)
    monkeypatch.setenv("SYNCREWARD_PROBE", "set after the first run")
    monkeypatch.chdir(tmp_path)
    got = run_ranks(_environment, 2, start_method=method, timeout=120)
    forked = method == "forkserver"
    assert got == [("set after the first run", str(r), str(tmp_path), not forked) for r in range(2)]


def _hash_randomization(rank: int, world_size: int) -> tuple[int, bool]:
    return sys.flags.hash_randomization, os.getppid() == int(os.environ["PARENT"])


def test_run_ranks_env_changing_a_start_up_variable_spawns_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked rank has the server's interpreter: ``PYTHONHASHSEED=0`` would not reach it, so it is spawned."""
    monkeypatch.setenv("PARENT", str(os.getpid()))
    assert run_ranks(_hash_randomization, 2, start_method="forkserver", timeout=120)[0] == (
        sys.flags.hash_randomization,
        False,
    )
    got = run_ranks(_hash_randomization, 2, start_method="forkserver", env={"PYTHONHASHSEED": "0"}, timeout=120)
    assert got == [(0, True), (0, True)]  # spawned (this process is their parent), hash randomization off


def _breakpoint_hook(rank: int, world_size: int) -> tuple[str | None, bool]:
    return os.environ.get("PYTHONBREAKPOINT"), os.getppid() == int(os.environ["PARENT"])


def test_run_ranks_a_variable_read_at_run_time_keeps_the_ranks_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    """ray.init() sets PYTHONBREAKPOINT in its driver for good: it is read at each breakpoint(), not at start-up,
    so the ranks stay forked (a suite that starts Ray once would otherwise spawn every later test's ranks)."""
    monkeypatch.setenv("PARENT", str(os.getpid()))
    run_ranks(_breakpoint_hook, 2, start_method="forkserver", timeout=120)  # (the server runs from here on)
    monkeypatch.setenv("PYTHONBREAKPOINT", "ray.util.rpdb._driver_set_trace")
    got = run_ranks(_breakpoint_hook, 2, start_method="forkserver", timeout=120)
    assert got == [("ray.util.rpdb._driver_set_trace", False)] * 2


def _prints(rank: int, world_size: int) -> int:
    print(f"printed by rank {rank}", flush=True)
    return rank


@pytest.mark.parametrize("method", METHODS)
def test_run_ranks_prints_reach_this_process_standard_output(method: str, capfd: pytest.CaptureFixture[str]) -> None:
    # the fork server (started by an earlier test, or by this line) holds another standard output than capfd's
    assert run_ranks(_prints, 2, start_method=method, timeout=120) == [0, 1]
    out = capfd.readouterr().out
    assert "printed by rank 0" in out, out
    assert "printed by rank 1" in out, out


BROKEN_IN_RANKS = """
import os
if os.environ.get("RANK") is not None:
    raise ImportError("this module cannot be imported in a rank")

def body(rank, world_size):
    return rank
"""


@pytest.mark.parametrize("method", METHODS)
def test_run_ranks_fn_whose_module_fails_to_import_in_a_rank_shows_the_error(
    method: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "broken_in_ranks.py").write_text(BROKEN_IN_RANKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import broken_in_ranks  # type: ignore[import-not-found]

    with pytest.raises(RanksFailed) as info:
        run_ranks(broken_in_ranks.body, 2, start_method=method, timeout=120)
    assert set(info.value.failures) == {0, 1}
    for text in info.value.failures.values():
        assert "ImportError: this module cannot be imported in a rank" in text, text
        assert "died while starting" not in text


def test_run_ranks_unknown_start_method_says_which_there_are(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"start_method='fork' is not one of 'spawn', 'forkserver'"):
        run_ranks(_prints, 2, start_method="fork")
    monkeypatch.setenv("SYNCREWARD_START_METHOD", "threads")
    with pytest.raises(ValueError, match=r"\$SYNCREWARD_START_METHOD='threads' is not one of"):
        run_ranks(_prints, 2)
