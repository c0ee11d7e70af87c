"""Codec micro-benchmark: one rank's batch through the wire codec, against an older codec, pickle and msgpack.

Every variant encodes and decodes the same columns (the ``trl`` and ``large`` payloads of
``_payloads.py``: completions text, token-id lists, solution and dataset_name strings). The variants run
*interleaved* -- one call of each in turn, many rounds -- so that a noisy, shared machine slows them all
alike; the report gives the minimum and median per call and the ratios of the medians.

* ``old``: ``syncreward/_codec.py`` as of a git ref (``--ref``, default ``main``), loaded from ``git show``
  into a temporary module, so the comparison needs no second checkout;
* ``new``: the codec of this working tree;
* ``pickle``: ``pickle.dumps``/``loads`` of the dict of columns (protocol 5);
* ``msgpack``: ``msgpack.packb``/``unpackb`` of the dict of columns (if msgpack is installed).

Run from the repository root::

    python benchmarks/bench_codec.py                      # trl and large, 30 rounds
    python benchmarks/bench_codec.py --rounds 60 --columns  # and each column on its own
    python benchmarks/bench_codec.py --images 8            # and a column of 8 PIL images (448x448 RGB)
    python benchmarks/bench_codec.py --payloads --tensors 64 --ref HEAD  # only tensor columns of 64 rows
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]

from _payloads import make_batch  # noqa: E402

from syncreward import _codec as new_codec  # noqa: E402


def load_codec_at(ref: str) -> ModuleType | None:
    """``syncreward/_codec.py`` at a git ref, as module ``syncreward._codec_<ref>`` (None if git cannot)."""
    try:
        src = subprocess.run(
            ["git", "show", f"{ref}:syncreward/_codec.py"], cwd=ROOT, capture_output=True, check=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"# cannot load the codec at {ref!r} ({e}); comparing without it", file=sys.stderr)
        return None
    name = "syncreward._codec_" + "".join(c if c.isalnum() else "_" for c in ref)
    path = os.path.join(tempfile.mkdtemp(prefix="bench_codec_"), "_codec_ref.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # relative imports (from ._errors import ...) resolve within syncreward
    spec.loader.exec_module(module)
    return module


def codec_variant(codec: ModuleType, batch: dict[str, Any]) -> tuple[Callable[[], Any], Callable[[], Any], int]:
    n = len(next(iter(batch.values())))
    cols = [codec.Column(k, codec.container_of(v), v) for k, v in batch.items()]
    frame = bytes(codec.encode_frame(cols, n))
    nrows, back, _ = codec.decode_frame(frame)
    assert nrows == n
    assert {c.name: list(c.values) for c in back} == {k: list(v) for k, v in batch.items()}
    return (lambda: codec.encode_frame(cols, n)), (lambda: codec.decode_frame(frame)), len(frame)


def variants(
    batch: dict[str, Any], old: ModuleType | None
) -> dict[str, tuple[Callable[[], Any], Callable[[], Any], int]]:
    out: dict[str, tuple[Callable[[], Any], Callable[[], Any], int]] = {}
    if old is not None:
        out["old"] = codec_variant(old, batch)
    out["new"] = codec_variant(new_codec, batch)
    pick = pickle.dumps(batch, protocol=5)
    out["pickle"] = (lambda: pickle.dumps(batch, protocol=5)), (lambda: pickle.loads(pick)), len(pick)
    try:
        import msgpack
    except ImportError:
        pass
    else:
        packed = msgpack.packb(batch)
        out["msgpack"] = (lambda: msgpack.packb(batch)), (lambda: msgpack.unpackb(packed)), len(packed)
    return out


def _calls_per_sample(fn: Callable[[], Any], target_s: float = 0.002) -> int:
    """How many calls make one timing sample of about ``target_s`` (small payloads: many calls per sample)."""
    t0 = time.perf_counter()
    fn()
    return max(1, min(1000, int(target_s / max(time.perf_counter() - t0, 1e-7))))


def measure(vs: dict[str, tuple[Callable[[], Any], Callable[[], Any], int]], rounds: int) -> dict[str, Any]:
    """Interleaved timings: each round runs every variant's encode then decode, in a rotating order.

    One sample is ``k`` back-to-back calls (k chosen once per operation so that a sample takes ~2 ms)
    divided by ``k``; a garbage collection runs before each round, outside the timings.
    """
    names = list(vs)
    times: dict[str, dict[str, list[float]]] = {v: {"encode": [], "decode": []} for v in names}
    calls = {(v, i): _calls_per_sample(vs[v][i]) for v in names for i in (0, 1)}
    for r in range(rounds):
        gc.collect()
        order = names[r % len(names) :] + names[: r % len(names)]
        for v in order:
            for i, op in enumerate(("encode", "decode")):
                fn, k = vs[v][i], calls[v, i]
                t0 = time.perf_counter()
                for _ in range(k):
                    result = fn()
                times[v][op].append((time.perf_counter() - t0) / k)
                del result
    out: dict[str, Any] = {}
    for v in names:
        row: dict[str, Any] = {"bytes": vs[v][2]}
        for op in ("encode", "decode"):
            ts = sorted(times[v][op])
            row[f"{op}_min_ms"] = ts[0] * 1e3
            row[f"{op}_median_ms"] = ts[len(ts) // 2] * 1e3
        row["total_median_ms"] = row["encode_median_ms"] + row["decode_median_ms"]
        out[v] = row
    return out


def table(title: str, res: dict[str, Any]) -> str:
    ref = res.get("old")
    lines = [
        f"### {title}",
        "",
        "| variant | bytes | / pickle bytes | encode ms (min / median) | decode ms (min / median) "
        "| enc+dec median ms | / old | / pickle |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v, row in res.items():
        vs_old = f"{row['total_median_ms'] / ref['total_median_ms']:.2f}" if ref else "-"
        lines.append(
            f"| {v} | {row['bytes']:,} | {row['bytes'] / res['pickle']['bytes']:.2f} "
            f"| {row['encode_min_ms']:.2f} / {row['encode_median_ms']:.2f} "
            f"| {row['decode_min_ms']:.2f} / {row['decode_median_ms']:.2f} | {row['total_median_ms']:.2f} "
            f"| {vs_old} | {row['total_median_ms'] / res['pickle']['total_median_ms']:.2f} |"
        )
    if ref:
        new = res["new"]
        lines += [
            "",
            f"new vs old (medians): encode {new['encode_median_ms'] / ref['encode_median_ms']:.2f}x, "
            f"decode {new['decode_median_ms'] / ref['decode_median_ms']:.2f}x, "
            f"encode+decode {new['total_median_ms'] / ref['total_median_ms']:.2f}x, "
            f"bytes {new['bytes'] / ref['bytes']:.2f}x",
        ]
    return "\n".join(lines)


def image_variants(count: int, side: int) -> dict[str, tuple[Callable[[], Any], Callable[[], Any], int]]:
    """A named column of ``count`` RGB images ``side`` x ``side``: the new codec (raw pixels) vs pickle."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(count)]
    cols = [new_codec.Column("image", new_codec.C_LIST, images)]
    frame = bytes(new_codec.encode_frame(cols, count))
    back = new_codec.decode_frame(frame)[1][0].values
    assert all(a.tobytes() == b.tobytes() for a, b in zip(images, back, strict=True))
    pick = pickle.dumps(images, protocol=5)
    return {
        "new": ((lambda: new_codec.encode_frame(cols, count)), (lambda: new_codec.decode_frame(frame)), len(frame)),
        "pickle": ((lambda: pickle.dumps(images, protocol=5)), (lambda: pickle.loads(pick)), len(pick)),
    }


