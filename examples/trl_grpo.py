"""TRL's GRPOTrainer with synced rewards, on 2 ranks, fully offline (a tiny random model, no downloads).

Two rewards, both decorated with ``@synced_reward``:

* ``relative_brevity`` (plain ``def``, ``mode="main"``): how much shorter a completion is than the
  average completion of the *generation batch*, in standard deviations. Per rank, "the batch" would be
  whatever landed on that rank.
* ``judge_rank`` (``async def``, ``mode="shard"``, ``group_by="prompt_id"``): a stub judge ranks the K
  completions of each prompt; the rank of each is its reward. Whole prompt groups are spread over the
  ranks and judged concurrently.

The geometry makes TRL split a GRPO group across the ranks: ``per_device_train_batch_size=6`` with
``num_generations=4`` on 2 ranks gives a generation batch of 12 completions = 3 prompts x 4, and rank 0
holds prompt 0's four completions and two of prompt 1's, rank 1 the other two of prompt 1's and prompt
2's four. For the first step the script prints, per rank, what the plain (unsynced) function would have
given on that rank's rows next to what the synced reward returned.

Run on CPU (2 processes over gloo; the script uses the CPU when there is no GPU)::

    torchrun --nproc_per_node 2 examples/trl_grpo.py
    accelerate launch --multi_gpu --num_processes 2 examples/trl_grpo.py      # the same, with accelerate
    python examples/trl_grpo.py      # one process (8 rows, 2 whole prompts): the rewards are plain calls

(``accelerate launch --cpu --num_processes 2`` would start a single process.) Run on 2 GPUs, one process
each::

    torchrun --nproc_per_node 2 examples/trl_grpo.py
    accelerate launch --num_processes 2 examples/trl_grpo.py

With a real model, replace ``make_tokenizer()``/``make_model()`` by ``AutoTokenizer``/``AutoModelForCausalLM``
``.from_pretrained(...)`` and drop ``print_first_call``; the rewards and the trainer stay as they are.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import os
import sys
import tempfile
import warnings
from collections import defaultdict
from typing import Any

import torch

from syncreward import synced_reward

# transformers 5 renamed gradient checkpointing to activation checkpointing; TRL still uses the old names, which
# prints one FutureWarning per name and rank. Only those two messages are silenced.
warnings.filterwarnings("ignore", message=r"`(is_)?gradient_checkpointing` is deprecated", category=FutureWarning)

K = 4  # GRPOConfig.num_generations: completions per prompt, consecutive in the generation batch

# --------------------------------------------------------------------------- the rewards (copy these)


@synced_reward  # mode="main": scored once on rank 0, over the whole generation batch
def relative_brevity(completions: list[str], **kwargs: Any) -> list[float]:
    """Standard deviations below the generation batch's mean length (shorter than average: positive)."""
    lengths = [len(c.split()) for c in completions]
    mean = sum(lengths) / len(lengths)
    std = math.sqrt(sum((x - mean) ** 2 for x in lengths) / len(lengths))
    return [(mean - x) / (std + 1e-6) for x in lengths]


async def judge(prompt: str, answers: list[str], solution: str) -> list[float]:
    """Stub LLM judge: one score per answer. Swap in a real API call."""
    await asyncio.sleep(0.01)  # the network round trip
    wanted = set(solution.split())
    return [len(wanted & set(a.split())) - 0.01 * len(a.split()) for a in answers]


@synced_reward(mode="shard", group_by="prompt_id")  # whole prompt groups, spread over the ranks
async def judge_rank(
    prompts: list[str], completions: list[str], solution: list[str], prompt_id: list[int], **kwargs: Any
) -> list[float]:
    """Rank of each completion among the completions of its prompt, by the judge: best 1, worst 0."""
    groups: dict[int, list[int]] = defaultdict(list)
    for row, pid in enumerate(prompt_id):
        groups[pid].append(row)
    rows = list(groups.values())
    scores = await asyncio.gather(*(judge(prompts[g[0]], [completions[i] for i in g], solution[g[0]]) for g in rows))
    rewards = [0.0] * len(completions)
    for group, group_scores in zip(rows, scores, strict=True):
        order = sorted(range(len(group)), key=lambda i: (group_scores[i], -i))
        for r, i in enumerate(order):
            rewards[group[i]] = r / max(len(group) - 1, 1)
    return rewards


# --------------------------------------------------------------------------- a tiny offline model


WORDS = [str(d) for d in range(10)] + ["question", "what", "is", "plus", "answer", "?", "yes", "no", "maybe", "ok"]


