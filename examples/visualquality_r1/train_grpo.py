"""Template: train a VLM image-quality scorer with GRPO and the synced VisualQuality-R1 fidelity reward.

NOT run in CI (needs GPUs and a real model). Copy it, point it at your data, adjust the config. Launch with
accelerate (or torchrun) on one or more GPUs, e.g. 8 GPUs with DeepSpeed ZeRO-3 (any accelerate config works;
syncreward only needs the processes to be in one torch.distributed job)::

    accelerate launch --num_processes 8 --config_file zero3.yaml examples/visualquality_r1/train_grpo.py \\
        --data koniq_train.jsonl --image-root /data/koniq --output-dir runs/vq-r1

Data: a JSON-lines file, one image per line: ``{"image": "relative/path.jpg", "mos": 3.71}``, optionally with
``"dataset_name": "koniq"`` (then pass ``--by-dataset`` to compare images only within their dataset). MOS must
be on the 1-5 scale the prompt asks for (rescale your dataset's MOS first, as VisualQuality-R1 does).

Where syncreward fits: only in ``reward_funcs``. TRL calls every reward function on each rank with that rank's
share of the generation batch; the fidelity reward ranks each image against the other images, so it is built
with ``make_fidelity_reward`` (which applies ``@synced_reward`` and bakes in ``num_generations``) and sees the
whole generation batch (``per_device_train_batch_size * num_processes * steps_per_generation`` completions,
``/ num_generations`` images). The format reward scores each completion on its own and needs no syncing.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reward.py and fidelity.py sit next to this file

from reward import make_fidelity_reward

MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"

# In the spirit of VisualQuality-R1's prompt: reason, then one score in <answer> tags.
QUESTION = (
    "What is your overall rating on the quality of this picture? The rating should be a float between 1 and 5, "
    "rounded to two decimal places, with 1 representing very poor quality and 5 representing excellent quality. "
    "First output the thinking process in <think> </think> tags and then output the final answer with only one "
    "score in <answer> </answer> tags."
)

_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)


def format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the completion is ``<think>...</think><answer>...</answer>``, else 0.0. Per-sample: no sync needed."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if _FORMAT.fullmatch(t.strip()) else 0.0 for t in texts]


def build_dataset(data: str, image_root: str) -> Any:
    """The training set in TRL's VLM format: a conversational ``prompt``, an ``image``, and the ``solution``."""
    import datasets

    ds = datasets.load_dataset("json", data_files=data, split="train")

    def to_example(row: dict[str, Any]) -> dict[str, Any]:
        return {
            "prompt": [{"role": "user", "content": QUESTION}],  # TRL inserts the image placeholder itself
            "image": str(Path(image_root) / row["image"]),
            "solution": f"<answer> {float(row['mos']):.2f} </answer>",  # what the fidelity reward parses
        }

    ds = ds.map(to_example, remove_columns=[c for c in ds.column_names if c not in ("dataset_name",)])
    return ds.cast_column("image", datasets.Image())  # decoded to PIL lazily


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="JSON-lines file: image, mos[, dataset_name]")
    parser.add_argument("--image-root", default=".", help="directory the image paths are relative to")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--output-dir", default="runs/visualquality-r1")
    parser.add_argument("--num-generations", type=int, default=8, help="K completions per image")
    parser.add_argument("--per-device-batch", type=int, default=8, help="completions per GPU per step")
    parser.add_argument("--by-dataset", action="store_true", help="compare images only within their dataset_name")
    args = parser.parse_args(argv)

    from trl import GRPOConfig, GRPOTrainer  # heavy imports after argument parsing

    config = GRPOConfig(
        output_dir=args.output_dir,
        num_generations=args.num_generations,  # K; must match the reward's K (see below)
        # num_generations_eval: leave unset (= num_generations) if you evaluate with the fidelity reward.
        per_device_train_batch_size=args.per_device_batch,  # need not be a multiple of K: groups may span GPUs
        max_completion_length=512,
        temperature=1.0,
        beta=0.04,
        learning_rate=1e-6,
        bf16=True,
        gradient_checkpointing=True,
        logging_steps=1,
        log_completions=True,
        num_train_epochs=1,
        save_steps=200,
        remove_unused_columns=False,  # keep "solution" (and "dataset_name") for the reward (TRL's default)
        model_init_kwargs={"dtype": "bfloat16"},
    )

    # --- syncreward: the fidelity reward sees the whole generation batch, on every rank. ---------------------
    # K reaches the reward here: TRL never passes num_generations to reward functions.
    fidelity_reward = make_fidelity_reward(config.num_generations, by_dataset=args.by_dataset)

    trainer = GRPOTrainer(
        model=args.model,
        args=config,
        train_dataset=build_dataset(args.data, args.image_root),
        # Logged as rewards/fidelity_reward/mean and rewards/format_reward/mean.
        reward_funcs=[fidelity_reward, format_reward],
    )
    trainer.train()
    trainer.save_model(args.output_dir)
    trainer.accelerator.end_training()  # destroys the process group: always tear down a distributed job


if __name__ == "__main__":
    main()
