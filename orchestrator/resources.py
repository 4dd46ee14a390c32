"""Files shipped with the product: templates and the embedded default inventory.

In an installed wheel they live inside the package (``orchestrator/templates``,
``orchestrator/_data/inventory``); in a source checkout or editable install, at the repository root.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_REPO = _PACKAGE.parent


def _first_existing(*candidates: Path) -> Path:
    for candidate in candidates:
        if candidate.exists():
            return candidate
    return candidates[-1]


def templates_dir() -> Path:
    return _first_existing(_PACKAGE / "templates", _REPO / "templates")


def default_inventory() -> Path:
    """``inventory/local.yaml``: this machine only, local connection, CPU ranks."""
    return _first_existing(
        _PACKAGE / "_data" / "inventory" / "local.yaml", _REPO / "inventory" / "local.yaml"
    )


def default_inventory_note(path: Path) -> str:
    """What a command without ``-i`` says: the embedded inventory is used; when an inventory file is
    in the current directory (a newcomer who forgot ``-i``), its name, as the command meant."""
    here = [name for name in ("hosts.yaml", "hosts.yml", "inventory.yaml") if Path(name).is_file()]
    return f"using the embedded default inventory ({path.name}: this machine only); " + (
        f"{here[0]} is here: did you mean `bootstrap -i {here[0]} ...`?"
        if here
        else "pass --inventory FILE for a cluster"
    )


def packaged_example() -> Path | None:
    """``examples/train_ddp.py``, shipped so a bare `bootstrap` has something to train."""
    found = _first_existing(
        _PACKAGE / "_data" / "examples" / "train_ddp.py", _REPO / "examples" / "train_ddp.py"
    )
    return found if found.is_file() else None


def package_file(relative: str) -> Path:
    """A file inside the package (``steps/probes/validate_worker.py``): programs uploaded to nodes."""
    return _PACKAGE / relative