def make_tokenizer() -> Any:
    """A word-level tokenizer built in-process with the ``tokenizers`` library (nothing downloaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins the words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )


def make_model(tokenizer: Any) -> Any:
    """A randomly initialised 2-layer Qwen2 with hidden size 32."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id, **ids,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.eos_token_id, **ids)
    return model


def make_dataset(num_prompts: int) -> Any:
    from datasets import Dataset

    rows = []
    for i in range(num_prompts):
        a, b = i % 10, (3 * i + 1) % 10
        rows.append(
            {"prompt": f"question what is {a} plus {b} ?", "solution": f"answer {(a + b) % 10}", "prompt_id": i}
        )
    return Dataset.from_list(rows)


# --------------------------------------------------------------------------- for the demo: per rank vs synced


def print_first_call(reward: Any) -> Any:
    """Wrap a synced reward so that its first call prints, on each rank, unsynced vs synced rewards.

    Demo only. ``reward.__wrapped__`` is the plain function; called on this rank's rows alone it gives what
    per-rank scoring (no syncreward) would have given. No collective is added: each rank prints its own line.
    """
    plain, state = reward.__wrapped__, {"done": False}
    rank = int(os.environ.get("RANK", "0"))

    def show(kwargs: dict[str, Any], per_rank: list[float], synced: list[float]) -> None:
        if not state["done"]:
            state["done"] = True
            fmt = lambda xs: "[" + ", ".join(f"{x:+.2f}" for x in xs) + "]"  # noqa: E731
            sys.stdout.write(  # one write, so that the ranks' lines do not interleave
                f"rank {rank} {reward.__name__:<16} prompt_id {kwargs['prompt_id']}\n"
                f"  per-rank {fmt(per_rank)}\n  synced   {fmt(synced)}\n"
            )
            sys.stdout.flush()

    if inspect.iscoroutinefunction(reward):

        @functools.wraps(reward)
        async def async_wrapper(**kwargs: Any) -> Any:
            synced = await reward(**kwargs)
            show(kwargs, await plain(**kwargs), synced)
            return synced

        return async_wrapper

    @functools.wraps(reward)
    def wrapper(**kwargs: Any) -> Any:
        synced = reward(**kwargs)
        show(kwargs, plain(**kwargs), synced)
        return synced

    return wrapper


# --------------------------------------------------------------------------- training


def main() -> None:
    from trl import GRPOConfig, GRPOTrainer

    world = int(os.environ.get("WORLD_SIZE", "1"))
    # 6 rows per rank on 2 ranks: not a multiple of K, so a group is split. One process (plain python) takes
    # 2 whole prompts: TRL needs a generation batch of whole groups.
    steps, per_device = 2, 6 if world > 1 else 2 * K
    cpu = not torch.cuda.is_available()
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_grpo_"),
        use_cpu=cpu,
        ddp_backend="gloo" if cpu and world > 1 else None,  # one process: no process group to create
        ddp_find_unused_parameters=False,
        bf16=False,
        per_device_train_batch_size=per_device,
        num_generations=K,
        max_completion_length=8,
        shuffle_dataset=False,  # a reproducible layout: prompts 0, 1, 2 in the first step
        gradient_checkpointing=False,  # a tiny model (transformers 5 names this activation_checkpointing)
        beta=0.0,  # no reference model
        max_steps=steps,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    tokenizer = make_tokenizer()
    trainer = GRPOTrainer(
        model=make_model(tokenizer),
        reward_funcs=[print_first_call(relative_brevity), print_first_call(judge_rank)],
        args=config,
        train_dataset=make_dataset(num_prompts=steps * per_device * world // K),
        processing_class=tokenizer,
    )
    if trainer.accelerator.is_main_process:
        n = config.generation_batch_size
        print(f"generation batch: {n} completions = {n // K} prompts x {K}, {n // world} per rank", flush=True)
        print(
            "first call, each rank: per-rank = the plain function on that rank's rows alone; synced = what it returned",
            flush=True,
        )
    trainer.train()

    if trainer.accelerator.is_main_process:
        logged = {k: round(v, 3) for h in trainer.state.log_history for k, v in h.items() if k.startswith("rewards/")}
        print(f"trained {trainer.state.global_step} steps on {trainer.accelerator.num_processes} ranks; {logged}")
        print("done", flush=True)
    trainer.accelerator.end_training()  # destroys the process group: always tear down a distributed job


if __name__ == "__main__":
    main()
