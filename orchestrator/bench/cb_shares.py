"""cb_shares: each rank's share of every global batch, for DDP on unequal machines.

This file travels with the training script. `bootstrap launch` uploads it, and ``cb_shares.json``
(the shares it decided), into each node's run directory and names both in the ranks' environment:

- ``CB_SHARES_HELPER``: this file;
- ``CB_SHARES_FILE``: the JSON file: the mode (equal, measured, fixed), each rank's relative
  speed, the shares for a reference global batch, the probe's figures and when they were measured.

Both may start with ``~`` (the node's workdir): expand them with ``os.path.expanduser``. The run
directory is deliberately not put on ``sys.path`` (it would change what every import of the user's
code finds); a training script loads this file by its path::

    import importlib.util, os
    spec = importlib.util.spec_from_file_location(
        "cb_shares", os.path.expanduser(os.environ["CB_SHARES_HELPER"]))
    cb_shares = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cb_shares)

(or keep a copy of this file beside the script and ``import cb_shares``).

Standard library only at import; torch is imported by the parts that use it (the sample order,
:class:`StepTimer`). Nothing here imports cluster-bootstrap: the nodes do not need the package.

The mathematics. DDP averages gradients over the W ranks: g = (1/W) sum_r grad L_r. Rank r holds
n_r samples of a global batch of B = sum_r n_r samples. Scale rank r's mean loss by
s_r = n_r * W / B (:func:`loss_scale`); then g = (1/W) sum_r (n_r W / B) grad mean_r
= (1/B) sum_r sum_{i in r} grad l_i: the mean over the global batch, whatever the shares. With equal
shares s_r = 1: plain DDP. The global batches themselves do not depend on the shares (rank r takes
a contiguous piece of the same slice of one permutation), so training equals one process stepping
through the same global batches.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any

FORMAT = 1
HELPER_ENV = "CB_SHARES_HELPER"
FILE_ENV = "CB_SHARES_FILE"
#: what starts a metrics line (one JSON object after it, on one line)
METRIC_PREFIX = "CB_METRIC "
MODES = ("equal", "measured", "fixed")


class SharesError(ValueError):
    """Shares that cannot be used: the message names the file or value and what to do."""


def split_batch(total: int, weights: Sequence[float], minimum: int = 1) -> list[int]:
    """``total`` samples split in proportion to ``weights``: integers summing exactly to ``total``,
    none below ``minimum``.

    Largest remainder (Hamilton): each rank's quota is ``total * w / sum(w)``; a rank whose quota is
    below ``minimum`` gets ``minimum`` and the others share what is left (repeated until none is
    below); then each gets the whole part of its quota, and the samples still unassigned go one each
    to the largest fractional parts. Ties go to the larger weight, then to the lower rank. Exact
    rational arithmetic (``Fraction``): every rank computes the same shares from the same JSON.
    """
    if isinstance(total, bool) or not isinstance(total, int):
        raise SharesError(f"the global batch must be an integer, not {total!r}")
    if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 0:
        raise SharesError(f"the minimum share must be an integer >= 0, not {minimum!r}")
    count = len(weights)
    if count == 0:
        raise SharesError("no ranks to share the batch between")
    exact: list[Fraction] = []
    for rank, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise SharesError(f"rank {rank}: weight {weight!r} is not a finite number")
        if weight <= 0:
            raise SharesError(f"rank {rank}: weight {weight!r} must be > 0")
        exact.append(Fraction(weight))
    if total < count * minimum:
        raise SharesError(
            f"a global batch of {total} cannot give each of {count} ranks {minimum} sample(s): "
            f"use a global batch of at least {count * minimum}"
        )
    free = list(range(count))
    fixed: dict[int, int] = {}
    remaining = total
    while True:
        weight_sum = sum(exact[i] for i in free)
        quotas = {i: remaining * exact[i] / weight_sum for i in free}
        low = [i for i in free if quotas[i] < minimum]
        if not low:
            break
        # remaining >= len(free) * minimum always holds, so some rank stays free
        for i in low:
            fixed[i] = minimum
            remaining -= minimum
        free = [i for i in free if i not in fixed]
    shares = {i: math.floor(quotas[i]) for i in free}
    left = remaining - sum(shares.values())
    order = sorted(free, key=lambda i: (-(quotas[i] - shares[i]), -exact[i], i))
    for i in order[:left]:
        shares[i] += 1
    return [fixed[i] if i in fixed else shares[i] for i in range(count)]


def equal_shares(total: int, ranks: int) -> list[int]:
    """Today's DDP split: ``total // ranks`` each, one more for the first ``total % ranks`` ranks."""
    return split_batch(total, [1] * ranks)


