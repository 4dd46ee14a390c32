"""After the time sync configured the nodes: awaiting each changed node's source, then every node's
offset from the master, as two runner steps made of reads (orchestrator/steps/contract.py).

- :class:`AwaitTime`: one ``fresh`` read per node to await (as root, asked every time, never kept):
  chronyd followed its source within the limit, or the deadline passed, or no source answers
  (``chrony.wait_sections``). What it says becomes the node's row (:func:`judge_wait`).
- :class:`MeasureTime`: each node's clock sample (``date``, dated by the controller's clock around its
  round trip) under the session's :data:`~orchestrator.steps.preflight.CLOCK` key, the master's too:
  a sample the session holds stands for a node the sync did not change (a changed node's was
  forgotten by the configure), then every node's offset from the master (:func:`offsets`).

Neither plans an action: their verdicts are the rows their reads completed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orchestrator.steps.timesync.chrony as chrony
from orchestrator.errors import CommandFailedError
from orchestrator.plans import NodePlan
from orchestrator.steps.contract import ClusterFacts, Read, Sections, Step
from orchestrator.steps.preflight import CLOCK
from orchestrator.steps.preflight.checks import ClockSample
from orchestrator.steps.timesync.apply import _follows, _ms, _note_preference, no_reply_problem
from orchestrator.steps.timesync.chrony.config import ChronyRole
from orchestrator.steps.timesync.report import NodeTime

if TYPE_CHECKING:
    from orchestrator.inventory import Node
    from orchestrator.transports import Result

__all__ = ["WAIT", "AwaitTime", "MeasureTime", "clock_read", "judge_wait", "offsets", "wait_read"]

#: the key of the wait's read (``fresh``: never kept in the session)
WAIT = "timesync.wait"
#: the clock sample's section (the preflight's round trip has a "clock" section of its own)
_CLOCK_SECTION = "clock.sample"


def wait_read(node: Node, role: ChronyRole, max_offset_ms: float, timeout: float) -> Read:
    """Await chronyd's source on ``node`` (as root; see ``chrony.wait_sections``)."""
    sections = chrony.wait_sections(
        max_offset_s=max_offset_ms / 1000, timeout=timeout, has_sources=bool(role.sources)
    )

    def parse(found: Sections, ran: Result) -> chrony.WaitAnswer:
        answer = chrony.parse_wait(found)
        if answer.exit_code is None:
            raise CommandFailedError(
                f"the wait for chrony's source did not run (exit code {ran.exit_code}): "
                + (" | ".join(ran.tail(3)) or "no output"),
                node=node.name,
                result=ran,
            )
        return answer

    return Read(
        WAIT,
        lambda platform: sections,
        parse,
        become=True,
        what="reading chronyc",
        timeout=timeout + 30,
        fresh=True,
    )


def judge_wait(
    node: str,
    value: NodeTime,
    role: ChronyRole,
    answer: chrony.WaitAnswer,
    max_offset_ms: float,
    timeout: float,
    *,
    own_address: str | None = None,
) -> None:
    """Record on ``value`` what chronyd said at the end of the wait: what it follows, or why it
    follows nothing (none of its sources answered; the deadline passed) and what to do."""
    sources = chrony.parse_sources(answer.sources)
    tracking = chrony.parse_tracking(answer.tracking)
    selected = _follows(value, role, sources)
    code = answer.exit_code
    if selected is None and role.sources and code in (3, chrony.NO_REPLY_EXIT):
        value.state = "failed"  # configured (its actions say how), but it follows nothing
    if code == chrony.NO_REPLY_EXIT:
        traffic = chrony.parse_ntpdata(answer.ntpdata)
        master = role.sources[0] if role.prefer_first else None  # a worker of a serving master
        value.problem = no_reply_problem(node, role, traffic, master=master, own_address=own_address)
    elif code == 3:
        seen = ", ".join(f"{s.address} ({s.state}, reach {s.reach:o})" for s in sources) or "none"
        if selected is not None:
            value.problem = (
                f"chrony follows {selected.address} but is still {abs(selected.offset) * 1000:.1f} ms off "
                f"after {timeout:g} s (limit {max_offset_ms:g} ms)"
            )
        else:
            value.problem = (
                f"chrony selected no source within {timeout:g} s (sources: {seen}; "
                f"leap status {tracking.get('leap', '?')}): check that UDP 123 reaches "
                f"{', '.join(role.sources) or 'the sources'} from {node}"
            )
    elif code != 0:
        value.problem = f"chronyc failed (exit {code}): {answer.sources or answer.tracking}"
    else:
        _note_preference(value, role, selected)


