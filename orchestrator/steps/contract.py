"""The step contract: what a step reads from a node, what it plans to do there, and what it concludes.

A step is three pure functions over data (it never touches a transport, a terminal or a session):

- :meth:`Step.reads` names what it must know about a node before deciding (:class:`Read` s: a script's
  sections and their parser, as root or not; facts/base.py, where ``facts_read`` makes facts one read).
  The runner (orchestrator/runner.py) gathers every read of a node in one command and keeps each
  value in the session under its key, so a read another step (or the pipeline's first round trip)
  made already costs nothing.
- :meth:`Step.context` turns every node's reads into what the step decides for the whole cluster at
  once (the firewall: every node's cluster address, the peer set), with warnings.
- :meth:`Step.plan` gives one node's :class:`~orchestrator.plans.NodePlan`: the uploads and commands
  that bring it where it should be; no actions when it is there already (the node is not contacted
  again). ``--dry-run`` prints these plans, and the real run applies these very objects.
- :meth:`Step.judge` reads the results of the applied plan (None in a dry run) and returns the node's
  verdict, a value with ``status`` and ``public_dict()``; it raises a ``BootstrapError`` when the
  node failed. Every command and table renders the :class:`Report` the runner returns.

docs/design.md shows one step (the firewall) written out in full.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from orchestrator.errors import BootstrapError
from orchestrator.executor import GroupResult, exit_code_for
from orchestrator.facts.base import Read, Sections

__all__ = ["C", "ClusterFacts", "Read", "Report", "Sections", "Step", "V", "Verdict"]

if TYPE_CHECKING:
    from orchestrator.errors import ExitCode
    from orchestrator.inventory import Node
    from orchestrator.plans import NodePlan
    from orchestrator.transports import Result


@dataclass
class ClusterFacts:
    """What the runner learnt before any step decided: each scoped node's read values by key, the
    nodes whose reads failed (and why), and where the controller's connection reached each node of
    the session (its socket's peer address; None: not connected, local, or through a proxy)."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the node's first read that failed (its other values are in ``values``): it is not planned
    failed: dict[str, BootstrapError] = field(default_factory=dict)
    peers: dict[str, str | None] = field(default_factory=dict)


class Verdict(Protocol):
    """A node's result of a step: a few words for tables and what ``--json`` shows of it."""

    @property
    def status(self) -> str: ...

    def public_dict(self) -> dict[str, Any]: ...


C = TypeVar("C")
V = TypeVar("V", bound=Verdict)


class Step(ABC, Generic[C, V]):
    """One job on a set of nodes (see the module docstring). ``scope`` may read more nodes than it
    changes (the firewall reads every node's address, changes the selected ones)."""

    #: the step's name: progress displays, ``--json``'s ``command``
    name: ClassVar[str]

    def scope(self, selected: Sequence[Node]) -> list[Node]:
        """The nodes whose reads the step needs (default: the selected ones)."""
        return list(selected)

    @abstractmethod
    def reads(self, node: Node) -> list[Read]:
        """What to know about ``node`` before deciding."""

    @abstractmethod
    def context(self, found: ClusterFacts) -> C:
        """The cluster-wide decisions, from every scoped node's reads."""

    @abstractmethod
    def plan(self, node: Node, facts: Mapping[str, Any], context: C) -> NodePlan:
        """What to do on ``node``: no actions when nothing needs to change."""

    @abstractmethod
    def judge(self, node: Node, plan: NodePlan, results: list[Result] | None, context: C) -> V:
        """The node's verdict from what its plan's runs returned (None: a dry run, nothing applied);
        raises a ``BootstrapError`` when the node failed."""

    def waves(self, nodes: list[Node], context: C) -> list[list[Node]]:
        """The nodes with something to apply, in the groups that must go one after the other (each
        group in parallel); default: all at once."""
        return [nodes]

    def forgets(self, node: Node) -> list[str]:
        """The session keys that no longer describe ``node`` once its plan was applied (default:
        what the step read there)."""
        return [r.key for r in self.reads(node) if not r.fresh]

    def failed(self, verdict: V) -> bool:
        """Whether a node's verdict fails the report although the node raised nothing (the preflight:
        a check failed there); default: never."""
        return False

    def warnings(self, context: C) -> list[str]:
        """What the whole run should say once (not about one node)."""
        return []

    def data(self, context: C) -> dict[str, Any]:
        """Step-wide values for ``--json`` (the firewall: the cluster addresses it used)."""
        return {}


@dataclass
class Report(Generic[V]):
    """What one step did (or would do) on its nodes: one verdict or error per selected node, in
    inventory order, the plans (what ``--dry-run`` shows and the real run applied), warnings and the
    step's own data. Tables and ``--json`` are renderings of it; :meth:`exit_code` is the one rule."""

    step: str
    outcomes: GroupResult[V]
    plans: dict[str, NodePlan] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    #: the step's cluster-wide decisions (``Step.context``): for the code that runs after the step
    #: (the time sync's wait needs each node's role); not rendered
    context: Any = None
    #: the nodes whose verdict fails the report (``Step.failed``)
    failing: list[str] = field(default_factory=list)

    def exit_code(self) -> ExitCode:
        return exit_code_for(self.outcomes, lambda o: o.node in self.failing)
