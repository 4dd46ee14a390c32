"""The inventory as one run uses it: the training script's arguments given after ``--``, ``-e
NAME=VALUE`` added to train.env, ``--nodes`` (the job sized to them) and ``--master``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from orchestrator.errors import UsageError
from orchestrator.inventory import Inventory, Node
from orchestrator.platforms import check_env_name


class Selection(Protocol):
    """The nodes a command was given (``--nodes``: names, globs, tag:NAME); empty: every node."""

    @property
    def nodes(self) -> Sequence[str]: ...

    @property
    def inventory(self) -> object | None: ...


def parse_env_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``-e NAME=VALUE`` options as a dict (later ones win); a UsageError (exit 2) naming the bad one."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--env {pair!r}: expected NAME=VALUE")
        try:
            env[check_env_name(name)] = value
        except ValueError as exc:
            raise UsageError(f"--env {pair!r}: {exc}") from None
    return env


def for_run(
    inventory: Inventory, args: Sequence[str] | None, env_pairs: Sequence[str], script: str | None = None
) -> Inventory:
    """The inventory as this run uses it: ``args`` (given after ``--``) replace train.args, ``-e``
    values are added to train.env, ``--script`` replaces train.script."""
    return inventory.for_run(args, parse_env_pairs(env_pairs), script)


def refuse_inventory_as_args(selection: Selection, args: Sequence[str]) -> None:
    """`bootstrap launch hosts.yaml`: an inventory file where the training script's arguments go,
    with no -i (the embedded default would train the example, given that name as its argument)."""
    if args and selection.inventory is None and args[0].endswith((".yaml", ".yml")):
        raise UsageError(
            f"{args[0]!r} looks like an inventory, given where the training script's arguments go",
            hint=f"`bootstrap -i {args[0]} launch` (arguments for the script go after `--`)",
        )


def selected(selection: Selection, inventory: Inventory) -> list[Node]:
    """The nodes of ``inventory`` that ``--nodes`` names (all of them without it)."""
    return inventory.select(selection.nodes) if selection.nodes else list(inventory.nodes)


def run_nodes(selection: Selection, inventory: Inventory, master: str | None) -> Inventory:
    """The inventory a run uses: with ``--nodes``, only those nodes (the job is sized to them) and
    ``--master`` when given (:meth:`Inventory.only`); else the whole inventory."""
    if not selection.nodes and master is None:
        return inventory
    return inventory.only(selected(selection, inventory), master=master)
