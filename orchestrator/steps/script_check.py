"""Checks of the training inputs on this machine, before anything connects: a Python syntax error in
the training script (found in a second, not after the whole pipeline and torchrun started) and the
files the inventory names relative to itself (env.requirements), resolved exactly as sync does."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import UsageError
from orchestrator.resources import packaged_example

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory


def script_file(inventory: Inventory) -> Path | None:
    """The training script as it is here: in the synced project (``cluster.code``), else the file
    launch uploads; None when it is on the nodes only (absolute) or not here."""
    from orchestrator.inventory.model import WINDOWS_ABSOLUTE
    from orchestrator.steps.codesync import code_source

    script = inventory.cluster.train.script
    if script.startswith("/") or WINDOWS_ABSOLUTE.match(script):
        return None
    if inventory.cluster.code_declared:
        path = code_source(inventory.cluster) / script
        try:
            return path if path.is_file() else None
        except (OSError, ValueError):
            return None
    return local_script(script)


def near_name(directory: Path, script: str) -> str | None:
    """A file beside where ``script`` would be in ``directory`` whose name is close to its name (a
    typo: trian.py for train.py), as ``script`` names it; None: none."""
    import difflib

    wanted = Path(script)
    try:
        names = [p.name for p in (directory / wanted.parent).iterdir() if p.is_file()]
    except OSError:
        return None
    close = difflib.get_close_matches(wanted.name, names, n=1, cutoff=0.75)
    return str(wanted.parent / close[0]) if close else None


def check_script_compiles(inventory: Inventory) -> None:
    """A UsageError (exit 2), one line naming the file and line, when the training script is Python
    that does not compile here. Compiled only, never run; a script that is not ``.py`` is skipped.
    A relative script that is not here while a file of a close name is (trian.py for train.py): the
    same, naming the inventory's field and the file meant (every node would fail on it)."""
    path = script_file(inventory)
    script = inventory.cluster.train.script
    if path is None and not script.startswith("/") and ":" not in script[:3]:
        from orchestrator.steps.codesync import code_source

        here = code_source(inventory.cluster) if inventory.cluster.code_declared else Path.cwd()
        if typo := near_name(here, script):
            named = "--script" if "script" in inventory.run_overrides else f"{inventory.source}: train.script"
            raise UsageError(
                f"{named} {script!r} is not in {here} (did you mean {typo!r}?): "
                "every node would fail on it; nothing was started"
            )
    if path is None or path.suffix != ".py":
        return
    try:
        source = path.read_bytes()
    except OSError:
        return  # unreadable here: launch says so when it uploads it
    try:
        compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{exc.filename or path}, line {exc.lineno}" if exc.lineno else str(exc.filename or path)
        version = ".".join(str(v) for v in sys.version_info[:2])
        raise UsageError(
            f"{where}: {exc.msg}: the training script does not compile (checked with Python {version} "
            "here); nothing was started"
        ) from None
    except ValueError as exc:  # null bytes (before 3.12)
        raise UsageError(
            f"{path}: {exc}: the training script does not compile; nothing was started"
        ) from None


def check_env_files(inventory: Inventory) -> None:
    """The requirements files ``cluster.env`` names, read as sync reads them (relative to the
    inventory file): a UsageError naming the field and the resolved path when one is missing."""
    if not inventory.cluster.env.declared:
        return
    from orchestrator.steps.envsync import resolve_specs

    resolve_specs(inventory, list(inventory.nodes))


_MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([A-Za-z_][\w.]*)'")


def missing_module_hint(inventory: Inventory, lines: Sequence[str]) -> str | None:
    """What to do when a rank died of ``No module named 'X'`` (``lines``: what it printed last): a
    module of the project here that is not on the nodes (``launch`` runs the code the last sync put
    there, and without ``cluster.code`` ships the training script alone), or one the project does not
    have (a package the nodes' Python lacks)."""
    from orchestrator.steps.codesync import code_source

    found = next((m for line in reversed(lines) if (m := _MISSING_MODULE.search(line))), None)
    if found is None:
        return None
    name = found.group(1)
    top = name.split(".")[0]
    script = script_file(inventory)
    project = code_source(inventory.cluster) if inventory.cluster.code_declared else None
    here = project or (script.parent if script is not None else None)
    try:
        local = here is not None and ((here / f"{top}.py").is_file() or (here / top).is_dir())
    except OSError:
        local = False
    if local and project is not None:
        return (
            f"'{top}' is in your project ({project}) but not on the node as it is here: `launch` runs "
            "the code the last sync put there; `bootstrap sync --only code` brings it up to date "
            "(`bootstrap` alone syncs, then launches)"
        )
    if local:
        return (
            f"'{top}' is beside the training script here, but launch ships the script alone: add "
            "`code: {source: .}` under `cluster:` so the whole project goes to every node (docs/sync.md)"
        )
    return (
        f"no module '{name}' on the node, nor in the project here: a package the nodes' Python lacks? "
        "list it in cluster.env (requirements or packages) and run `bootstrap sync --only env` (docs/sync.md)"
    )


def local_script(script: str) -> Path | None:
    """The training script to upload: the controller's file (relative to the current directory), or
    the shipped example when the inventory keeps the default and no such file is here."""
    here = Path(script)
    try:
        if here.is_file():
            return here
    except (OSError, ValueError):  # a name too long for this file system: not a file here
        return None
    if script == "examples/train_ddp.py":
        return packaged_example()
    return None


def not_the_project(inventory: Inventory, source: Path) -> str | None:
    """Why the directory code sync ships is not the project: it does not hold the training script
    the inventory names (relative to it): a bootstrap run from another directory than the project's
    (code.source is relative to the current directory) would replace the nodes' code with it."""
    from orchestrator.inventory.model import WINDOWS_ABSOLUTE, TrainSettings

    script = inventory.cluster.train.script
    if script == TrainSettings().script or script.startswith("/") or WINDOWS_ABSOLUTE.match(script):
        return None  # the shipped example, or a script outside the project
    if script_file(inventory) is not None:
        return None  # in the project sync ships (script_file looks where `source` is)
    return (
        f"the training script {script} is not in {source}, the directory code sync ships "
        "(code.source, relative to the current directory): it is not your project. Syncing it would "
        "replace what earlier syncs shipped to the nodes; run bootstrap from the project's directory, "
        "or set cluster.code.source"
    )
