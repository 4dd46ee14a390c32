"""Passwords for nodes: from an environment variable, the inventory (Ansible literal) or a terminal prompt.

Nothing here stores a password on a model or prints one. :class:`PasswordResolver` caches each distinct
secret (one environment variable, one ``user@host`` prompt) so a secret is asked for at most once per
process, also when many worker threads need it at the same time.
"""

from __future__ import annotations

import getpass
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping

from pydantic import SecretStr

from orchestrator.errors import SecretMissingError
from orchestrator.inventory.model import Node, inventory_password

__all__ = ["PasswordResolver", "default_prompt"]

Prompt = Callable[[str], str]


def default_prompt() -> Prompt | None:
    """``getpass.getpass`` when stdin is a terminal, else None (nobody could answer)."""
    try:
        interactive = sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError):
        interactive = False
    return getpass.getpass if interactive else None


class PasswordResolver:
    """Finds the password of a node; thread-safe; asks for each distinct secret at most once."""

    def __init__(self, prompt: Prompt | None, environ: Mapping[str, str] = os.environ) -> None:
        self._prompt = prompt
        self._environ = environ
        self._lock = threading.Lock()  # held while prompting: one question on the terminal at a time
        self._cache: dict[tuple[str, ...], SecretStr] = {}

    def __repr__(self) -> str:
        return f"PasswordResolver(cached={len(self._cache)}, prompt={'yes' if self._prompt else 'no'})"

    def password_for(self, node: Node) -> str | None:
        """The password for ``node``, or None when the node does not use one.

        Order: the environment variable ``password_env`` when set; a literal password from the inventory;
        a prompt (for a missing ``password_env`` variable or ``password_prompt: true``).
        Raises :class:`SecretMissingError` when a prompt is needed but none is available.
        """
        if node.password_env:
            value = self._environ.get(node.password_env)
            if value:
                return value
        literal = inventory_password(node)
        if literal is not None:
            return literal.get_secret_value()
        if node.password_env:
            state = "is empty" if node.password_env in self._environ else "is not set"
            return self._ask(
                ("env", node.password_env),
                f"Password for node '{node.name}' ({node.password_env} {state}): ",
                node,
                message=f"no password: environment variable {node.password_env} {state}",
                hint=f"export {node.password_env}=... or run from a terminal to be prompted",
            )
        if node.password_prompt:
            who = f"{node.user}@{node.host}" if node.user else node.host
            return self._ask(
                ("prompt", node.user or "", node.host.lower()),
                f"Password for {who} (node '{node.name}'): ",
                node,
                message=f"a password for {who} is needed (password_prompt) but there is no terminal to ask",
                hint="run from a terminal, or set password_env and export that variable",
            )
        return None

    def ask_now(self, nodes: Iterable[Node]) -> None:
        """Every password ``nodes`` need, asked now, before parallel work starts (one prompt per
        distinct secret); a node whose password cannot be had fails when it connects, not here."""
        for node in nodes:
            try:
                self.password_for(node)
            except SecretMissingError:
                pass  # the node fails with this error when it connects; the others go on

    def _ask(self, key: tuple[str, ...], question: str, node: Node, *, message: str, hint: str) -> str:
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                return cached.get_secret_value()
            if self._prompt is None:
                raise SecretMissingError(message, node=node.name, hint=hint)
            answer = self._prompt(question)
            self._cache[key] = SecretStr(answer)
            return answer
