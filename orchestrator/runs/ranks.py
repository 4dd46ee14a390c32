"""How a run's lines name their rank: every line a rank prints reaches node.log as ``[defaultN]:text``
(the node's rank capture, steps/probes/rank_capture.py, and launch.ps1 on native Windows), and the
controller turns N into the global rank it shows (``[node:rank] text``)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from orchestrator import records

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory

_RANK_LINE = re.compile(r"^\[default(\d+)\]:(.*)$")


def split_rank(line: str) -> tuple[int | None, str]:
    """``[default3]:text`` -> (3, "text"); torchrun's own lines have no rank."""
    if not line.startswith("[default"):  # every line of a log passes here: skip the regex when we can
        return None, line
    match = _RANK_LINE.match(line)
    if match is None:
        return None, line
    return int(match.group(1)), match.group(2)


def split_worker_rank(line: str) -> tuple[int | None, str]:
    """A line of one of our own rank workers (validation, the throughput probe), which tag their lines
    ``[defaultN]:`` themselves: on native Windows launch.ps1 tags them again
    (``[default1]:[default1]:RECORD``); either way (1, "RECORD")."""
    local, rest = split_rank(line)
    if rest.startswith("[default"):
        inner, inner_rest = split_rank(rest)
        if inner is not None:
            return inner if local is None else local, inner_rest
    return local, rest


def worker_record(line: str, nonce: str, kind: str) -> tuple[int | None, dict[str, Any] | None, str]:
    """A line of one of our rank workers: its local rank, the JSON object it carries when it is a
    ``kind`` record of ``nonce`` (else None: the line is plain output, whatever it looks like), and
    its text after the tags."""
    local, rest = split_worker_rank(line)
    found = records.decode_line(rest, nonce) if rest.startswith(records.MARK) else None
    if found is None or found.kind != kind:
        return local, None, rest
    try:
        data = json.loads(found.fields[0]) if found.fields else None
    except ValueError:
        data = None
    return local, data if isinstance(data, dict) else None, rest


def owned_rank(record: dict[str, object], node: str, rank: int | None, owner: str | None) -> int | None:
    """The rank of a worker's ``record`` when ``node`` may speak for it, else None (a forgery).

    ``node`` is the sending connection's node, ``rank`` the global rank its line's ``[defaultN]:`` tag
    gives (the node's first rank + N), ``owner`` the node that rank belongs to: the record's own
    ``"rank"`` counts only when it is that rank and the sender owns it. A node can then never speak
    for another node's ranks (blame them, slow them down, name their devices)."""
    said = record.get("rank")
    if not isinstance(said, int) or isinstance(said, bool) or rank is None or said != rank or owner != node:
        return None
    return said


def rank_labels(inventory: Inventory) -> dict[str, tuple[int, int]]:
    """Per node, how the ``[defaultN]:`` tags of its lines become global ranks: ``(first, count)``,
    the rank of N = 0 and how many N there are. Static rendezvous: ranks follow the node-rank order
    (Inventory.rank_order, as plan_launch) and N is the local rank. Elastic: each rendezvous assigns
    the ranks, so the launch script's rank capture tags lines with the global rank itself (RANK,
    CB_RANK_LABEL=global, see probes/rank_capture.py): N is the global rank, first 0."""
    if inventory.cluster.train.elastic:
        world = sum(node.nproc for node in inventory.nodes)
        return {node.name: (0, world) for node in inventory.nodes}
    labels, first = {}, 0
    for node in inventory.rank_order:
        labels[node.name] = (first, node.nproc)
        first += node.nproc
    return labels
