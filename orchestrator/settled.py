"""An unchanged re-run said briefly: a phase of the main pipeline that found every node as it should
be, changed nothing and has nothing to warn about is one line instead of its tables (docs/daily.md).

Each function returns that line, or None when the phase's report has anything to show: a change, a
failure, a warning, a note, a dry run. Only the pipeline asks, and only for a cluster that passed
validation before (pipeline.py ``_phase``); `-v`, `--json` and the phases' own commands show it all.
"""

from __future__ import annotations

from typing import Any

from orchestrator.steps.contract import Report


def settled_line(phase: str, report: Any) -> str | None:
    """The phase's one line when it settled nothing new; else None (its report is shown whole)."""
    if phase == "sync":
        return _sync(report)
    if not isinstance(report, Report) or report.dry_run or report.warnings or report.failing:
        return None
    if any(not o.ok or o.value is None for o in report.outcomes) or not report.outcomes:
        return None
    if any(plan.actions for plan in report.plans.values()):
        return None
    values = [o.value for o in report.outcomes]
    if phase == "firewall":
        return _firewall(values)
    if phase == "ntp":
        return _time(report.data, values)
    if phase == "check":
        return _check(report)
    return None


def _nodes(count: int) -> str:
    return f"{count} node{'s' if count != 1 else ''}"


def _sync(report: Any) -> str | None:
    if report.dry_run or report.exit_code != 0 or report.master_note or report.summary.mismatch:
        return None
    env, code = report.env, report.code
    if any(o.value is None or o.value.action != "unchanged" for o in env):
        return None
    if any(
        o.value is None or o.value.added or o.value.changed or o.value.deleted or o.value.kept for o in code
    ):
        return None
    parts = []
    if env:
        parts.append(f"environment unchanged on {_nodes(len(env))}")
    if code:
        files = {o.value.files for o in code}
        counted = f" ({next(iter(files))} file{'s' if files != {1} else ''})" if len(files) == 1 else ""
        parts.append(f"code unchanged on {_nodes(len(code))}{counted}")
    return f"sync: {'; '.join(parts)}" if parts else None


def _firewall(values: list[Any]) -> str | None:
    if any(v.changed or v.commands for v in values):
        return None
    kinds: dict[str, int] = {}
    for v in values:
        kinds[v.kind] = kinds.get(v.kind, 0) + 1
    named = {kind: "no active firewall" if kind == "none" else kind for kind in kinds}
    if len(kinds) == 1:
        (kind,) = kinds
        said = (
            f"{named[kind]} on {'any' if kind == 'none' else 'every'} node"
            if len(values) > 1
            else named[kind]
        )
    else:
        said = ", ".join(f"{named[kind]} on {count}" for kind, count in sorted(kinds.items()))
    return f"firewall: nothing to change on {_nodes(len(values))} ({said})"


def _time(data: dict[str, Any], values: list[Any]) -> str | None:
    if any(v.problem or v.state not in ("unchanged", "measured") for v in values):
        return None
    offsets = [abs(v.offset_ms) for v in values if v.offset_ms is not None]
    within = f"; largest offset from the master {max(offsets):.1f} ms" if offsets else ""
    limit = data.get("max_offset_ms")
    return f"time: unchanged on {_nodes(len(values))}, following {data.get('master')}{within}" + (
        f" (limit {limit:g} ms)" if limit is not None and offsets else ""
    )


def _check(report: Report[Any]) -> str | None:
    for value in (o.value for o in report.outcomes):
        if (
            value is None
            or value.failed
            or value.notes
            or value.inspected.recorded_host_keys
            or value.inspected.facts.errors
        ):
            return None
        if any(verdict.level != "ok" for verdict in value.checks.values()):
            return None
    if len({tuple(v.values()) for v in report.data.get("versions", {}).values()}) > 1:
        return None
    n = len(report.outcomes)
    return f"check: {n}/{n} nodes ready to train, every check ok (backend {report.data['backend']})"
