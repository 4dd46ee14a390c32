"""The loaded inventory: :class:`Cluster` (the cluster-wide settings: name, master, rendezvous port,
backend and each step's settings) and :class:`Inventory` (the cluster and its nodes, in file order),
with the node selection that ``--nodes`` patterns use.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from orchestrator.errors import InventoryError, InventoryIssue
from orchestrator.inventory._yaml_values import closest, did_you_mean
from orchestrator.inventory.model import (
    Backend,
    DisplayName,
    InventoryFormat,
    Node,
    PortNumber,
    Text,
    TrainSettings,
    _no_bool,
)
from orchestrator.inventory.settings import CodeSettings, EnvSettings, FirewallSettings, TimeSettings
from orchestrator.inventory.slurm import SlurmSettings

__all__ = ["Cluster", "Inventory"]


class Cluster(BaseModel):
    """Cluster-wide settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    name: DisplayName
    master: Text
    port: PortNumber = 29500
    backend: Backend = "auto"
    train: TrainSettings = TrainSettings()
    firewall: FirewallSettings = FirewallSettings()
    time: TimeSettings = TimeSettings()
    env: EnvSettings = EnvSettings()
    code: CodeSettings = CodeSettings()
    slurm: SlurmSettings | None = None  # training runs as Slurm jobs (docs/slurm.md)

    @field_validator("port", mode="before")
    @classmethod
    def _integers_are_not_booleans(cls, value: Any) -> Any:
        return _no_bool(value)

    @model_validator(mode="before")
    @classmethod
    def _one_code_directory(cls, data: Any) -> Any:
        """``code.dest`` and ``train.code_dir`` name one directory: sync pushes where launch runs.

        A ``code.dest`` alone is copied into ``train.code_dir`` (launch reads that); both given and
        different would make launch run code that sync never pushed.
        """
        if not isinstance(data, dict):
            return data
        code, train = data.get("code"), data.get("train")
        dest = code.get("dest") if isinstance(code, dict) else None
        if not isinstance(dest, str) or (train is not None and not isinstance(train, dict)):
            return data
        if (train or {}).get("code_dir") is None:
            return {**data, "train": {**(train or {}), "code_dir": dest}}
        return data  # both given: _same_code_directory compares them once validated

    @field_validator("code")
    @classmethod
    def _same_code_directory(cls, code: CodeSettings, info: ValidationInfo) -> CodeSettings:
        train = info.data.get("train")
        code_dir = train.code_dir if isinstance(train, TrainSettings) else None
        if code.dest is not None and code_dir is not None and code_dir != code.dest:
            raise ValueError(
                f"code.dest {code.dest!r} and train.code_dir {code_dir!r} differ: launch runs the code "
                "from train.code_dir, sync pushes it to code.dest; keep only code.dest"
            )
        return code

    @property
    def code_declared(self) -> bool:
        """True when the inventory has a ``code:`` section: the project is synced (its default
        source, the current directory, must be a deliberate choice: it may be a home)."""
        return "code" in self.model_fields_set


