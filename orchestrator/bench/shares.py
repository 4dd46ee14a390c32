"""Each rank's share of a global batch: the arithmetic and the file a launch ships.

The split itself (:func:`split_batch`, largest remainder in exact rational arithmetic) lives in the
node-side helper ``cb_shares.py``, so that the controller and every rank compute the same integers
from the same figures; this module adds what only the controller does: shares from the inventory's
``cluster.train.shares`` (equal, measured, or a fixed list per rank or per node), and the JSON
document (``cb_shares.json``) uploaded beside the helper.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.bench.cb_shares import (
    FILE_ENV,
    FORMAT,
    HELPER_ENV,
    SharesError,
    equal_shares,
    loss_scale,
    split_batch,
)
from orchestrator.resources import package_file

__all__ = [
    "FILE_ENV",
    "HELPER_ENV",
    "SHARES_FILE",
    "SHARES_HELPER",
    "SharesDoc",
    "SharesError",
    "equal_shares",
    "fixed_weights",
    "loss_scale",
    "shares_env",
    "split_batch",
]

#: the names the files get in each node's run directory
SHARES_HELPER = "cb_shares.py"
SHARES_FILE = "cb_shares.json"


def shares_helper_file() -> Path:
    """The node-side helper, as shipped in the package."""
    return package_file("bench/cb_shares.py")


def fixed_weights(values: Sequence[int], nprocs: Sequence[int]) -> list[int]:
    """``cluster.train.shares`` as a list: one integer per rank, or one per node (in inventory order),
    a node's value then split equally between its ranks. Per rank: the values as they are.

    The two readings never disagree: a list as long as the number of nodes and of ranks means every
    node has one rank. Anything else is a :class:`SharesError` saying which lengths would do.
    """
    ranks = sum(nprocs)
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SharesError(f"item {index + 1} ({value!r}) is not an integer >= 1")
    if len(values) == ranks:
        return list(values)
    if len(values) == len(nprocs):
        out: list[int] = []
        for node_index, (value, nproc) in enumerate(zip(values, nprocs, strict=True)):
            if value < nproc:
                raise SharesError(
                    f"item {node_index + 1} ({value}) is less than that node's {nproc} ranks: "
                    "every rank needs at least one sample"
                )
            out.extend(equal_shares(value, nproc))
        return out
    raise SharesError(
        f"{len(values)} number(s), but the cluster has {len(nprocs)} node(s) and {ranks} rank(s): "
        f"give one per rank ({ranks}) or one per node ({len(nprocs)}), in inventory order"
    )


@dataclass
class SharesDoc:
    """What ``cb_shares.json`` holds (format 1, read by ``cb_shares.load_shares``)."""

    mode: str  # "equal", "measured", "fixed"
    weights: list[float]  # each rank's relative speed (samples/s for measured), in global rank order
    shares: list[int] | None = None  # for global_batch (None: equal shares of any batch)
    measured_at: str | None = None  # UTC, ISO 8601 (measured only)
    probe: dict[str, Any] | None = None  # the probe's figures (measured only)
    ranks: list[dict[str, Any]] = field(default_factory=list)  # rank -> node, local rank

    @property
    def world_size(self) -> int:
        return len(self.weights)

    @property
    def global_batch(self) -> int | None:
        return None if self.shares is None else sum(self.shares)

    @classmethod
    def equal(cls, world_size: int) -> SharesDoc:
        return cls("equal", [1.0] * world_size)

    @classmethod
    def fixed(cls, shares: Sequence[int]) -> SharesDoc:
        return cls("fixed", [float(s) for s in shares], list(shares))

    @classmethod
    def measured(
        cls,
        rates: Sequence[float],
        *,
        global_batch: int,
        measured_at: str,
        probe: dict[str, Any] | None = None,
    ) -> SharesDoc:
        """Shares of ``global_batch`` in proportion to each rank's measured samples/s."""
        return cls(
            "measured",
            [float(r) for r in rates],
            split_batch(global_batch, list(rates)),
            measured_at=measured_at,
            probe=probe,
        )

    def for_batch(self, global_batch: int) -> list[int]:
        """The shares a rank computes for a global batch of this size (cb_shares.Shares.for_batch)."""
        if self.shares is not None and global_batch == self.global_batch:
            return list(self.shares)
        return split_batch(global_batch, self.weights)

    def document(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "mode": self.mode,
            "world_size": self.world_size,
            "weights": self.weights,
            "shares": self.shares,
            "global_batch": self.global_batch,
            "measured_at": self.measured_at,
            "probe": self.probe,
            "ranks": self.ranks,
        }

    def to_json(self) -> str:
        return json.dumps(self.document(), indent=1, sort_keys=True) + "\n"


def shares_env(run_dir: str) -> dict[str, str]:
    """The ranks' environment naming the helper and the shares file in the node's run directory
    (``~`` kept: the helper expands it, the scripts quote it)."""
    return {HELPER_ENV: f"{run_dir}/{SHARES_HELPER}", FILE_ENV: f"{run_dir}/{SHARES_FILE}"}


def rank_layout(nodes: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    """``[(node name, nproc)]`` in rank order -> one entry per global rank."""
    out: list[dict[str, Any]] = []
    for name, nproc in nodes:
        for local in range(nproc):
            out.append({"rank": len(out), "node": name, "local_rank": local})
    return out


def doc_for_setting(
    setting: str | Sequence[int], nodes: Sequence[tuple[str, int]], listed: Sequence[str] | None = None
) -> SharesDoc | None:
    """The shares a ``cluster.train.shares`` setting gives without measuring anything: equal, or the
    fixed list; None for ``measured`` (the probe decides).

    ``nodes``: ``(name, nproc)`` in rank order; ``listed``: the node names in the order a fixed list
    gives them (inventory order), when that differs from rank order (a master that is not the first
    node): each node keeps its own values."""
    nprocs = [n for _name, n in nodes]
    if setting == "measured":
        return None
    if setting == "equal":
        doc = SharesDoc.equal(sum(nprocs))
    elif isinstance(setting, str):
        raise SharesError(f"unknown shares setting {setting!r}: equal, measured, or a list of integers")
    else:
        nproc_of = dict(nodes)
        order = [name for name in (listed or [name for name, _n in nodes]) if name in nproc_of]
        weights = fixed_weights(list(setting), [nproc_of[name] for name in order])
        per_node: dict[str, list[int]] = {}
        for name in order:
            per_node[name], weights = weights[: nproc_of[name]], weights[nproc_of[name] :]
        doc = SharesDoc.fixed([w for name, _n in nodes for w in per_node[name]])
    doc.ranks = rank_layout(nodes)
    return doc


def describe_shares(shares: Sequence[int], nodes: Mapping[int, str] | None = None) -> str:
    """``node1 64, node2 58, node3 6 (of 128)``; without nodes, ``64, 58, 6 (of 128)``."""
    parts = [f"{nodes.get(r, '?')} {s}" if nodes else str(s) for r, s in enumerate(shares)]
    return f"{', '.join(parts)} (of {sum(shares)})"
