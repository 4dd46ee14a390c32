"""The ``sudo`` verdict: can the login become root without a password, before a step needs it?

The firewall and time steps run as root: ``sudo -n`` for users other than root (steps/root.py), never
typing a password. `check` asks the same question first (the ``root_access`` fact, facts/linux.py),
so a missing sudoers line is named before the main pipeline reaches those steps (issue 15 item 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.errors import BootstrapError
from orchestrator.facts.base import FactParseError, Read, Sections
from orchestrator.facts.linux import BecomeRoot, RootAccess
from orchestrator.steps.preflight.checks import PreflightFacts
from orchestrator.steps.preflight.model import Verdict, fail, ok, warn

#: session key of a node's :class:`RootAccess` (the ``root_access`` fact read on its own)
ROOT_ACCESS = "root_access"


def root_access_read() -> Read:
    """Whether the login user can become root without a password (the ``root_access`` fact, the
    same section as the preflight's facts ask: one round trip asking both sends it once)."""
    fact = BecomeRoot()

    def parse(sections: Sections, ran: object) -> RootAccess:
        if fact.name not in sections:
            raise BootstrapError("could not tell whether commands can become root: no answer")
        try:
            return fact.parse(*sections[fact.name])
        except FactParseError as exc:
            raise BootstrapError(f"could not tell whether commands can become root: {exc}") from None

    return Read(ROOT_ACCESS, lambda platform: [(fact.name, fact.command(platform))], parse)


def sudoers_fix(node: str, user: str) -> str:
    """The one line that lets ``user`` become root without a password on ``node`` (bootstrap never
    types a sudo password: steps/root.py says the same when a step is refused)."""
    return (
        f"on {node}, as root: `echo '{user} ALL=(root) NOPASSWD: ALL' > /etc/sudoers.d/cluster-bootstrap "
        "&& chmod 440 /etc/sudoers.d/cluster-bootstrap` (check it with `visudo -c`), or connect as root"
    )


def check_root_access(f: PreflightFacts, needed_by: Sequence[str]) -> Verdict | None:
    """Can the login user run root commands without a password (``sudo -n``, as the firewall and time
    steps do)? ``needed_by``: the steps that will need it on this cluster (the main pipeline runs the
    firewall and time steps on clusters of 2+ nodes unless the inventory turns them off). Fails when
    one of them will, warns otherwise (only those commands, run by hand, would need it). None for
    Windows nodes: there the steps need an elevated WinRM session instead (WSL: ``wsl -u root``)."""
    node = f.node
    if node.os == "windows":
        return None
    access = f.root_access
    if access is None:
        why = f" ({f.root_access_error})" if f.root_access_error else ""
        return warn(
            "sudo",
            f"could not tell whether commands can become root here{why}",
            "check that `sudo -n true` works for this user on the node, or connect as root",
        )
    data: dict[str, Any] = {"user": access.user, "method": access.method, "needed_by": list(needed_by)}
    if access.method == "root":
        return ok("sudo", f"logged in as {access.user}: the firewall and time steps can run", **data)
    if access.method == "sudo":
        return ok("sudo", f"{access.user} can run root commands with `sudo -n` (no password)", **data)
    data["detail"] = access.detail
    why = f"{access.user} cannot run root commands without a password here ({access.detail})"
    fix = sudoers_fix(node.name, access.user)
    if needed_by:
        steps = " and ".join(needed_by)
        return fail(
            "sudo",
            f"{why}: the main pipeline's {steps} step{'s' if len(needed_by) > 1 else ''} would stop here "
            "(they run as root and never type a password)",
            f"{fix}; or leave them to someone else: "
            + ", ".join(f"{'firewall' if s == 'firewall' else 'time'}.manage: false" for s in needed_by)
            + " in the inventory",
            **data,
        )
    return warn(
        "sudo",
        f"{why}: only `bootstrap firewall` and `bootstrap ntp` need it, and this cluster's pipeline runs "
        "neither",
        fix,
        **data,
    )


def refused_root(found: dict[str, RootAccess | BootstrapError], needed_by: Sequence[str]) -> list[str]:
    """One line per node that cannot become root without a password, with its fix (empty: all can)."""
    steps = " and ".join(needed_by)
    lines = []
    for name, access in found.items():
        if isinstance(access, RootAccess) and access.method is None:
            lines.append(
                f"{name}: {access.user} cannot run root commands without a password ({access.detail}), "
                f"and the {steps} step{'s' if len(needed_by) > 1 else ''} run as root: "
                f"{sudoers_fix(name, access.user)}"
            )
    return lines