class _Reading(Step[None, NodeTime]):
    """A step made of reads: no node has anything to apply, its verdict is the row (in ``values``)
    its reads completed in :meth:`context`."""

    values: Mapping[str, NodeTime]

    def plan(self, node: Node, facts: Mapping[str, Any], context: None) -> NodePlan:
        return NodePlan(node.name, detail=self.values[node.name])

    def judge(self, node: Node, plan: NodePlan, results: list[Result] | None, context: None) -> NodeTime:
        value: NodeTime = plan.detail
        return value


class AwaitTime(_Reading):
    """Await each selected node's time source, as configured (``roles``), within ``max_offset_ms`` and
    ``timeout`` seconds; ``values``: the rows of the configure, completed here; ``addresses``: each
    worker's address the master allows (for the fix a blocked worker is told)."""

    name = "sync"

    def __init__(
        self,
        values: Mapping[str, NodeTime],
        roles: Mapping[str, ChronyRole],
        max_offset_ms: float,
        timeout: float,
        addresses: Mapping[str, str],
    ) -> None:
        self.values, self.roles, self.addresses = values, roles, addresses
        self.max_offset_ms, self.timeout = max_offset_ms, timeout

    def reads(self, node: Node) -> list[Read]:
        return [wait_read(node, self.roles[node.name], self.max_offset_ms, self.timeout)]

    def context(self, found: ClusterFacts) -> None:
        for name, values in found.values.items():
            if WAIT in values:
                judge_wait(
                    name,
                    self.values[name],
                    self.roles[name],
                    values[WAIT],
                    self.max_offset_ms,
                    self.timeout,
                    own_address=self.addresses.get(name),
                )


# -- offsets from the master ------------------------------------------------------------------------


def clock_read(node: Node) -> Read:
    """``node``'s clock against ours: its ``date`` with sub-seconds, taken to be read halfway through
    the round trip that carried it (known to +- half of it). Kept under the session's CLOCK key, as
    the preflight's samples are."""

    def parse(found: Sections, ran: Result) -> ClockSample:
        after = time.time()  # the round trip just ended: parsing follows it at once
        text, code = found.get(_CLOCK_SECTION, ("", 1))
        try:
            remote = float(text.split()[-1]) if code == 0 and text.split() else None
        except ValueError:
            remote = None  # busybox date without %N prints "...%N": no sub-second answer
        if remote is None:
            raise CommandFailedError(
                "`date +%s.%N` gave no usable answer (GNU date needed for the clock check)", node=node.name
            )
        return ClockSample(offset=remote - (after - ran.duration / 2), rtt=ran.duration)

    return Read(CLOCK, lambda platform: [(_CLOCK_SECTION, "date +%s.%N")], parse, timeout=10)


def offsets(
    values: Mapping[str, NodeTime],
    samples: Mapping[str, ClockSample | None],
    master: str,
    max_offset_ms: float,
) -> None:
    """Each row's offset from the master's clock (the difference of both samples against ours, with
    the error of both allowed for), and a problem above ``max_offset_ms`` (also when chrony itself
    reports more)."""
    reference = samples.get(master)
    for name, value in values.items():
        sample = samples.get(name)
        if reference is None or sample is None:
            value.actions.append("offset from the master not measured (`date` failed)")
            continue
        offset = sample.offset - reference.offset
        error = (sample.rtt + reference.rtt) / 2
        value.offset_ms, value.offset_error_ms = _ms(offset), _ms(error)
        if value.problem is None and abs(offset) - error > max_offset_ms / 1000:
            value.problem = (
                f"clock is {offset * 1000:+.1f} ms (+-{error * 1000:.1f}) from the master's, over the "
                f"{max_offset_ms:g} ms limit: check that its time daemon follows the master "
                "(chronyc sources), or raise cluster.time.max_offset_ms"
            )
        chrony_ms = value.chrony_offset_ms
        if value.problem is None and chrony_ms is not None and abs(chrony_ms) > max_offset_ms:
            value.problem = (
                f"chrony reports {chrony_ms:+.3f} ms from {value.selected}, "
                f"over the {max_offset_ms:g} ms limit"
            )


class MeasureTime(_Reading):
    """Every selected node's offset from ``master`` (which is read too, selected or not), recorded on
    its row in ``values``."""

    name = "clock"

    def __init__(self, master: Node, values: Mapping[str, NodeTime], max_offset_ms: float) -> None:
        self.master, self.values, self.max_offset_ms = master, values, max_offset_ms

    def scope(self, selected: Sequence[Node]) -> list[Node]:
        return list(selected) if self.master in selected else [self.master, *selected]

    def reads(self, node: Node) -> list[Read]:
        return [clock_read(node)]

    def context(self, found: ClusterFacts) -> None:
        samples = {name: values.get(CLOCK) for name, values in found.values.items()}
        measured = {name: value for name, value in self.values.items() if name in found.values}
        offsets(measured, samples, self.master.name, self.max_offset_ms)