def loss_scale(local: int, global_: int, world: int) -> float:
    """What rank's mean loss is multiplied by so that DDP's gradient average is the mean over the
    global batch: ``local * world / global_`` (1.0 with equal shares)."""
    if global_ <= 0:
        raise SharesError("the global batch is empty")
    return local * world / global_


class Shares:
    """The shares a run uses: from ``CB_SHARES_FILE`` (:func:`load_shares`), or equal."""

    def __init__(
        self,
        world_size: int,
        weights: Sequence[float],
        *,
        mode: str = "equal",
        global_batch: int | None = None,
        shares: Sequence[int] | None = None,
        measured_at: str | None = None,
        source: str = "",
        document: dict[str, Any] | None = None,
    ) -> None:
        self.world_size = world_size
        self.weights = list(weights)
        self.mode = mode
        self.global_batch = global_batch
        self.shares = None if shares is None else list(shares)
        self.measured_at = measured_at
        self.source = source  # the file read, "" when none (equal shares)
        self.document = document or {}

    def for_batch(self, global_batch: int) -> list[int]:
        """Each rank's share of a global batch of ``global_batch`` samples: the file's own shares when
        it is the batch they were decided for, else the same proportions (:func:`split_batch`)."""
        if self.shares is not None and global_batch == self.global_batch:
            return list(self.shares)
        return split_batch(global_batch, self.weights)

    def describe(self) -> str:
        """One line for a training log."""
        where = f"from {self.source}" if self.source else f"no {FILE_ENV}"
        when = f", measured at {self.measured_at}" if self.measured_at else ""
        return f"shares {self.mode} ({where}{when})"


def load_shares(world_size: int | None = None, path: str | None = None) -> Shares:
    """The shares of this run: ``path``, else ``$CB_SHARES_FILE``, else equal shares.

    ``world_size`` (default ``$WORLD_SIZE``) must be the file's: a file written for another world
    (another inventory, an elastic restart with fewer nodes) is an error, never silently reused.
    """
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if path is None:
        path = os.environ.get(FILE_ENV) or None
    if path is None:
        return Shares(world_size, [1.0] * world_size)
    path = os.path.expanduser(path)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise SharesError(
            f"{FILE_ENV}={path}: cannot read it ({exc.strerror or exc}): unset {FILE_ENV} for equal shares"
        ) from None
    except ValueError as exc:
        raise SharesError(f"{path}: not JSON ({exc})") from None
    return shares_from_document(doc, world_size, source=path)


def shares_from_document(doc: object, world_size: int, *, source: str = "<shares>") -> Shares:
    """Validate a shares document (the format `bootstrap launch` writes) against this world."""
    if not isinstance(doc, dict):
        raise SharesError(f"{source}: expected a JSON object")
    if doc.get("format") != FORMAT:
        raise SharesError(f"{source}: format {doc.get('format')!r}, this helper reads format {FORMAT}")
    mode = doc.get("mode")
    if mode not in MODES:
        raise SharesError(f"{source}: mode {mode!r} is not one of {', '.join(MODES)}")
    world = doc.get("world_size")
    if world != world_size:
        raise SharesError(
            f"{source}: written for a world of {world} rank(s), but this run has {world_size}: "
            "launch again (the file is rewritten for every launch)"
        )
    weights = doc.get("weights")
    if not isinstance(weights, list) or len(weights) != world_size:
        raise SharesError(f"{source}: weights must be a list of {world_size} numbers")
    try:
        split_batch(world_size, weights, minimum=0)  # checks every weight (finite, > 0)
    except SharesError as exc:
        raise SharesError(f"{source}: weights: {exc}") from None
    shares = doc.get("shares")
    global_batch = doc.get("global_batch")
    if shares is not None:
        if (
            not isinstance(shares, list)
            or len(shares) != world_size
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shares)
        ):
            raise SharesError(f"{source}: shares must be a list of {world_size} integers >= 1")
        if global_batch != sum(shares):
            raise SharesError(f"{source}: global_batch {global_batch!r} is not the sum of the shares")
    measured_at = doc.get("measured_at")
    return Shares(
        world_size,
        [float(w) for w in weights],
        mode=str(mode),
        global_batch=global_batch if shares is not None else None,
        shares=shares,
        measured_at=measured_at if isinstance(measured_at, str) else None,
        source=source,
        document=doc,
    )


