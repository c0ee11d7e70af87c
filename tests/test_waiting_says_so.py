"""A rank that waits long for its peers says so: a rate-limited warning naming the call, who, and how long.

Checked where a rank waits on real gloo ranks: for the first synced call of a rank that never makes it
(it is busy past the timeout; a rank that exits is named at once instead), and inside an exchange for a rank
that comes late. ``SYNCREWARD_WAIT_WARN_S`` makes the
first warning come early (it is 60 s by default).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _helpers import outcome

from syncreward import synced_reward
from syncreward.backends._waiting import TIMEOUT, WARN_ENV, WaitLog
from syncreward.testing import run_ranks


def _plain(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")


def _body(rank: int, world_size: int, case: str) -> tuple[Any, list[str]]:
    records = _Records()
    logging.getLogger("syncreward").addHandler(records)
    synced = synced_reward(timeout=6)(_plain)
    if case == "exchange":
        synced([f"c{rank}"])  # the groups exist: the next wait is inside an exchange
    if rank == 1:
        if case == "first_call":
            time.sleep(7.0)  # busy past rank 0's timeout=6, then leaves without its first synced call
            return ("skipped", None, 0.0), []
        time.sleep(3.0)
    return outcome(synced, [f"c{rank}"]), records.lines


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", ["first_call", "exchange"])
def test_waiting_rank_says_so_naming_the_call_the_missing_rank_and_the_time(case: str) -> None:
    (r0, _) = run_ranks(_body, 2, case, timeout=120, env={WARN_ENV: "1"})
    got, lines = r0
    call = "synced call #0 of '_plain'" if case == "first_call" else "synced call #1 of '_plain'"
    waits = [line for line in lines if "has waited" in line]
    assert waits, f"rank 0 waited {got[2]:.1f}s without a word (it logged {lines})"
    first = waits[0]
    assert first.startswith("syncreward."), first
    assert call in first, first
    assert "on rank 0" in first, first
    assert "not arrived: rank(s) [1]" in first, first
    assert "timeout=6s" in first, first
    assert len(waits) <= 3, f"not rate-limited: {waits}"  # at 1 s, 2 s, 4 s of a wait of at most 6 s
    expected = "SyncTimeoutError" if case == "first_call" else "ok"
    assert got[0] == expected, got


def test_waiting_says_so_only_after_the_first_interval_then_each_time_the_wait_doubled(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(WARN_ENV, "10")
    started = time.monotonic() - 10.2
    waits = WaitLog(timeout=100, started=started)
    assert waits.due()
    with caplog.at_level(logging.WARNING, logger="syncreward"):
        waits.warn([2, 3], "arrive in this exchange")
    assert not waits.due()  # the next one when the wait has doubled (at 21 s)
    (record,) = caplog.records
    assert "has waited 10s of timeout=100s" in record.getMessage()
    assert "rank(s) [2, 3]" in record.getMessage()
    assert not WaitLog(timeout=5).due()  # a timeout before the first warning: its error says it all
    monkeypatch.setenv(WARN_ENV, "4")
    assert WaitLog(timeout=5, started=time.monotonic() - 4.1).due()


def test_waiting_says_so_naming_the_timeout_given_not_the_seconds_the_call_had_left(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A wait that begins late in a call of ``timeout=1800`` (here with 100 s left) names ``timeout=1800s``."""
    monkeypatch.setenv(WARN_ENV, "10")
    waits = WaitLog(timeout=100, started=time.monotonic() - 10.2)  # the backend is handed the seconds left
    given = TIMEOUT.set(1800.0)  # the session sets the call's timeout= around every step
    try:
        with caplog.at_level(logging.WARNING, logger="syncreward"):
            waits.warn([1], "arrive in this exchange")
    finally:
        TIMEOUT.reset(given)
    (record,) = caplog.records
    assert "has waited 10s of timeout=1800s" in record.getMessage()


def test_waiting_warning_in_troubleshooting_is_what_python_prints_without_logging_configured() -> None:
    """No handler of ours: with no logging configured, Python's last-resort handler prints the message alone,
    and docs/troubleshooting.md's sample must be that line (not a format the user never sees)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md").read_text()
    samples = [b for b in re.findall(r"```text\n(.*?)```", page, re.S) if "has waited 60s" in b]
    assert samples, "the waiting warning's sample is gone from docs/troubleshooting.md"
    script = (
        "import logging, time\n"
        "from syncreward.backends._waiting import CALL, WaitLog\n"
        "assert not logging.getLogger('syncreward').handlers  # a library attaches none\n"
        "assert not logging.getLogger('syncreward.backends._waiting').handlers\n"
        "CALL.set(\"synced call #0 of 'accuracy' on rank 0 while sending its inputs\")\n"
        "WaitLog(1800.0, time.monotonic() - 60.2).warn([3], 'make their first synced call')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.split() == samples[0].split(), (proc.stderr, samples[0])
