"""Past runs as the dashboard lists them: each ``runs/<run-id>/`` here with its record (run.json), the
node logs the controller kept and a `bench --scaling` page when there is one. Read-only."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.redact import mask_credentials_in, mask_secrets, maskable
from orchestrator.runs.layout import read_record
from orchestrator.safefiles import NOFOLLOW

#: past runs listed (the newest first)
LISTED = 50
#: bytes of a node's log the page gets (its end): the whole log stays in runs/ here
LOG_TAIL = 256 * 1024
#: `bench --scaling`'s page in a run's directory (orchestrator/bench/engine.py)
BENCH_PAGE = "scaling.html"


def past_runs(root: Path) -> list[dict[str, Any]]:
    """The newest ``LISTED`` runs under ``root``: id, start time, nodes, training arguments, which
    node logs are here and whether a scaling page is."""
    try:
        entries = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    runs: list[dict[str, Any]] = []
    for entry in entries:
        record = read_record(Path(entry.path)) or {}
        try:
            names = sorted(os.listdir(entry.path))
        except OSError:
            continue
        started, train = record.get("started"), record.get("train")
        runs.append(
            {
                "run_id": entry.name,
                "started": started if isinstance(started, (int, float)) else entry.stat().st_mtime,
                "detached": bool(record.get("detached")),
                "nodes": sorted(record["nodes"]) if isinstance(record.get("nodes"), dict) else [],
                # a URL's login masked again: a record an older version wrote kept it
                "train": mask_credentials_in(train) if isinstance(train, dict) else None,
                "logs": [n[: -len(".log")] for n in names if n.endswith(".log")],
                "bench_page": BENCH_PAGE in names,
            }
        )
    runs.sort(key=lambda r: float(r["started"]), reverse=True)
    return runs[:LISTED]


def _inside(root: Path, run_id: str, name: str) -> Path | None:
    """``root/run_id/name`` when both parts are plain names (no separator, no ``..``)."""
    for part in (run_id, name):
        if not part or part in (".", "..") or "/" in part or "\\" in part or "\0" in part:
            return None
    return root / run_id / name


def run_log_tail(root: Path, run_id: str, node: str, secrets: Sequence[str] = ()) -> str | None:
    """The last ``LOG_TAIL`` bytes of ``runs/<run_id>/<node>.log`` (``secrets`` and URL credentials
    masked), None when there is no such log."""
    path = _inside(root, run_id, f"{node}.log")
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(max(0, size - LOG_TAIL))
        data = fh.read(LOG_TAIL)
    text = data.decode("utf-8", errors="replace")
    if size > LOG_TAIL:
        text = text.split("\n", 1)[-1]  # from the first whole line
    return mask_secrets(text, maskable(secrets))  # as the live page masks


def bench_page(root: Path, run_id: str) -> bytes | None:
    """A run's `bench --scaling` page (our own HTML: no script in it), None when there is none."""
    path = _inside(root, run_id, BENCH_PAGE)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()