@dataclass
class Inventory:
    """A loaded, validated inventory."""

    cluster: Cluster
    nodes: list[Node]
    source: str
    format: InventoryFormat
    notes: list[str] = field(default_factory=list)
    #: what the command line changed for this run (``bootstrap ... -- ARGS``, ``-e NAME=VALUE``):
    #: {"args": [...]} and/or {"env": {...}}; empty when nothing (see :meth:`for_run`)
    run_overrides: dict[str, Any] = field(default_factory=dict)

    def for_run(
        self, args: Sequence[str] | None, env: Mapping[str, str], script: str | None = None
    ) -> Inventory:
        """This inventory for one run: ``args`` (when given, even empty) replace ``train.args``;
        ``env`` is added to ``train.env`` (a name already there takes the new value); ``script``
        replaces ``train.script`` (``--script``: an Ansible inventory has no train section). The
        inventory file is not changed: the next run without them has the inventory's values again."""
        from pydantic import ValidationError

        from orchestrator.errors import UsageError
        from orchestrator.inventory.model import TrainSettings

        train = self.cluster.train
        update: dict[str, Any] = {}
        overrides: dict[str, Any] = {}
        if script is not None:
            try:
                TrainSettings(script=script)  # the field's own rules: one line, no option, no '..'
            except ValidationError as exc:
                said = "; ".join(
                    "not one line of a file name (a control character, or empty)"
                    if e["type"] in ("string_pattern_mismatch", "string_too_short")
                    else str(e["msg"]).removeprefix("Value error, ")
                    for e in exc.errors()
                )
                raise UsageError(f"--script {script!r}: {said}") from None
            update["script"] = overrides["script"] = script
        if args is not None:
            update["args"] = overrides["args"] = tuple(args)
        if env:
            update["env"] = tuple(sorted({**train.env_dict, **env}.items(), key=lambda pair: pair[0]))
            overrides["env"] = dict(env)
        if not update:
            return self
        cluster = self.cluster.model_copy(update={"train": train.model_copy(update=update)})
        return dataclasses.replace(self, cluster=cluster, run_overrides=overrides)

    def only(self, nodes: Sequence[Node], *, master: str | None = None) -> Inventory:
        """This inventory with only ``nodes`` (``--nodes``: the nodes a run uses): the job is sized
        to them (``--nnodes``, world size, ranks). The master must be among them, or ``master``
        names another one of them; the master comes first, the others keep inventory order (ranks
        follow this order, and node rank 0 hosts torchrun's static rendezvous at the master's
        address). A UsageError (exit 2) otherwise; also when an elastic job's ``train.min_nodes`` is
        more than the nodes left, or ``train.shares`` lists fixed shares for other nodes."""
        from orchestrator.errors import UsageError

        chosen = master or self.cluster.master
        if master is not None:
            self.node(master)  # an unknown name: the closest one suggested
        names = {n.name for n in nodes}
        if chosen not in names:
            raise UsageError(
                f"the master {chosen} is not among the nodes this run uses "
                f"({', '.join(n.name for n in self.nodes if n.name in names)})",
                hint="add it to --nodes, or name one of them with --master NODE",
            )
        kept = [n for n in self.nodes if n.name == chosen] + [
            n for n in self.nodes if n.name in names and n.name != chosen
        ]
        train = self.cluster.train
        if train.elastic and train.min_nodes is not None and train.min_nodes > len(kept):
            raise UsageError(
                f"{self.source}: train.min_nodes is {train.min_nodes}, but this run uses {len(kept)} "
                "node(s): the rendezvous would wait for nodes that never come",
                hint="lower train.min_nodes, or give --nodes more nodes",
            )
        if kept == self.nodes and chosen == self.cluster.master:
            return self
        if isinstance(train.shares, tuple):
            raise UsageError(
                f"{self.source}: train.shares lists fixed shares for the inventory's nodes in their "
                "order; this run uses other nodes (--nodes/--master)",
                hint="use shares: equal or measured for such runs, or a copy of the inventory",
            )
        cluster = self.cluster.model_copy(update={"master": chosen})
        return dataclasses.replace(self, cluster=cluster, nodes=kept)

    def node(self, name: str) -> Node:
        """The node called ``name``; :class:`InventoryError` (with the closest name) when there is none."""
        for node in self.nodes:
            if node.name == name:
                return node
        hint = did_you_mean(name, self.names)
        raise InventoryError([InventoryIssue(f"unknown node '{name}'{hint}", file=self.source)])

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def master_node(self) -> Node:
        return self.node(self.cluster.master)

    @property
    def rank_order(self) -> list[Node]:
        """The nodes in node-rank order: the master first (node rank 0 hosts torchrun's static
        rendezvous, which every node dials at the master's address), the others in inventory order."""
        master = self.cluster.master
        return [n for n in self.nodes if n.name == master] + [n for n in self.nodes if n.name != master]

    def select(self, patterns: Sequence[str]) -> list[Node]:
        """Nodes matching any pattern, in inventory order, each once.

        A pattern is a node name, an ``fnmatch`` glob (``gpu-*``) or ``tag:NAME`` (the tag may be a glob
        too); one string may hold several comma-separated patterns (none of them empty). A pattern
        matching no node is an :class:`InventoryError` naming it (all such patterns at once).
        """
        wanted: set[str] = set()
        issues: list[InventoryIssue] = []
        given = 0
        for raw in patterns:
            parts = [p.strip() for p in raw.split(",")]
            # `--nodes "node1,$GONE,node3"`: one node fewer, silently (a trailing comma is a list
            # built in a loop: fine)
            if any(parts) and not all(parts[:-1]):
                message = (
                    f"--nodes {raw!r} has an empty name between commas (an unset variable?): name every node"
                )
                issues.append(InventoryIssue(message, file=self.source))
            for pattern in parts:
                if not pattern:
                    continue
                given += 1
                matched = self._match(pattern)
                if not matched:
                    issues.append(InventoryIssue(self._no_match(pattern), file=self.source))
                wanted.update(matched)
        if patterns and not given:  # `--nodes "$EMPTY"`: selecting nothing must not look like success
            message = f"--nodes {' '.join(repr(p) for p in patterns)} names no node (names, globs, tag:NAME)"
            issues.append(InventoryIssue(message, file=self.source))
        if issues:
            raise InventoryError(issues)
        return [n for n in self.nodes if n.name in wanted]

    def _match(self, pattern: str) -> set[str]:
        if pattern.startswith("tag:"):
            tag = pattern[4:]
            return {n.name for n in self.nodes if any(fnmatch.fnmatchcase(t, tag) for t in n.tags)}
        exact = {n.name for n in self.nodes if n.name == pattern}
        return exact or {n.name for n in self.nodes if fnmatch.fnmatchcase(n.name, pattern)}

    def _no_match(self, pattern: str) -> str:
        if pattern.startswith("tag:"):
            tags = sorted({t for n in self.nodes for t in n.tags})
            match = closest(pattern[4:], tags)
            hint = f"; did you mean 'tag:{match}'?" if match else ""
            known = ", ".join(tags) if tags else "none"
            return f"no node has tag '{pattern[4:]}'{hint} (tags: {known})"
        return f"no node matches '{pattern}'{did_you_mean(pattern, self.names)}"

    def public_dict(self) -> dict[str, Any]:
        """A JSON-safe description (no secret values; the NAME of a password variable is shown)."""
        nodes = []
        for node in self.nodes:
            entry = node.model_dump(mode="json")
            entry["tags"] = list(node.tags)
            entry["address"] = node.address
            entry["password_source"] = node.password_source
            nodes.append(entry)
        from orchestrator.redact import mask_credentials_in  # URLs (env.index_url...) may hold a login

        doc: dict[str, Any] = {
            "source": self.source,
            "format": self.format,
            "cluster": {**self.cluster.model_dump(mode="json"), "train": self.cluster.train.public_dict()},
            "nodes": nodes,
            "notes": list(self.notes),
        }
        masked: dict[str, Any] = mask_credentials_in(doc)
        return masked
