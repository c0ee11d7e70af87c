"""Launch ``train.py`` on N CPU ranks (torchrun + gloo) and collect what each rank recorded.

Importable helper (used by the pytest files) and a small CLI::

    python tests/trl_e2e/run.py --rewards rewards_probe:probe_sync,rewards_probe:probe_async

``run_grpo`` returns::

    {
      "records":   {rank: [one dict per reward call, from rank{R}.jsonl]},
      "summaries": {rank: rank{R}.json (config, reward names, log_history, TRL _logs, dataset rows)},
      "wall_s":    seconds for the whole launch,
      "cmd":       the launch command (list),
      "out_dir":   absolute output dir,
      "log":       tail of the combined launcher output,
    }

Why torchrun and not ``accelerate launch --cpu --num_processes 2``: with ``--cpu``
accelerate uses its "simple launcher", which starts ONE process unless mpirun is
used.  torchrun starts the ranks and sets RANK/WORLD_SIZE/LOCAL_RANK; ``train.py``
sets ``use_cpu=True`` so accelerate's PartialState resolves to MULTI_CPU, and with
no MPI in the torch CPU wheel it initialises the process group with ``gloo``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
TRAIN_SCRIPT = os.path.join(HERE, "train.py")

DEFAULT_REWARDS = ("rewards_probe:probe_sync", "rewards_probe:probe_async")

# Inherited variables that would confuse torchrun / accelerate / the ranks.
_STRIP_EXACT = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
    "PMI_SIZE", "PMI_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_LOCAL_RANK",
    "CUDA_VISIBLE_DEVICES", "TRL_E2E_OUT",
}
_STRIP_PREFIXES = ("ACCELERATE_", "TORCHELASTIC_", "OMPI_COMM_WORLD_", "PMIX_", "FSDP_", "TORCH_ELASTIC_")

_FORCED_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "WANDB_DISABLED": "true",
    "WANDB_MODE": "disabled",
    "CUDA_VISIBLE_DEVICES": "",  # CPU ranks even on a GPU box
    "PYTHONUNBUFFERED": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
}


class HarnessError(RuntimeError):
    """The launch failed, timed out, or a rank produced no summary."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(extra_pythonpath: Iterable[str] = (), env: dict | None = None) -> dict:
    out = {
        k: v
        for k, v in os.environ.items()
        if k not in _STRIP_EXACT and not k.startswith(_STRIP_PREFIXES)
    }
    out.update(_FORCED_ENV)
    if os.path.isdir("/sys/class/net/lo"):
        out["GLOO_SOCKET_IFNAME"] = "lo"  # don't depend on hostname resolution
    paths = [HERE, REPO_ROOT, *[os.path.abspath(p) for p in extra_pythonpath]]
    if out.get("PYTHONPATH"):
        paths.append(out["PYTHONPATH"])
    out["PYTHONPATH"] = os.pathsep.join(paths)
    if env:
        out.update(env)
    return out


def _tail(text: str, n: int = 8000) -> str:
    return text if len(text) <= n else "...[truncated]...\n" + text[-n:]


def _read_logs(out_dir: str, launcher_log: str) -> str:
    parts = []
    if os.path.exists(launcher_log):
        with open(launcher_log, errors="replace") as fh:
            parts.append(f"===== launcher ({launcher_log}) =====\n" + _tail(fh.read()))
    for path in sorted(glob.glob(os.path.join(out_dir, "torchrun_logs", "**", "std*.log"), recursive=True)):
        with open(path, errors="replace") as fh:
            text = fh.read()
        if text.strip():
            parts.append(f"===== {os.path.relpath(path, out_dir)} =====\n" + _tail(text, 4000))
    return "\n".join(parts)


def _clear_outputs(out_dir: str) -> None:
    for stale in glob.glob(os.path.join(out_dir, "rank*.json*")) + glob.glob(os.path.join(out_dir, "rank*.pid")):
        os.remove(stale)
    shutil.rmtree(os.path.join(out_dir, "torchrun_logs"), ignore_errors=True)


def _dump_rank_stacks(out_dir: str) -> None:
    """Ask still-running ranks for a faulthandler stack dump (train.py registers SIGUSR1)."""
    sent = False
    for path in glob.glob(os.path.join(out_dir, "rank*.pid")):
        try:
            with open(path) as fh:
                os.kill(int(fh.read().strip()), signal.SIGUSR1)
            sent = True
        except (OSError, ValueError):
            pass
    if sent:
        time.sleep(1.0)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM then SIGKILL the launcher's whole process group (launcher + ranks)."""
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        proc.wait(timeout=1)
    except subprocess.TimeoutExpired:
        pass


