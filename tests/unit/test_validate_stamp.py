"""The key that lets the main pipeline leave out validation (steps/validate_stamp.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from orchestrator.executor import Outcome
from orchestrator.facts.base import FactSet
from orchestrator.facts.linux import PythonInfo, TorchInfo
from orchestrator.inventory import load_inventory_text
from orchestrator.render import plan_launch
from orchestrator.steps.launch import LaunchPlan
from orchestrator.steps.node_facts import InspectedNode
from orchestrator.steps.validate_stamp import last_stamp, save_stamp, stamp_file, stamp_key

INVENTORY = """\
cluster:
  name: lab
  master: a
  backend: gloo
  firewall: {{manage: {manage}}}
nodes:
  - {{name: a, host: {a}}}
  - {{name: b, host: 10.0.0.2}}
  - {{name: c, host: 10.0.0.3}}
"""


def _key(
    *, a: str = "10.0.0.1", manage: str = "true", torch: str = "2.13.0", only: str = "", iface: str = "eth0"
) -> str:
    inventory = load_inventory_text(INVENTORY.format(a=a, manage=manage), "/srv/lab/hosts.yaml")
    if only:
        inventory = inventory.only([n for n in inventory.nodes if n.name in only.split(",")])
    names = [n.name for n in inventory.nodes]
    specs = plan_launch(
        inventory, backend="gloo", master_addr=a, run_id="validate-r", cpus={}, pythons={},
        interfaces={n: (iface, None) for n in names},
    )  # fmt: skip
    facts = {
        "python": PythonInfo("/usr/bin/python3", "3.11.7"),
        "torch": TorchInfo(True, torch, distributed=True, gloo=True, gloo_works=True),
        "cpus": 2,
    }
    inspected = [Outcome(n, InspectedNode("ssh", FactSet(dict(facts)), 0.01), None, 0.01) for n in names]
    return stamp_key(inventory, LaunchPlan(specs, "gloo", "", inspected, []))


def test_the_key_changes_with_what_validation_depends_on_and_only_with_that() -> None:
    base = _key()
    assert _key() == base
    changed = {
        "address": _key(a="10.0.0.9"),
        "node set": _key(only="a,b"),
        "torch": _key(torch="2.14.0"),
        "firewall settings": _key(manage="false"),
        "interface": _key(iface="eth1"),
    }
    assert all(key != base for key in changed.values()), changed
    assert len(set(changed.values())) == len(changed)


def test_the_stamp_is_kept_per_node_set_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    everyone = load_inventory_text(INVENTORY.format(a="10.0.0.1", manage="true"), "/srv/lab/hosts.yaml")
    two = everyone.only([n for n in everyone.nodes if n.name != "c"])
    assert last_stamp(everyone) is None
    save_stamp(everyone, "k3")
    save_stamp(two, "k2")
    assert last_stamp(everyone).key == "k3"  # type: ignore[union-attr]
    assert last_stamp(two).key == "k2"  # type: ignore[union-attr]
    path = stamp_file(everyone)
    assert path.parent == tmp_path / "cluster-bootstrap" / "validated"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
