"""The product's own inventory format (``cluster:``, ``defaults:``, ``nodes:``); see docs/inventory.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.inventory._yaml_values import describe, did_you_mean, item_line, key_line, node_line, plain
from orchestrator.inventory.assemble import NodeDraft, assemble
from orchestrator.inventory.cluster import Inventory
from orchestrator.inventory.issues import NODE_USER_FIELDS, IssueLog, Source

__all__ = ["TOP_LEVEL_KEYS", "looks_native", "read_native"]

TOP_LEVEL_KEYS = ("cluster", "defaults", "nodes")
_PER_NODE_ONLY = ("name", "host")


def looks_native(data: Mapping[Any, Any]) -> bool:
    """True when the top-level mapping uses the native keys."""
    return any(key in data for key in TOP_LEVEL_KEYS)


def _read_fields(
    mapping: Mapping[Any, Any],
    *,
    scope: str | None,
    node: str | None,
    log: IssueLog,
    forbidden: tuple[str, ...] = (),
) -> tuple[dict[str, Any], dict[str, Source]]:
    """Node fields of one mapping (a node or ``defaults``), with the line of every key."""
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for key, value in mapping.items():
        name = str(key)
        line = key_line(mapping, key)
        if name in forbidden:
            message = f"'{name}' cannot be set in defaults: every node has its own"
            log.add(message, line=line, node=node, field=name)
            continue
        if name not in NODE_USER_FIELDS:
            message = f"unknown field '{name}'{did_you_mean(name, NODE_USER_FIELDS)}"
            log.add(message, line=line, node=node, field=name)
            continue
        values[name] = plain(value)
        sources[name] = Source(line, name, scope)
        if name in ("winrm", "windows"):
            _sub_sources(sources, value, name, scope, depth=1)
    return values, sources


def _sub_sources(
    sources: dict[str, Source], value: Any, prefix: str, scope: str | None = None, *, depth: int
) -> None:
    """The line of every key under ``prefix`` down to ``depth`` levels (``env.linux.index_url``), so
    that a wrong sub-field is reported on its own line, not on its mapping's."""
    if depth < 1 or not isinstance(value, Mapping):
        return
    for sub, inner in value.items():
        path = f"{prefix}.{sub}"
        sources[path] = Source(key_line(value, sub), path, scope)
        _sub_sources(sources, inner, path, scope, depth=depth - 1)


def _merge(
    defaults: tuple[dict[str, Any], dict[str, Source]], own: tuple[dict[str, Any], dict[str, Source]]
) -> tuple[dict[str, Any], dict[str, Source]]:
    """Node values win over defaults; ``winrm`` and ``windows`` are merged key by key."""
    values = {**defaults[0], **own[0]}
    sources = {**defaults[1], **own[1]}
    for sub in ("winrm", "windows"):
        d_sub, n_sub = defaults[0].get(sub), own[0].get(sub)
        if isinstance(d_sub, dict) and isinstance(n_sub, dict):
            values[sub] = {**d_sub, **n_sub}
        elif sub in own[0]:
            sources = {k: v for k, v in sources.items() if not k.startswith(f"{sub}.") or k in own[1]}
    return values, sources


def read_native(data: Mapping[Any, Any], source: str) -> Inventory:
    """Build an :class:`Inventory` from a parsed native-format file."""
    log = IssueLog(source)
    for key in data:
        if str(key) not in TOP_LEVEL_KEYS:
            log.add(
                f"unknown top-level key '{key}'{did_you_mean(str(key), TOP_LEVEL_KEYS)} "
                f"(expected {', '.join(TOP_LEVEL_KEYS)})",
                line=key_line(data, key),
                field=str(key),
            )

    cluster_values: dict[str, Any] = {}
    cluster_sources: dict[str, Source] = {}
    cluster_line = key_line(data, "cluster") if "cluster" in data else None
    block = data.get("cluster")
    if isinstance(block, Mapping):
        for key, value in block.items():
            cluster_values[str(key)] = plain(value)
            cluster_sources[str(key)] = Source(key_line(block, key), str(key))
            _sub_sources(cluster_sources, value, str(key), depth=2)  # env.linux.index_url
    elif block is not None:
        log.add(
            f"expected a mapping (name, master, port, backend), got {describe(plain(block))}",
            line=cluster_line,
            field="cluster",
        )

    defaults: tuple[dict[str, Any], dict[str, Source]] = ({}, {})
    block = data.get("defaults")
    if isinstance(block, Mapping):
        defaults = _read_fields(block, scope="defaults", node=None, log=log, forbidden=_PER_NODE_ONLY)
    elif block is not None:
        log.add(
            f"expected a mapping of node fields, got {describe(plain(block))}",
            line=key_line(data, "defaults"),
            field="defaults",
        )

    drafts: list[NodeDraft] = []
    nodes = data.get("nodes")
    nodes_line = key_line(data, "nodes") if "nodes" in data else None
    if "nodes" not in data:
        log.add("missing the required 'nodes' list (one entry per machine)", field="nodes")
    elif not isinstance(nodes, list):
        log.add(
            f"expected a list of nodes ('- host: ...' entries), got {describe(plain(nodes))}",
            line=nodes_line,
            field="nodes",
        )
    elif not nodes:
        log.add("'nodes' is empty: list at least one node", line=nodes_line, field="nodes")
    else:
        for index, item in enumerate(nodes):
            line = item_line(nodes, index)
            label = f"nodes[{index}]"
            if not isinstance(item, Mapping):
                log.add(
                    f"expected a mapping with at least 'host' (e.g. '- host: 192.168.1.10'), "
                    f"got {describe(plain(item))}",
                    line=line,
                    node=label,
                )
                continue
            for known in ("name", "host"):
                value = item.get(known)
                if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
                    label = str(value)
                    break
            own = _read_fields(item, scope=None, node=label, log=log)
            values, sources = _merge(defaults, own)
            draft = NodeDraft(label=label, line=line or node_line(item), values=values, sources=sources)
            drafts.append(draft)

    return assemble(
        source=source,
        fmt="native",
        drafts=drafts,
        cluster_values=cluster_values,
        cluster_sources=cluster_sources,
        cluster_line=cluster_line,
        default_master=drafts[0].label if drafts else None,
        notes=[],
        log=log,
    )
