"""run_ranks says why a body cannot reach its ranks, instead of "exited with code 1" or a PicklingError.

Fresh (spawned) rank processes import ``fn`` by name: a lambda, a function made by ``exec``, or one
defined in code read from stdin or ``python -c`` cannot get there. run_ranks raises a ``TypeError``
saying so before it starts any process; a rank that dies while starting says where its error went.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from syncreward.testing import RanksFailed, run_ranks

ROOT = Path(__file__).resolve().parents[1]
BODY = textwrap.dedent(
    """
    from syncreward.testing import run_ranks
    def body(rank, world_size):
        return rank
    print(run_ranks(body, 2, timeout=60))
    """
)


def _python(args: list[str], stdin: str | None = None, **env_vars: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_vars}
    return subprocess.run(
        [sys.executable, *args], input=stdin, capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_run_ranks_body_from_stdin_says_why() -> None:
    proc = _python(["-"], stdin=BODY)
    assert proc.returncode == 1
    assert "TypeError: run_ranks() cannot send <function body" in proc.stderr
    assert "defined in a __main__ read from stdin, `python -c` or an interactive session" in proc.stderr
    assert "HINT: put fn in a file and import it from there" in proc.stderr
    assert "exited with code" not in proc.stderr


def test_run_ranks_body_from_python_c_says_why() -> None:
    proc = _python(["-c", BODY])
    assert "TypeError: run_ranks() cannot send <function body" in proc.stderr, proc.stderr
    assert "exited with code" not in proc.stderr


def test_run_ranks_lambda_says_why() -> None:
    with pytest.raises(TypeError, match=r"run_ranks\(\) cannot send fn or its arguments to its ranks: .*HINT: fn "):
        run_ranks(lambda rank, world_size: rank, 2, timeout=60)


def test_run_ranks_exec_body_says_why() -> None:
    namespace: dict[str, object] = {"__name__": "not_a_module"}
    exec("def body(rank, world_size):\n    return rank\n", namespace)
    with pytest.raises(TypeError, match=r"cannot send fn or its arguments .*PicklingError"):
        run_ranks(namespace["body"], 2, timeout=60)  # type: ignore[arg-type]


def test_run_ranks_unpicklable_argument_says_why() -> None:
    with pytest.raises(TypeError, match="cannot send fn or its arguments"):
        run_ranks(_identity_body, 2, lambda: None, timeout=60)


def _identity_body(rank: int, world_size: int, arg: object) -> int:
    return rank


@pytest.mark.multiprocess
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_run_ranks_rank_dying_while_starting_says_where(tmp_path: Path, method: str) -> None:
    script = tmp_path / "no_guard.py"  # no `if __name__ == "__main__":`: each rank runs run_ranks again
    script.write_text(BODY)
    proc = _python([str(script)], SYNCREWARD_START_METHOD=method)
    assert proc.returncode == 1
    assert "it died while starting, before it could import fn" in proc.stderr, proc.stderr[-3000:]
    assert "HINT: a script that calls run_ranks needs an `if __name__ == '__main__':` guard" in proc.stderr
    assert RanksFailed.__name__ in proc.stderr


def _exits_inside_fn(rank: int, world_size: int) -> int:
    if rank == 1:
        os._exit(3)  # no traceback, nothing printed
    return rank


@pytest.mark.multiprocess
def test_run_ranks_rank_exiting_inside_fn_is_not_said_to_die_while_starting() -> None:
    with pytest.raises(RanksFailed) as info:
        run_ranks(_exits_inside_fn, 2, timeout=60, backend="none")
    assert set(info.value.failures) == {1}
    text = info.value.failures[1]
    assert "process exited with code 3" in text
    assert "it ended while running fn, without returning or raising" in text
    assert "died while starting" not in text
