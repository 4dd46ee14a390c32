"""Run ids: one scheme for every run bootstrap starts or names.

An id bootstrap picks is ``[KIND-]CLUSTER-YYYYmmdd-HHMMSS``, with ``-2``, ``-3``... when that second
is taken (two runs within one second must not share an id): ``lab-20261203-010203`` for a launch
(and the id `render` puts into the scripts), ``validate-lab-...`` for a validation,
``run-lab-...`` for a `bootstrap run -- CMD`. The cluster's name is free text ("GPU lab"): it is
reduced to what an id may hold (letters, digits, ``.``, ``_``, ``-``), the only characters
``--run`` and ``--run-id`` accept. An id the user chose is checked the same way, and refused when a
run of it was launched from here already.
"""

from __future__ import annotations

import difflib
import re
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.runs.layout import RECORD, RUNS_ROOT, read_record
from orchestrator.safefiles import private_dirs

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # .fullmatch only


def new_run_id(
    cluster: str,
    *,
    kind: str = "",
    chosen: str | None = None,
    root: Path = RUNS_ROOT,
    reserve: bool = True,
) -> str:
    """The id of a new run of ``cluster``: ``chosen`` when the user named one, else one picked
    (``[KIND-]CLUSTER-YYYYmmdd-HHMMSS[-N]``, unique under ``root``).

    ``reserve``: the run is about to start here: a picked id's directory under ``root`` is created
    at once (a launch started at the same moment gets the next id), a chosen id is refused when a
    run of it was launched from here. Without it (`render`, ``--dry-run``) nothing is created and a
    chosen id is only checked."""
    if chosen:
        return claim_run_id(chosen, root) if reserve else check_run_id(chosen)
    return pick_run_id(f"{kind}-{cluster}" if kind else cluster, root, reserve=reserve)


def pick_run_id(prefix: str, root: Path = RUNS_ROOT, *, reserve: bool = True) -> str:
    """A run id for a run the user did not name: ``PREFIX-YYYYmmdd-HHMMSS``, ``-2``, ``-3``... when
    that second is taken under ``root``. ``reserve``: its directory is created at once
    (atomically)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", prefix).strip("-._") or "run"
    base = f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}"
    if reserve:
        private_dirs(root)
    for n in range(1, 1000):
        candidate = check_run_id(base if n == 1 else f"{base}-{n}")
        if not reserve:
            if not (root / candidate).exists():
                return candidate
            continue
        try:
            (root / candidate).mkdir(mode=0o700)
        except FileExistsError:
            continue
        return candidate
    raise UsageError(f"no free run id for {base} in {root.resolve()}", hint="pass --run-id")


def release_run_id(run_id: str, root: Path = RUNS_ROOT) -> None:
    """A run id reserved (its directory made by :func:`pick_run_id`) for a run that started nowhere:
    its directory removed while it is still empty, so `--run latest` never means it."""
    try:
        (root / check_run_id(run_id)).rmdir()
    except OSError:
        pass  # not empty (a record, a log), or not there: kept as it is


def claim_run_id(run_id: str, root: Path = RUNS_ROOT) -> str:
    """A run id the user chose: refused when a run of that id was launched from here already."""
    check_run_id(run_id)
    if (root / run_id / RECORD).exists():
        raise UsageError(
            f"run {run_id} already exists here ({root / run_id}/)",
            hint=f"choose another --run-id, or leave it out for a new one; `logs --run {run_id}` "
            "(same inventory) shows the earlier run",
        )
    return run_id


def is_run_id(text: str) -> bool:
    """Whether ``text`` is a well-formed run id (what ``--run-id`` accepts)."""
    return _RUN_ID.fullmatch(text) is not None


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id):
        raise UsageError(
            f"invalid run id {run_id!r}: use letters, digits, '.', '_' and '-' (as `launch --run-id` does)"
        )
    if run_id == "latest":  # `--run latest` names the newest run: a run of that name could never be named
        raise UsageError(
            "the run id 'latest' is reserved: `--run latest` means the newest run; choose another"
        )
    return run_id


def require_run(run: str | None, command: str) -> str:
    """``run``, or a UsageError when ``command`` (stop) was given no ``--run``: named on purpose, as
    `status`'s default is not (click said only "Missing option '--run'")."""
    if run is None:
        raise UsageError(
            f"{command} needs the run to {command}: --run RUN",
            hint="`--run latest` is the newest run launched from this directory; `status` shows it",
        )
    return run


