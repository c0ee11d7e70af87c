"""Run a real TRL ``GRPOTrainer`` on CPU ranks and dump what each rank saw.

Launch (this is what ``run.py`` does, with a free port)::

    OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
    python -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1 \
        --master_port <free port> tests/trl_e2e/train.py \
        --rewards rewards_probe:probe_sync,rewards_probe:probe_async --out /tmp/out

Do NOT use ``accelerate launch --cpu --num_processes 2``: on CPU, accelerate's
"simple launcher" starts a single process (multi-CPU needs mpirun).

Default geometry (why a GRPO group gets split): ``per_device_train_batch_size=6``,
``num_generations=4``, 2 ranks, ``gradient_accumulation_steps=1`` ->
``steps_per_generation=1``, ``generation_batch_size=12`` = 3 prompts x 4.
With ``shuffle_dataset=False`` the RepeatSampler yields
``[0,0,0,0,1,1 | 1,1,2,2,2,2]`` and accelerate hands the first 6 rows to rank 0
and the next 6 to rank 1, so prompt 1's group is split 2+2 across ranks.
Step 2 (if ``--max-steps 2``) does the same with prompts 3, 4, 5.

Outputs in ``--out``:
* ``rank{R}.jsonl`` -- one line per reward call (written by ``rewards_probe``).
* ``rank{R}.json``  -- end-of-run summary (config, reward names, log_history,
  TRL's ``_logs`` completions table incl. ``extra`` columns, dataset rows).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

T0 = time.time()


def load_callable(spec: str):
    """``module:attr`` or ``/path/to/file.py:attr`` -> object (attr may be dotted)."""
    mod_name, sep, attr = spec.rpartition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"bad callable spec {spec!r}; expected 'module:attr'")
    if mod_name.endswith(".py"):
        path = os.path.abspath(mod_name)
        name = "_trl_e2e_user_" + os.path.splitext(os.path.basename(path))[0]
        module = sys.modules.get(name)
        if module is None:
            file_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[name] = module
            file_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(mod_name)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--rewards",
        default="rewards_probe:probe_sync,rewards_probe:probe_async",
        help="comma-separated module:attr specs of reward callables",
    )
    p.add_argument(
        "--out", required=True, help="directory for rank{R}.jsonl / rank{R}.json"
    )
    p.add_argument(
        "--hook",
        default=None,
        help="optional module:attr called as hook(trainer) before trainer.train()",
    )
    p.add_argument("--max-steps", type=int, default=1)
    p.add_argument("--per-device-batch", type=int, default=6)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--max-completion-length", type=int, default=8)
    p.add_argument(
        "--num-prompts",
        type=int,
        default=None,
        help="dataset size (default: enough prompts for --max-steps)",
    )
    p.add_argument(
        "--shuffle",
        action="store_true",
        help="shuffle_dataset=True (default False: deterministic order)",
    )
    p.add_argument(
        "--conversational",
        action="store_true",
        help="chat-style prompts instead of plain text",
    )
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _jsonable(x):
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) or type(x).__name__ == "deque":
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return repr(x)


def _stage(msg: str) -> None:
    print(f"[trl_e2e rank {os.environ.get('RANK', '?')} +{time.time() - T0:.2f}s] {msg}", file=sys.stderr, flush=True)


def main(argv=None):
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    os.environ["TRL_E2E_OUT"] = out  # read by rewards_probe

    # run.py sends SIGUSR1 to the ranks before killing them on timeout: dump all thread stacks.
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    with open(os.path.join(out, f"rank{os.environ.get('RANK', '0')}.pid"), "w") as fh:
        fh.write(str(os.getpid()))

    import warnings

    # TRL 1.16's unwrap_model_for_generation reads the deprecated `is_gradient_checkpointing`
    # property (transformers 5.x FutureWarning, once per rank) -- harmless noise.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

    import torch
    import tiny
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    reward_funcs = [
        load_callable(s.strip()) for s in args.rewards.split(",") if s.strip()
    ]

    world = int(os.environ.get("WORLD_SIZE", "1"))
    prompts_per_step = args.per_device_batch * world // args.num_generations
    num_prompts = args.num_prompts or max(1, prompts_per_step * args.max_steps)

    config = GRPOConfig(
        output_dir=os.path.join(out, "trainer_output"),
        # device / distributed: force CPU so accelerate picks MULTI_CPU + gloo
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        bf16=False,
        fp16=False,
        # GRPO geometry (see module docstring)
        per_device_train_batch_size=args.per_device_batch,
        gradient_accumulation_steps=1,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        shuffle_dataset=args.shuffle,
        use_vllm=False,
        beta=0.0,  # no reference model
        max_steps=args.max_steps,
        learning_rate=1e-4,
        seed=args.seed,
        # speed / hygiene
        activation_checkpointing=False,  # (not the deprecated gradient_checkpointing alias)
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
    )

    tokenizer = tiny.make_tokenizer()
    model = tiny.make_model(tokenizer, seed=args.seed)
    dataset = tiny.make_dataset(num_prompts, conversational=args.conversational)

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    if args.hook:
        load_callable(args.hook)(trainer)

    _stage("trainer built, starting train()")
    t_train = time.time()
    trainer.train()
    train_s = time.time() - t_train
    _stage("train() done")

    acc = trainer.accelerator
    rank = acc.process_index
    logs = getattr(trainer, "_logs", None) or {}
    history = trainer.state.log_history
    logged_reward_names = sorted(
        {
            k[len("rewards/") : -len("/mean")]
            for h in history
            for k in h
            if k.startswith("rewards/") and k.endswith("/mean")
        }
    )
    summary = {
        "rank": rank,
        "world_size": acc.num_processes,
        "distributed_type": str(acc.distributed_type),
        "backend": getattr(acc.state, "backend", None),
        "torch_dist_backend": torch.distributed.get_backend()
        if torch.distributed.is_initialized()
        else None,
        "device": str(acc.device),
        "config": {
            "per_device_train_batch_size": config.per_device_train_batch_size,
            "num_generations": config.num_generations,
            "generation_batch_size": config.generation_batch_size,
            "steps_per_generation": config.steps_per_generation,
            "gradient_accumulation_steps": config.gradient_accumulation_steps,
            "max_completion_length": config.max_completion_length,
            "shuffle_dataset": config.shuffle_dataset,
            "max_steps": config.max_steps,
        },
        "reward_func_names": list(trainer.reward_func_names),
        "logged_reward_names": logged_reward_names,
        "log_history": history,
        "completions_log": {
            "prompt": list(logs.get("prompt", [])),
            "completion": list(logs.get("completion", [])),
            "rewards": {k: list(v) for k, v in logs.get("rewards", {}).items()},
            "advantages": list(logs.get("advantages", [])),
            "extra": {k: list(v) for k, v in logs.get("extra", {}).items()},
        },
        "dataset": tiny.make_rows(num_prompts, conversational=args.conversational),
        "global_step": trainer.state.global_step,
        "train_seconds": train_s,
        "process_seconds": time.time() - T0,
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(_jsonable(summary), fh, indent=1)

    _stage("summary written")
    acc.wait_for_everyone()
    _stage("barrier passed; exiting with os._exit(0)")


def _hard_exit(code: int) -> None:
    """Exit without running destructors/atexit handlers.

    Letting Python tear down the trainer can deadlock (seen ~1 in 15 runs with torch 2.13 CPU):
    the main thread, holding the GIL, frees DDP's Reducer -> ~ProcessGroupGloo joins the
    ``pt_gloo_runloop`` thread, which is itself blocked acquiring the GIL to decref a tensor of
    the last (barrier/allgather) work object.  All outputs are written and flushed before this.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # noqa: BLE001 - report, then exit hard (same teardown deadlock risk)
        import traceback

        traceback.print_exc()
        _hard_exit(1)
    _hard_exit(0)