def tensor_variants(
    old: ModuleType | None, n: int, views: bool
) -> dict[str, tuple[Callable[[], Any], Callable[[], Any], int]]:
    """Tensor columns of ``n`` rows (rewards, token ids, logits): contiguous, or strided views of the same values.

    ``views`` makes every column a strided view (``logits[:, 1]``-style), which the codec copies to C order.
    """
    import torch

    g = torch.Generator().manual_seed(0)
    dense = {
        "rewards": torch.randn(n, generator=g),
        "completion_ids": torch.randint(0, 151_936, (n, 256), generator=g),
        "logits": torch.randn(n, 2, generator=g, dtype=torch.float32).bfloat16(),
    }
    batch = {k: torch.stack([v, v], dim=1)[:, 1] for k, v in dense.items()} if views else dense
    out: dict[str, tuple[Callable[[], Any], Callable[[], Any], int]] = {}
    for name, codec in (("old", old), ("new", new_codec)):
        if codec is None:
            continue
        cols = [codec.Column(k, codec.C_TENSOR, v) for k, v in batch.items()]
        try:
            frame = bytes(codec.encode_frame(cols, n))
        except Exception as e:  # an older codec that refuses these views
            print(f"# {name} codec cannot encode them: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        back = {c.name: c.values for c in codec.decode_frame(frame)[1]}
        assert all(torch.equal(back[k], v) for k, v in batch.items())
        out[name] = (
            (lambda cols=cols, codec=codec: codec.encode_frame(cols, n)),
            (lambda frame=frame, codec=codec: codec.decode_frame(frame)),
            len(frame),
        )
    pick = pickle.dumps(batch, protocol=5)
    out["pickle"] = (lambda: pickle.dumps(batch, protocol=5)), (lambda: pickle.loads(pick)), len(pick)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--payloads", nargs="*", default=["trl", "large"])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--ref", default="main", help="git ref of the codec to compare against ('' for none)")
    ap.add_argument("--columns", action="store_true", help="also measure each column on its own")
    ap.add_argument("--images", type=int, default=0, metavar="N", help="also N 448x448 RGB PIL images (a column)")
    ap.add_argument("--tensors", type=int, default=0, metavar="N", help="also tensor columns of N rows (and views)")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args()
    old = load_codec_at(args.ref) if args.ref else None
    results: dict[str, Any] = {}
    for payload in args.payloads:
        batch = make_batch(payload, 1, 4)
        cases = [("all columns", batch)]
        if args.columns:
            cases += [(name, {name: values}) for name, values in batch.items()]
        for what, b in cases:
            res = measure(variants(b, old), args.rounds)
            results[f"{payload}/{what}"] = res
            print(table(f"{payload}: {what} ({len(next(iter(b.values())))} rows, {args.rounds} rounds)", res))
            print(flush=True)
    if args.images:
        res = measure(image_variants(args.images, 448), args.rounds)
        results["images"] = res
        print(table(f"images: {args.images} RGB 448x448 PIL images ({args.rounds} rounds)", res))
        per = {v: (r["encode_median_ms"] / args.images, r["decode_median_ms"] / args.images) for v, r in res.items()}
        print(
            "\nper image (medians): "
            + ", ".join(f"{v} encode {e:.3f} ms / decode {d:.3f} ms" for v, (e, d) in per.items())
        )
    if args.tensors:
        for views in (False, True):
            what = "strided views" if views else "contiguous"
            res = measure(tensor_variants(old, args.tensors, views), args.rounds)
            results[f"tensors/{what}"] = res
            print(table(f"tensors, {what}: rewards, completion_ids (x256), logits ({args.tensors} rows)", res))
            print(flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
