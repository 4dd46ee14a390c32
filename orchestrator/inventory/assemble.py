"""The format-independent part of loading an inventory.

Readers (:mod:`.native`, :mod:`.ansible`) turn a file into :class:`NodeDraft` objects (raw values plus
where each came from); :func:`assemble` validates them with the pydantic models, runs the checks that
involve several fields or several nodes (duplicate names and addresses, the master, ``train.shares``)
and either returns an :class:`Inventory` or raises one :class:`InventoryError` with every issue.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from pydantic import ValidationError

from orchestrator.inventory._yaml_values import did_you_mean
from orchestrator.inventory.cluster import Cluster, Inventory
from orchestrator.inventory.issues import (
    CLUSTER_EXPECTED,
    CLUSTER_FIELDS,
    NODE_EXPECTED,
    NODE_USER_FIELDS,
    IssueLog,
    Source,
    report_validation,
)
from orchestrator.inventory.model import InventoryFormat, Node, _attach_password, is_localhost

__all__ = ["NodeDraft", "assemble"]


@dataclass
class NodeDraft:
    """A node as read from a file, before validation."""

    label: str  # name for messages: the node name when known, else "nodes[3]"
    line: int | None
    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=dict)  # "gpus", "winrm", "winrm.transport", ...
    password: str | None = field(default=None, repr=False)
    errored: set[str] = field(default_factory=set)  # fields a reader already reported and dropped


def _without(values: dict[str, Any], paths: Iterable[str]) -> dict[str, Any]:
    """A copy of ``values`` without the given (dotted) fields."""
    out = dict(values)
    for path in paths:
        top = path.split(".", 1)[0]
        if top in ("winrm", "windows") and "." in path and isinstance(out.get(top), dict):
            sub = dict(out[top])
            sub.pop(path.split(".", 1)[1], None)
            out[top] = sub
        else:
            out.pop(path, None)
    return out


def _validate_node(draft: NodeDraft, log: IssueLog) -> tuple[Node | None, set[str]]:
    """Validate one draft; report problems; return the node (wrong fields dropped) and the wrong fields."""
    values = dict(draft.values)
    values["line"] = draft.line
    try:
        node = Node.model_validate(values)
    except ValidationError as exc:
        bad = report_validation(
            exc,
            values=values,
            sources=draft.sources,
            expected=NODE_EXPECTED,
            known_fields=NODE_USER_FIELDS,
            fallback_line=draft.line,
            node=draft.label,
            log=log,
        )
        try:
            # The cross-field checks still run on what is left (every issue is reported in one go).
            node = Node.model_validate(_without(values, bad))
        except ValidationError:
            return None, bad | draft.errored
        return node, bad | draft.errored
    return node, set(draft.errored)


def _line_of(draft: NodeDraft, *fields: str) -> tuple[int | None, str]:
    for name in fields:
        src = draft.sources.get(name)
        if src is not None:
            return src.line, src.key
    return draft.line, fields[0]


def _check_node(node: Node, draft: NodeDraft, bad: set[str], log: IssueLog) -> None:
    """Checks involving several fields of one node."""
    if node.gpus > 0 and node.nproc > node.gpus and not bad & {"gpus", "nproc"}:
        line, key = _line_of(draft, "nproc", "gpus")
        log.add(
            f"nproc {node.nproc} is more than gpus {node.gpus}: each rank needs its own GPU: "
            "set nproc <= gpus, or gpus: 0 for CPU ranks",
            line=line,
            node=node.name,
            field=key,
        )
    if node.connection == "local" and not is_localhost(node.host) and not bad & {"host", "connection"}:
        line, key = _line_of(draft, "host", "connection")
        log.add(
            f"connection 'local' runs on this machine, but host is '{node.host}': "
            "omit host (or use localhost) for the local node, or use connection: ssh",
            line=line,
            node=node.name,
            field=key,
        )
    if node.connection == "winrm" and node.os == "linux" and not bad & {"os", "connection"}:
        line, key = _line_of(draft, "connection", "os")
        log.add(
            "connection 'winrm' is for Windows nodes: set os: windows, or use connection: ssh for Linux",
            line=line,
            node=node.name,
            field=key,
        )
    if node.connection == "winrm" and not node.allow_insecure and not any(b.startswith("winrm") for b in bad):
        for item in node.winrm.insecure():
            line, key = _line_of(draft, item.field, "winrm.scheme", "winrm")
            # an Ansible inventory spells the opt-in bootstrap_allow_insecure
            allow = "bootstrap_allow_insecure" if key.startswith("ansible_") else "allow_insecure"
            log.add(
                f"{item.risk}: refused; {item.fix} (only on an isolated test network: {allow}: true "
                "for this node)",
                line=line,
                node=node.name,
                field=key,
            )
    # Set for this very node (not through defaults or group vars, which Linux nodes share with
    # Windows ones): a Linux node with Windows settings is a mistake worth naming.
    own = draft.sources.get("windows") or next(
        (src for key, src in draft.sources.items() if key.startswith("windows.")), None
    )
    if node.os != "windows" and "windows" in draft.values and own and not own.scope and "os" not in bad:
        log.add(
            "'windows' (mode, distro, wsl_user) is only for os: windows nodes: remove it, or set os: windows",
            line=own.line,
            node=node.name,
            field=own.key,
        )


def _effective_port(node: Node) -> int | str | None:
    if node.port is not None:
        return node.port
    if node.connection == "ssh":
        return 22
    return node.connection


def _build_cluster(
    values: dict[str, Any],
    sources: dict[str, Source],
    *,
    fallback_line: int | None,
    known_names: Sequence[str],
    log: IssueLog,
    base_dir: str = ".",
) -> Cluster | None:
    cluster: Cluster | None = None
    bad: set[str] = set()
    try:
        # base_dir: where paths in the file start (train.templates)
        cluster = Cluster.model_validate(values, context={"base_dir": base_dir})
        if cluster.train.templates is not None:  # its error comes later (render.templates_dir_for)
            src = sources.get("train.templates") or sources.get("train")
            cluster.train._templates_line = src.line if src else fallback_line
    except ValidationError as exc:
        bad = report_validation(
            exc,
            values=values,
            sources=sources,
            expected=CLUSTER_EXPECTED,
            known_fields=CLUSTER_FIELDS,
            fallback_line=fallback_line,
            node=None,
            log=log,
        )
    master = values.get("master")
    if known_names and "master" not in bad and isinstance(master, str) and master not in known_names:
        src = sources.get("master")
        log.add(
            f"master '{master}' is not a node{did_you_mean(master, known_names)}",
            line=src.line if src else fallback_line,
            field=src.key if src else "master",
        )
    return cluster


def _check_shares(
    cluster: Cluster, nodes: list[Node], sources: dict[str, Source], fallback_line: int | None, log: IssueLog
) -> None:
    """``train.shares`` against the nodes: a list has one integer per rank or one per node (a node's
    then split between its ranks); per-rank shares need the fixed ranks of a static rendezvous."""
    shares = cluster.train.shares
    if shares == "equal":
        return
    src = sources.get("train.shares") or sources.get("train")
    line = src.line if src else fallback_line
    if cluster.train.elastic:
        log.add(
            f"shares: {shares if isinstance(shares, str) else list(shares)} gives each rank its own share, "
            "but elastic: true assigns the ranks anew at every rendezvous: "
            "use shares: equal, or elastic: false",
            line=line,
            field="train.shares",
        )
        return
    if isinstance(shares, str):
        return
    nprocs = [n.nproc for n in nodes]
    ranks = sum(nprocs)
    if len(shares) == ranks:
        return
    if len(shares) != len(nodes):
        log.add(
            f"{len(shares)} number(s), but the cluster has {len(nodes)} node(s) and {ranks} rank(s): give "
            f"one per rank ({ranks}) or one per node ({len(nodes)}), in inventory order",
            line=line,
            field="train.shares",
        )
        return
    for node, value in zip(nodes, shares, strict=True):
        if value < node.nproc:
            log.add(
                f"{value} for node {node.name!r} is less than its {node.nproc} ranks: a node's share is "
                "split between its ranks, each needs at least one sample",
                line=line,
                field="train.shares",
            )


def assemble(
    *,
    source: str,
    fmt: InventoryFormat,
    drafts: list[NodeDraft],
    cluster_values: dict[str, Any],
    cluster_sources: dict[str, Source],
    cluster_line: int | None,
    default_master: str | None,
    notes: list[str],
    log: IssueLog,
) -> Inventory:
    """Validate drafts and cluster settings: an Inventory, or InventoryError with all issues."""
    nodes: list[Node] = []
    by_name: dict[str, Node] = {}
    by_address: dict[tuple[str, int | str | None], Node] = {}
    for draft in drafts:
        node, bad = _validate_node(draft, log)
        if node is None:
            continue
        _check_node(node, draft, bad, log)
        if draft.password is not None:
            _attach_password(node, draft.password)
        if "name" not in bad and "host" not in bad:
            first = by_name.get(node.name)
            if first is not None:
                line, key = _line_of(draft, "name", "host")
                at = f" (first defined at line {first.line})" if first.line else ""
                log.add(f"duplicate node name '{node.name}'{at}", line=line, node=node.name, field=key)
                continue
            by_name[node.name] = node
        if not bad & {"host", "port", "connection"}:
            address = (node.host.lower(), _effective_port(node))
            other = by_address.get(address)
            if other is not None:
                line, key = _line_of(draft, "host", "port")
                at = f" (line {other.line})" if other.line else ""
                log.add(
                    f"same address {node.address} as node '{other.name}'{at}: "
                    "nodes on one host need different ports",
                    line=line,
                    node=node.name,
                    field=key,
                )
            else:
                by_address[address] = node
        nodes.append(node)

    stem = PurePath(source).stem or "cluster"
    values = dict(cluster_values)
    values.setdefault("name", stem)
    if "master" not in values and default_master is not None:
        values["master"] = default_master
    known = [d.label for d in drafts]
    cluster = None
    if "master" in values:
        cluster = _build_cluster(
            values,
            cluster_sources,
            fallback_line=cluster_line,
            known_names=known,
            log=log,
            base_dir=str(Path(source).absolute().parent),
        )
    if cluster is not None:
        _check_shares(cluster, nodes, cluster_sources, cluster_line, log)
    if cluster is None and not log:
        log.add("the inventory defines no nodes", line=cluster_line)
    log.raise_if_any()
    assert cluster is not None
    return Inventory(cluster=cluster, nodes=nodes, source=source, format=fmt, notes=list(notes))
