"""Inventories: which machines form the cluster and how to reach them.

Two formats are read: the product's own (``cluster:``/``defaults:``/``nodes:``) and Ansible YAML
inventories (groups with ``hosts:``/``vars:``/``children:``). Both give the same :class:`Inventory`.
See docs/inventory.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from orchestrator.errors import InventoryError, InventoryIssue
from orchestrator.inventory._yaml import load_yaml, read_text
from orchestrator.inventory._yaml_values import describe, did_you_mean, node_line, plain
from orchestrator.inventory.ansible import looks_ansible, read_ansible
from orchestrator.inventory.cluster import Cluster, Inventory
from orchestrator.inventory.model import Node, WinRMSettings
from orchestrator.inventory.native import TOP_LEVEL_KEYS, looks_native, read_native
from orchestrator.inventory.secrets import PasswordResolver

__all__ = [
    "Cluster",
    "Inventory",
    "Node",
    "PasswordResolver",
    "WinRMSettings",
    "load_inventory",
    "load_inventory_text",
]


def load_inventory(path: str | Path) -> Inventory:
    """Load an inventory file (native or Ansible format, detected). Raises :class:`InventoryError`."""
    source = str(path)
    text = read_text(Path(path), source)
    return load_inventory_text(text, source)


#: an Ansible INI inventory's first line: a group header (``[web]``, ``[all:vars]``)
_INI_GROUP = re.compile(r"\A(?:\s*(?:[#;][^\n]*)?\n)*\s*\[[A-Za-z0-9_.:-]+\]\s*(?:\n|\Z)")


def load_inventory_text(text: str, source: str) -> Inventory:
    """Load an inventory from ``text``; ``source`` names it in messages (its stem: default cluster name)."""
    if _INI_GROUP.match(text):  # YAML would say "did not find expected <document start>"
        said = "an Ansible INI inventory: only Ansible's YAML inventories are read"
        fix = f"convert it once: `ansible-inventory -i {source} -y --list > hosts.yaml`, then -i hosts.yaml"
        raise InventoryError([InventoryIssue(f"{said}; {fix}", file=source, line=1)])
    data = load_yaml(text, source)
    if data is None:
        raise InventoryError([InventoryIssue("the inventory file is empty", file=source)])
    if not isinstance(data, Mapping):
        raise InventoryError(
            [
                InventoryIssue(
                    "expected a mapping at the top level ('nodes:' or Ansible groups), "
                    f"got {describe(plain(data))}",
                    file=source,
                    line=node_line(data) or 1,
                )
            ]
        )
    if looks_ansible(data):
        return read_ansible(data, source)
    if looks_native(data):
        return read_native(data, source)
    first = next(iter(data), None)
    hint = did_you_mean(str(first), TOP_LEVEL_KEYS) if first is not None else ""
    raise InventoryError(
        [
            InventoryIssue(
                "unknown inventory format: expected a 'nodes:' list (see docs/inventory.md) "
                f"or Ansible groups such as 'all: {{hosts: ...}}'{hint}",
                file=source,
                line=node_line(data) or 1,
            )
        ]
    )
