"""A node's samples during a run (GPU use where nvidia-smi answers, CPU load otherwise), as the rank
capture frames them into the run's output (steps/probes/rank_capture.py) and `status` reads them."""

from __future__ import annotations

from typing import Any

from orchestrator.records import Record


def gpu_reading(line: str) -> dict[str, Any] | None:
    """One CSV line of ``nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total
    --format=csv,noheader,nounits``; a value the GPU does not report (``[N/A]``) is None."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != 4 or not cells[0]:
        return None
    return {
        "index": cells[0],
        "util_percent": _number(cells[1]),
        "mem_used_mib": _number(cells[2]),
        "mem_total_mib": _number(cells[3]),
    }


def node_sample(found: Record) -> dict[str, Any] | None:
    """A sample record as the dashboard keeps it: ``{"gpus": [...]}`` or ``{"load": .., "cpus": ..}``;
    None for any other record."""
    if found.kind == "gpu":
        gpus = [g for g in (gpu_reading(t) for t in found.texts) if g is not None]
        return {"gpus": gpus} if gpus else None
    if found.kind == "cpu":
        cpus = _number(found.text(1))
        return {"load": _number(found.text(0)), "cpus": None if cpus is None else int(cpus)}
    return None


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None