def build_cmd(rewards: Sequence[str], out_dir: str, nproc: int, port: int, extra_args: Sequence[str]) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1",
        "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1",
        "--master_port", str(port),
        "--max_restarts", "0",
        "--log_dir", os.path.join(out_dir, "torchrun_logs"),
        "--tee", "3",
        TRAIN_SCRIPT,
        "--rewards", ",".join(rewards),
        "--out", out_dir,
        *extra_args,
    ]


def run_grpo(
    rewards: Sequence[str] = DEFAULT_REWARDS,
    out_dir: str | os.PathLike = None,
    nproc: int = 2,
    timeout: float = 240.0,
    extra_args: Sequence[str] = (),
    extra_pythonpath: Iterable[str] = (),
    env: dict | None = None,
    _retries: int = 2,
) -> dict:
    """Run ``train.py`` on ``nproc`` CPU ranks; return per-rank reward-call records and summaries.

    ``rewards``: ``module:attr`` (or ``/path/file.py:attr``) specs, importable in the child
    (``tests/trl_e2e`` and the repo root are on its PYTHONPATH, plus ``extra_pythonpath``).
    ``extra_args``: passed to ``train.py`` (e.g. ``["--max-steps", "2"]``, ``["--hook", "m:f"]``).
    ``env``: extra environment for the child, applied after the hygiene defaults.
    Raises :class:`HarnessError` (with the ranks' output tail) on failure or timeout.
    """
    if isinstance(rewards, str):
        rewards = [r for r in rewards.split(",") if r]
    if out_dir is None:
        import tempfile

        out_dir = tempfile.mkdtemp(prefix="trl_e2e_")
    out_dir = os.path.abspath(os.fspath(out_dir))
    os.makedirs(out_dir, exist_ok=True)
    _clear_outputs(out_dir)

    child_env = clean_env(extra_pythonpath, env)
    launcher_log = os.path.join(out_dir, "launcher.log")
    t0 = time.monotonic()
    for attempt in range(_retries + 1):
        cmd = build_cmd(rewards, out_dir, nproc, free_port(), extra_args)
        with open(launcher_log, "w") as log_fh:
            proc = subprocess.Popen(
                cmd, cwd=REPO_ROOT, env=child_env, stdin=subprocess.DEVNULL,
                stdout=log_fh, stderr=subprocess.STDOUT, start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                _dump_rank_stacks(out_dir)
                _kill_group(proc)
                raise HarnessError(
                    f"GRPO run timed out after {timeout:.0f}s (killed process group {proc.pid}).\n"
                    f"cmd: {' '.join(cmd)}\n{_read_logs(out_dir, launcher_log)}"
                ) from None
            except BaseException:
                _kill_group(proc)
                raise
        if rc != 0:
            _kill_group(proc)  # reap any rank the launcher left behind
            logs = _read_logs(out_dir, launcher_log)
            port_clash = "EADDRINUSE" in logs or "address already in use" in logs.lower()
            if port_clash and attempt < _retries:
                _clear_outputs(out_dir)
                continue
            raise HarnessError(f"GRPO run failed with exit code {rc}.\ncmd: {' '.join(cmd)}\n{logs}")
        break
    wall = time.monotonic() - t0

    records, summaries = {}, {}
    for rank in range(nproc):
        summary_path = os.path.join(out_dir, f"rank{rank}.json")
        if not os.path.exists(summary_path):
            raise HarnessError(f"rank {rank} wrote no summary ({summary_path}).\n{_read_logs(out_dir, launcher_log)}")
        with open(summary_path) as fh:
            summaries[rank] = json.load(fh)
        calls_path = os.path.join(out_dir, f"rank{rank}.jsonl")
        records[rank] = []
        if os.path.exists(calls_path):
            with open(calls_path) as fh:
                records[rank] = [json.loads(line) for line in fh if line.strip()]
    with open(launcher_log, errors="replace") as fh:
        log = _tail(fh.read())
    return {
        "records": records,
        "summaries": summaries,
        "wall_s": wall,
        "cmd": cmd,
        "out_dir": out_dir,
        "log": log,
    }


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Run the TRL GRPO e2e harness once and print a digest.")
    p.add_argument("--rewards", default=",".join(DEFAULT_REWARDS))
    p.add_argument("--out", default=None)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--timeout", type=float, default=240.0)
    args, extra = p.parse_known_args(argv)
    res = run_grpo(args.rewards.split(","), args.out, nproc=args.nproc, timeout=args.timeout, extra_args=extra)
    for rank, calls in res["records"].items():
        for c in calls:
            print(f"rank {rank} {c['func']:<14} step={c['global_step']} n={c['n_completions']} "
                  f"prompt_id={c['prompt_id']}")
    s0 = res["summaries"][0]
    print("reward_func_names:", s0["reward_func_names"], "logged:", s0["logged_reward_names"])
    print("backend:", s0["backend"], s0["distributed_type"], "world:", s0["world_size"])
    print(f"wall: {res['wall_s']:.2f}s  out: {res['out_dir']}")
    print("cmd:", " ".join(res["cmd"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
