"""The command lines a user is told to type next (follow a run, stop it, train without a lost node, a
check's fix): pasted, each acts on the same cluster, reached the same way, as the command that
suggested it."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from orchestrator.inventory import Inventory


class Reach(Protocol):
    """The options that say which inventory and how to reach its nodes, as the user gave them."""

    @property
    def inventory(self) -> Path | None: ...

    @property
    def known_hosts(self) -> Path | None: ...

    @property
    def ssh_config(self) -> Path | None: ...


def _reach_words(reach: Reach) -> list[str]:
    """``-i``, ``--known-hosts``, ``--ssh-config`` as the user gave them, quoted for a shell."""
    words = []
    for option, value in (
        ("-i", reach.inventory),
        ("--known-hosts", reach.known_hosts),
        ("--ssh-config", reach.ssh_config),
    ):
        if value is not None:
            words += [option, shlex.quote(str(value))]
    return words


def again(reach: Reach, command: str, run_id: str) -> str:
    """The command line a user types next for this run: the same inventory and the files that say
    how to reach its nodes (``--known-hosts``, ``--ssh-config``: without them the pasted line would
    refuse the host keys). No ``--nodes``: a run spans every node of the inventory."""
    return " ".join(["bootstrap", *_reach_words(reach), command, "--run", shlex.quote(run_id)])


def train_without(reach: Reach, inventory: Inventory, dead: Sequence[str], command: str = "") -> str:
    """What to type to train on the nodes that answered while ``dead`` do not: this command with the
    options that say how to reach the cluster, ``--nodes`` the others (sized to them), ``--master``
    one of them when the master is among ``dead``. "" when no node is left."""
    left = [n.name for n in inventory.nodes if n.name not in dead]
    if not dead or not left:
        return ""
    words = ["bootstrap", *_reach_words(reach), *([command] if command else [])]
    words += ["--nodes", shlex.quote(",".join(left))]
    if inventory.cluster.master not in left:
        words += ["--master", shlex.quote(left[0])]
    more, extra = _run_words(inventory)
    return (
        f"to train without {', '.join(dead)} until {'they are' if len(dead) > 1 else 'it is'} back: "
        f"`{' '.join(words + more)}`{extra}"
    )


def _run_words(inventory: Inventory) -> tuple[list[str], str]:
    """This run's ``-e`` and ``--`` words as typed (quoted), to repeat in a suggested command; none,
    and a phrase saying so, when one of them looks secret (a secret-looking name or flag, a URL with a
    login in it: never printed)."""
    from orchestrator.inventory.model import is_secret_name, masked_args
    from orchestrator.redact import has_url_credentials

    env = inventory.run_overrides.get("env") or {}
    args = inventory.run_overrides.get("args")
    logins = any(has_url_credentials(str(word)) for word in [*env.values(), *(args or ())])
    if (
        logins
        or any(is_secret_name(name) for name in env)
        or (args is not None and masked_args(args) != tuple(args))
    ):
        return [], " with this run's -e and -- arguments (not repeated here: secret-looking values)"
    words = [f"--script {shlex.quote(script)}"] if (script := inventory.run_overrides.get("script")) else []
    words += [f"-e {shlex.quote(f'{name}={value}')}" for name, value in env.items()]
    if args is not None:
        words += ["--", *map(shlex.quote, args)]
    return words, ""


def with_user_options(reach: Reach, text: str) -> str:
    """``text`` (a fix hint) with every `` `bootstrap CMD` `` it suggests given the options this
    command had (``-i``, ``--known-hosts``, ``--ssh-config``): pasted, it acts on the same cluster,
    not on the embedded local inventory. A suggestion naming its own ``-i`` is left as it is."""
    words = _reach_words(reach)
    if not words:
        return text
    options = re.compile(r"(?:^|\s)(?:-i|--inventory|--known-hosts|--ssh-config)(?:[\s=]|$)")

    def given(match: re.Match[str]) -> str:
        # a suggestion that names its own options already (or was given them: messages pass here once
        # more on their way to the terminal) is left as it is; words after `--` are the script's
        own = match.group(1).split(" -- ", 1)[0]
        return match.group(0) if options.search(own) else f"`bootstrap {' '.join(words)} {match.group(1)}`"

    return re.sub(r"`bootstrap ([^`]*)`", given, text)
