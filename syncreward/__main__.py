"""Command line: ``python -m syncreward demo [--ranks N] [--images B] [--generations K] [--seed S]``."""

from __future__ import annotations

import argparse
import sys

from . import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m syncreward",
        description="syncreward: reward functions that see the whole batch across ranks.",
    )
    parser.add_argument("--version", action="version", version=f"syncreward {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="show unsynced vs synced rewards on local CPU ranks",
        description=(
            "Spawn N local CPU ranks (torch.distributed, gloo), give each its slice of a synthetic "
            "VisualQuality-R1 batch (K predicted quality scores per image, a ground-truth MOS per image), and "
            "compute the fidelity reward, which ranks each image against the other images of the batch: once "
            "per rank alone (unsynced) and once with @synced_reward. Prints, per rank, how many images each "
            "image was compared with, how far the unsynced rewards drift from the global-batch rewards, whether "
            "the synced rewards equal the single-process reference, and the time per synced call."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    demo.add_argument("--ranks", type=int, default=4, help="number of local CPU processes")
    demo.add_argument("--images", type=int, default=8, help="images in the global batch (a multiple of --ranks)")
    demo.add_argument("--generations", type=int, default=4, help="completions per image (TRL's num_generations, K)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the synthetic batch")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command != "demo":
        parser.print_help()
        return 2
    from ._demo import run_demo

    try:
        ok = run_demo(ranks=args.ranks, images=args.images, generations=args.generations, seed=args.seed)
    except ValueError as e:
        parser.exit(2, f"python -m syncreward demo: error: {e}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