def _runs_here(root: Path) -> list[tuple[bool, float, str]]:
    """The runs under ``root``, as (launched from here, when, id): a launch that started nowhere
    (its record says ``not_started``) left out. When: the launch's start as its record says (the
    record is written again later: a `stop --run` of an old run made it the newest), else the time
    its record or directory was made."""
    found = []
    if root.is_dir():
        for entry in root.iterdir():
            if entry.is_dir() and _RUN_ID.fullmatch(entry.name):
                stamp = entry / RECORD
                # launched from here first (a record), newest first; then copies `logs` made
                launched = stamp.exists()
                record = (read_record(entry) or {}) if launched else {}
                if record.get("not_started"):
                    continue
                found.append((launched, _started(record, stamp if launched else entry), entry.name))
    return found


def _started(record: dict[str, object], made: Path) -> float:
    """When a run was launched: its record's ``started``, else ``made``'s time."""
    started = record.get("started")
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        return float(started)
    return made.stat().st_mtime


def resolve_run(run: str | None, root: Path = RUNS_ROOT, on_note: Callable[[str], None] | None = None) -> str:
    """``latest`` (or nothing): the newest run under ./runs (not a launch that started nowhere: its
    record says ``not_started``; ``on_note`` is told when such a launch is newer than the run taken,
    which would otherwise read as the new one's state); anything else is taken as a run id."""
    if run not in (None, "", "latest"):
        assert run is not None
        return check_run_id(run)
    candidates = _runs_here(root)
    if not candidates:
        raise UsageError(
            f"no runs in {root.resolve()} (run ids are kept where `bootstrap launch` ran)",
            hint="pass --run RUN-ID, or run this from the directory you launched from",
        )
    taken = max(candidates)
    newer = [name for when, name in _never_started(root) if when > taken[1]] if taken[0] else []
    if newer and on_note is not None:
        on_note(
            f"latest is run {taken[2]}: the newer launch{'es' if len(newer) > 1 else ''} "
            f"{', '.join(sorted(newer))} never started (refused, or cut short before training began)"
        )
    return taken[2]


def _never_started(root: Path) -> list[tuple[float, str]]:
    """(when, id) of the launches here whose record says they never started."""
    found = []
    for entry in root.iterdir() if root.is_dir() else []:
        stamp = entry / RECORD
        if not _RUN_ID.fullmatch(entry.name) or not stamp.is_file():
            continue
        if (record := read_record(entry) or {}).get("not_started"):
            found.append((_started(record, stamp), entry.name))
    return found


def nearest_run(run_id: str, root: Path = RUNS_ROOT) -> str | None:
    """The run here whose id is closest to ``run_id`` (a typo), None: none close."""
    close = difflib.get_close_matches(run_id, [name for _, _, name in _runs_here(root)], n=1, cutoff=0.8)
    return close[0] if close and close[0] != run_id else None


def runs_before(run_id: str, root: Path = RUNS_ROOT, most: int = 10) -> list[str]:
    """The runs launched from here before ``run_id``, newest first, at most ``most`` of them."""
    launched = sorted((when, name) for was, when, name in _runs_here(root) if was)
    names = [name for _, name in launched]
    at = names.index(run_id) if run_id in names else 0
    return names[max(0, at - most) : at][::-1]


def command_run_dir(cluster: str) -> Path:
    """Where `bootstrap run` keeps every node's whole output: a new run id of its own under the
    controller's state directory (``<state>/runs``), not ./runs, whose ids name training runs."""
    from orchestrator.logs import state_dir

    runs = state_dir() / "runs"
    return runs / new_run_id(cluster, kind="run", root=runs)
