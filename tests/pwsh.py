"""PowerShell syntax trees for tests: no PowerShell runs on this machine, so every script the product
generates is parsed and asserted on instead. tree-sitter-pwsh, not tree-sitter-powershell: the latter
rejects valid ``param()`` blocks with default values."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import tree_sitter_pwsh
from tree_sitter import Language, Node, Parser, Tree

_LANGUAGE = Language(tree_sitter_pwsh.language())


def parse(script: str) -> Tree:
    return Parser(_LANGUAGE).parse(script.encode("utf-8"))


def walk(node: Node) -> Iterator[Node]:
    yield node
    for child in node.children:
        yield from walk(child)


def errors(tree: Tree) -> list[str]:
    """Every ERROR or MISSING node, as ``line:col: text`` (empty: the script parses cleanly)."""
    found = []
    for node in walk(tree.root_node):
        if node.type == "ERROR" or node.is_missing:
            text = (node.text or b"").decode("utf-8", "replace")[:60]
            found.append(f"{node.start_point[0] + 1}:{node.start_point[1] + 1}: {node.type} {text!r}")
    return found


@dataclass
class Command:
    """One command invocation on the tree: its name and its elements (parameters and arguments)."""

    name: str
    parameters: list[str]  # "-Name" as written (lowercased)
    arguments: list[str]  # source text of every non-parameter element

    def has(self, parameter: str) -> bool:
        return parameter.lower() in self.parameters


def commands_of(node: Node) -> Command:
    """The command at ``node`` (a ``command`` node)."""
    name_node = node.child_by_field_name("command_name")
    name = (name_node.text or b"").decode() if name_node is not None else ""
    params: list[str] = []
    args: list[str] = []
    elements = node.child_by_field_name("command_elements")
    if elements is not None:
        for el in elements.children:
            text = (el.text or b"").decode()
            if el.type == "command_parameter":
                params.append(text.lower())
            elif el.type != "command_argument_sep":
                args.append(text)
    return Command(name, params, args)


def commands(tree: Tree) -> list[Command]:
    return [
        commands_of(node)
        for node in walk(tree.root_node)
        if node.type == "command" and node.child_by_field_name("command_name") is not None
    ]


def assert_parses(script: str) -> Tree:
    tree = parse(script)
    problems = errors(tree)
    assert not problems, "PowerShell parse errors:\n" + "\n".join(problems) + "\n--- script ---\n" + script
    return tree