class ShareBatchSampler:
    """A batch sampler giving rank ``rank`` its share of every global batch.

    ``DataLoader(dataset, batch_sampler=ShareBatchSampler(len(dataset), shares, rank))``. Every rank
    computes the same permutation of the dataset (``seed + epoch``, as DistributedSampler does); step
    ``s`` takes the global batch ``order[s*B : s*B + B]`` and rank ``r`` the contiguous piece
    ``shares[0] + ... + shares[r-1]`` onwards, ``shares[r]`` long. Nothing is padded or repeated.

    The last, partial global batch (``len(dataset) % B`` samples) is split in the same proportions,
    at least one sample per rank; it is dropped when it has fewer samples than there are ranks (an
    empty rank would stall DDP), or with ``drop_last=True``. Every rank has the same number of steps.
    """

    def __init__(
        self,
        dataset_size: int,
        shares: Sequence[int],
        rank: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shares) or not shares:
            raise SharesError(f"shares must be integers >= 1, one per rank, not {list(shares)!r}")
        if not 0 <= rank < len(shares):
            raise SharesError(
                f"rank {rank} has no share: {len(shares)} share(s) for ranks 0-{len(shares) - 1}"
            )
        self.dataset_size = dataset_size
        self.shares = list(shares)
        self.rank = rank
        self.world = len(self.shares)
        self.global_batch = sum(self.shares)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.full_steps, tail = divmod(dataset_size, self.global_batch)
        self.tail_shares: list[int] | None = None
        if tail and not drop_last and tail >= self.world:
            self.tail_shares = split_batch(tail, self.shares)
        if len(self) == 0:
            raise SharesError(
                f"a dataset of {dataset_size} sample(s) gives no step with a global batch of "
                f"{self.global_batch} over {self.world} rank(s)"
            )

    def set_epoch(self, epoch: int) -> None:
        """A new permutation each epoch, the same on every rank."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.full_steps + (1 if self.tail_shares is not None else 0)

    def step_shares(self, step: int) -> list[int]:
        """Every rank's share at ``step`` (0-based, within the epoch)."""
        if step < self.full_steps:
            return self.shares
        if step == self.full_steps and self.tail_shares is not None:
            return self.tail_shares
        raise IndexError(f"step {step} of an epoch of {len(self)} steps")

    def global_batch_size(self, step: int) -> int:
        return sum(self.step_shares(step))

    def local_batch_size(self, step: int) -> int:
        return self.step_shares(step)[self.rank]

    def loss_scale(self, step: int) -> float:
        """:func:`loss_scale` for this rank at ``step``: multiply the mean loss by it before backward."""
        shares = self.step_shares(step)
        return loss_scale(shares[self.rank], sum(shares), self.world)

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.dataset_size))
        import torch

        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order: list[int] = torch.randperm(self.dataset_size, generator=generator).tolist()
        return order

    def __iter__(self) -> Iterator[list[int]]:
        order = self._order()
        for step in range(len(self)):
            shares = self.step_shares(step)
            start = step * self.global_batch + sum(shares[: self.rank])
            yield order[start : start + shares[self.rank]]


