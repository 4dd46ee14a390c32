"""Addresses come from the controller's side: the master's address (every rank's rendezvous) is the
master's own, never a workers' vote; a node's address in the other nodes' rules is where the controller
knows it, its own report a check (orchestrator/steps/addresses.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orchestrator.facts.network import InterfaceAddress, Route
from orchestrator.inventory import Node
from orchestrator.steps.addresses import Reached, cluster_address, reached_at
from orchestrator.steps.preflight import check_interfaces
from orchestrator.steps.preflight.checks import PreflightFacts

LO = InterfaceAddress("lo", "127.0.0.1", 8)


def facts(name: str, host: str, route: Route, *own: InterfaceAddress, **node: Any) -> PreflightFacts:
    return PreflightFacts(
        node=Node(name=name, host=host, **node),
        python=None,
        torch=None,
        gpus=None,
        route=route,
        addresses=(LO, *own),
        interfaces=tuple(dict.fromkeys(a.interface for a in (LO, *own))),
        hostname=name,
        hostname_address=None,
        disk=None,
    )


# the master's name resolves to Debian's 127.0.1.1 on the master itself; its LAN address is 10.0.0.1
MASTER = facts(
    "m",
    "m.lab",
    Route("m.lab", "127.0.1.1", "lo", "127.0.0.1", True),
    InterfaceAddress("eth0", "10.0.0.1", 24),
)
# w1 resolves the master's name to 127.0.0.1 (a planted /etc/hosts line): it is the first worker
LIAR = facts(
    "w1",
    "10.0.0.2",
    Route("m.lab", "127.0.0.1", "lo", "127.0.0.1", True),
    InterfaceAddress("eth0", "10.0.0.2", 24),
)
HONEST = facts(
    "w2",
    "10.0.0.3",
    Route("m.lab", "10.0.0.1", "eth0", "10.0.0.3", False),
    InterfaceAddress("eth0", "10.0.0.3", 24),
)


def test_one_worker_cannot_pick_the_rendezvous_address_for_everyone() -> None:
    """Earlier versions took the workers' most common answer (a tie went to the first worker): every
    script got --master-addr 127.0.0.1 and GLOO_SOCKET_IFNAME=lo, and the honest node was blamed."""
    verdicts = check_interfaces([MASTER, LIAR, HONEST], "m", single=False)
    master = verdicts["m"]
    assert master.level == "ok" and master.data["master_address"] == "10.0.0.1"  # what launch passes
    assert master.data["gloo_socket_ifname"] == "eth0"
    assert verdicts["w2"].level == "ok" and verdicts["w2"].data["gloo_socket_ifname"] == "eth0"
    liar = verdicts["w1"]
    assert liar.level == "fail"
    assert "resolves the master m.lab to 127.0.0.1, but the master is 10.0.0.1" in liar.reason


def test_the_master_with_several_addresses_is_where_the_controller_reached_it() -> None:
    """What the workers' vote used to settle (the master's own name says 127.0.1.1 there and it has
    two addresses) the controller's own connection settles now."""
    master = replace(
        MASTER,
        addresses=(LO, InterfaceAddress("eth0", "10.0.0.1", 24), InterfaceAddress("ib0", "10.1.0.1", 24)),
    )
    reached = {"m": Reached("10.0.0.1", "where the controller's ssh connection reached 'm.lab'")}
    verdicts = check_interfaces([master, HONEST], "m", single=False, reached=reached)
    assert verdicts["m"].level == "ok" and verdicts["m"].data["master_address"] == "10.0.0.1"
    assert verdicts["w2"].level == "ok"
    unknown = check_interfaces([master, HONEST], "m", single=False)
    assert unknown["m"].level == "fail"  # nobody can say which: the inventory must (host: its IP)


def test_a_node_is_placed_by_the_inventory_then_its_connection_then_this_machine() -> None:
    def resolve(host: str) -> list[str]:
        return {"gpu1": ["127.0.1.1", "10.0.0.7"]}.get(host, [])

    literal = reached_at(Node(name="a", host="10.0.0.5"), "10.9.9.9", resolve=resolve)
    assert literal == Reached("10.0.0.5", "its host in the inventory")
    direct = reached_at(Node(name="b", host="alias"), "10.0.0.6", resolve=resolve)
    assert direct is not None and direct.address == "10.0.0.6"  # an ssh_config HostName, say
    named = reached_at(Node(name="c", host="gpu1"), None, resolve=resolve)  # a proxy: no direct peer
    assert named == Reached("10.0.0.7", "'gpu1' resolved on the controller")  # loopback skipped
    assert reached_at(Node(name="d", host="nowhere"), None, resolve=resolve) is None
    assert reached_at(Node(name="e", connection="local"), None, resolve=resolve) is None


def test_a_nodes_own_report_is_a_check_except_on_this_machine() -> None:
    node = Node(name="w", host="10.0.0.2")
    here = Reached("10.0.0.2", "its host in the inventory")
    assert cluster_address(node, here, "10.0.0.2") == ("10.0.0.2", None)
    address, warning = cluster_address(node, here, "198.51.100.7")
    assert address == "10.0.0.2" and warning is not None
    assert "node 'w' says its address toward the master is 198.51.100.7, but it is 10.0.0.2" in warning
    local = Node(name="m", connection="local")
    assert cluster_address(local, None, "10.0.0.1") == ("10.0.0.1", None)  # the controller's own answer
    unplaced = Node(name="x", host="x.lab")
    address, warning = cluster_address(unplaced, None, "10.0.0.9")
    assert address is None and warning is not None and "which is not taken from it" in warning
