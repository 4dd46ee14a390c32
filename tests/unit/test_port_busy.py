"""A launch refused because the master's port is in use: when a run of bootstrap is still running
on the master, the refusal names it and the stop that ends it (it sent the user to `check` to learn
what the launch had just found)."""

from __future__ import annotations

import pytest

from orchestrator import records
from orchestrator.errors import CommandFailedError
from orchestrator.inventory import load_inventory_text
from orchestrator.render import plan_launch
from orchestrator.steps.launch import PORT_BUSY, _check_prepared
from orchestrator.transports import Result


def test_the_run_holding_the_masters_port_is_named_with_its_stop() -> None:
    inv = load_inventory_text(
        "cluster: {name: c, master: a, train: {script: t.py}}\nnodes:\n  - {name: a, host: 10.0.0.1}\n",
        "hosts.yaml",
    )
    (spec,) = plan_launch(
        inv, backend="gloo", master_addr="10.0.0.1", run_id="r2", interfaces={}, cpus={}, pythons={}
    )
    nonce = records.new_nonce()
    found = records.record(nonce, "leftover", "9", "r1/a") + records.record(nonce, PORT_BUSY)
    with pytest.raises(CommandFailedError) as refused:
        _check_prepared(Result("a", "prepare", 0, found, "", 0.1), inv.nodes[0], spec, "/w/runs/r2/a", nonce)
    assert f"port {spec.master_port} is in use on this node, the master" in refused.value.message
    assert refused.value.hint == (
        "run r1 of bootstrap is still running on this node: `bootstrap stop --run r1` ends it, or wait for "
        "it to end"
    )
    alone = records.record(nonce, PORT_BUSY)  # something else holds it: `check` names it
    with pytest.raises(CommandFailedError, match="in use") as other:
        _check_prepared(Result("a", "prepare", 0, alone, "", 0.1), inv.nodes[0], spec, "/w/runs/r2/a", nonce)
    assert "`bootstrap check` names what holds it" in (other.value.hint or "")