class StepTimer:
    """Per step, the wall time and this rank's compute time: from :meth:`start` to the moment its
    gradients are ready (a DDP communication hook sees that); the rest of a step is communication
    and waiting for slower ranks.

    ``StepTimer(ddp_model, device)`` before the first step (it registers the hook; DDP takes one
    hook, before training starts). Call :meth:`start` when a step begins and :meth:`stop` after
    ``optimizer.step()``; :meth:`window` returns the figures since its previous call (or since
    :meth:`reset`, which also clears :attr:`totals`: call it after warm-up steps). On CUDA the
    compute times come from CUDA events (kernels run asynchronously), read only in :meth:`window`.
    When the hook cannot be registered (``hooked`` False), compute times are None.
    """

    def __init__(self, ddp_model: Any, device: Any = None) -> None:
        self._cuda = getattr(device, "type", None) == "cuda"
        self._step_start: Any = None
        self._ready: Any = None
        self.hooked = False
        try:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            self._allreduce = default_hooks.allreduce_hook
            # a lambda: DDP checks a hook's annotations, and this file's are strings (PEP 563)
            ddp_model.register_comm_hook(None, lambda state, bucket: self._hook(state, bucket))
            self.hooked = True
        except Exception:  # not a DDP model, or no comm hooks in this torch for this backend
            self.hooked = False
        self.reset()

    def reset(self) -> None:
        """Forget the current window and the totals (after warm-up steps)."""
        self._window_start: float | None = None
        self._window_steps = 0
        self._window_compute = 0.0
        self._pending: list[tuple[Any, Any]] = []  # CUDA: (start event, ready event) per step
        self.totals: dict[str, float] = {"steps": 0, "seconds": 0.0, "compute": 0.0}

    def _now(self) -> Any:
        if self._cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            return event
        return time.perf_counter()

    def _hook(self, state: Any, bucket: Any) -> Any:
        # called when a bucket of gradients is ready: the last call of a step ends its compute
        self._ready = self._now()
        return self._allreduce(state, bucket)

    def _sync(self) -> None:
        if self._cuda:
            import torch

            torch.cuda.synchronize()

    def start(self) -> None:
        if self._window_start is None:
            self._sync()
            self._window_start = time.perf_counter()
        self._step_start = self._now()
        self._ready = None

    def stop(self) -> None:
        self._window_steps += 1
        if self._ready is None or self._step_start is None:
            return
        if self._cuda:
            self._pending.append((self._step_start, self._ready))
        else:
            self._window_compute += self._ready - self._step_start

    def window(self) -> dict[str, Any]:
        """``{"steps", "seconds" (wall), "compute" (summed; None without the hook)}`` since the
        previous call, also added to :attr:`totals`."""
        self._sync()
        now = time.perf_counter()
        seconds = now - self._window_start if self._window_start is not None else 0.0
        compute = self._window_compute + sum(s.elapsed_time(r) / 1000.0 for s, r in self._pending)
        out = {"steps": self._window_steps, "seconds": seconds, "compute": compute if self.hooked else None}
        self.totals["steps"] += self._window_steps
        self.totals["seconds"] += seconds
        self.totals["compute"] += compute
        self._window_start = None
        self._window_steps = 0
        self._window_compute = 0.0
        self._pending = []
        return out


def metric_line(**fields: Any) -> str:
    """``CB_METRIC {"step": ..., ...}``: the line `bootstrap bench --scaling` reads."""
    return METRIC_PREFIX + json.dumps(fields, sort_keys=True, separators=(",", ":"))


def print_metric(**fields: Any) -> None:
    """Print a metrics line in one write (ranks share a terminal: a line must never be split)."""
    sys.stdout.write(metric_line(**fields) + "\n")
    sys.stdout.flush()


def parse_metric(text: str) -> dict[str, Any] | None:
    """The fields of a metrics line (anything before ``CB_METRIC`` is ignored), or None."""
    at = text.find(METRIC_PREFIX)
    if at < 0:
        return None
    try:
        value = json.loads(text[at + len(METRIC_PREFIX) :])
    except (ValueError, RecursionError):  # not a record (nested past the parser's depth too)
        return None
    return value if isinstance(value, dict) else None
