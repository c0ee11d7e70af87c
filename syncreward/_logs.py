"""TRL's ``log_extra`` / ``log_metric`` inside a synced reward: recorded where it scores, replayed per rank.

TRL passes every reward ``log_extra(column, values)`` (one value per sample, shown in the completions
table) and ``log_metric(name, value)``. A synced reward is scored on a batch that is not the rank's
own, so its calls are *recorded* where it runs, sliced to each rank's own samples, sent back with the
results, and *replayed* on every rank with that rank's slice -- so every rank logs the same keys and
the completions table stays row-aligned.

TRL averages the ``log_metric`` values of a step over its calls on all ranks. So every rank replays the
same value: in ``mode="main"`` the one scoring rank's value; in ``mode="shard"``, where each scoring rank
logs for its share of the batch, one value per name and call, the scoring ranks' values weighted by the
number of samples each scored (:meth:`Logs.replay_scattered`) -- the batch's value for a per-sample mean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._binding import Bound
from ._errors import InputError

__all__ = ["Logs", "Record"]

Record = tuple[str, str, Any]  # ("extra", column, values) or ("metric", name, value)


def _caller_function(bound: Bound | None, name: str) -> Callable[..., Any] | None:
    """The caller's own ``log_extra``/``log_metric``, if the call passed one (named or through ``**kwargs``)."""
    value = bound.shared_value(name) if bound is not None else None
    return value if callable(value) else None


class Logs:
    """The log calls of one synced call."""

    def __init__(self, bound: Bound | None, function: str) -> None:
        self.function = function
        self._bound = bound
        self.records: list[Record] = []

    # Looked up where used, not when made: most calls log nothing, and their Logs replay no records.

    @property
    def extra(self) -> Callable[..., Any] | None:
        """The caller's own ``log_extra``, if the call passed one."""
        return _caller_function(self._bound, "log_extra")

    @property
    def metric(self) -> Callable[..., Any] | None:
        """The caller's own ``log_metric``, if the call passed one."""
        return _caller_function(self._bound, "log_metric")

    def recording(self) -> dict[str, Any]:
        """Stand-ins that record the function's log calls (the caller's are replayed later)."""
        proxies: dict[str, Any] = {}
        if self.extra is not None:
            proxies["log_extra"] = lambda column, values: self.records.append(("extra", column, list(values)))
        if self.metric is not None:
            proxies["log_metric"] = lambda name, value: self.records.append(("metric", name, value))
        return proxies

    def forwarding(self, lo: int, hi: int, total: int) -> dict[str, Any]:
        """``log_extra`` that forwards only samples ``lo:hi`` of ``total`` (every rank scores the whole batch)."""
        real = self.extra
        if real is None:
            return {}

        def log_extra(column: str, values: Sequence[Any]) -> None:
            self._check(column, values, total)
            real(column, list(values)[lo:hi])

        return {"log_extra": log_extra}

    def _check(self, column: str, values: Sequence[Any], n: int) -> None:
        if len(values) != n:
            raise InputError(
                f"log_extra({column!r}, values) was called with {len(values)} values inside synced function "
                f"{self.function!r}, which scores {n} samples here; pass one value per sample."
            )

    def check(self, n: int) -> None:
        """Every recorded ``log_extra`` has one value per scored sample."""
        for kind, key, value in self.records:
            if kind == "extra":
                self._check(key, value, n)

    def check_metrics(self) -> None:
        """Every recorded ``log_metric`` value is a number (shard mode averages them), made a ``float``."""
        for i, (kind, key, value) in enumerate(self.records):
            if kind != "metric":
                continue
            try:
                number = float(value)
            except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of several elements
                raise InputError(
                    f"log_metric({key!r}, value) was called with a {type(value).__name__} inside synced function "
                    f"{self.function!r} in mode='shard', which averages each metric over the scoring ranks. HINT: "
                    "pass a number (a float, an int or a one-element tensor)."
                ) from None
            self.records[i] = (kind, key, number)

    def rows(self, rows: slice | Sequence[int]) -> list[Record]:
        """The records as the owner of the given scored rows replays them (metrics whole, extras sliced)."""
        out: list[Record] = []
        for kind, key, value in self.records:
            if kind == "extra":
                value = value[rows] if isinstance(rows, slice) else [value[i] for i in rows]
            out.append((kind, key, value))
        return out

    def replay(self, records: Sequence[Sequence[Any]]) -> None:
        """Call the caller's own log functions with records received from the scoring rank(s)."""
        for kind, key, value in records:
            fn = self.extra if kind == "extra" else self.metric
            if fn is not None:
                fn(key, value)

    def replay_scattered(self, n: int, parts: Sequence[tuple[Sequence[int], Sequence[Sequence[Any]], int]]) -> None:
        """Replay the records of several scoring ranks, each metric once per call.

        ``parts`` holds, per scoring rank in rank order, the local rows it scored, its records and the
        number of samples it scored in all.

        Each metric is replayed once: the mean over the scoring ranks that logged it of their values (a rank
        that logged it several times: the mean of its values), weighted by the samples each scored, in order
        of first appearance (where no rank scored a sample -- an empty global batch, which one rank scores --
        the plain mean: that rank's value). Every rank receives every scoring rank's records, so every rank
        replays the same value, which TRL's average over the ranks keeps. The ``log_extra`` values of one
        column are put back into local sample order (rows no scoring rank logged stay ``None``) and replayed
        once per column.
        """
        extras: dict[str, list[Any]] = {}
        # name -> [sum of weight x the rank's mean, sum of weights, sum of the ranks' means, ranks]
        metrics: dict[str, list[float]] = {}
        for local_rows, records, scored in parts:
            logged: dict[str, list[float]] = {}
            for kind, key, value in records:
                if kind == "metric":
                    logged.setdefault(key, []).append(float(value))
                    continue
                col = extras.setdefault(key, [None] * n)
                for i, v in zip(local_rows, value, strict=True):
                    col[i] = v
            for key, values in logged.items():
                mean = sum(values) / len(values)
                total = metrics.setdefault(key, [0.0, 0.0, 0.0, 0.0])
                total[0] += scored * mean
                total[1] += scored
                total[2] += mean
                total[3] += 1
        for key, (weighted, weight, plain, ranks) in metrics.items():
            self.replay([("metric", key, weighted / weight if weight else plain / ranks)])
        for key, col in extras.items():
            self.replay([("extra", key, col)])
