"""A small interpreter of the product's PowerShell, on tree-sitter-pwsh parse trees: where the played
node decides an outcome (the put's hash check, the watchdog's rules, which processes `stop` takes
for the run's), it runs the part of the script that carries that decision, so a changed script
changes the outcome. What a script does to the machine (files, processes, the clock) stays with the
model, which hands the interpreter its stand-ins: commands by name, ``[Type]::Member`` statics and
.NET objects as Python objects (members matched case-insensitively).

Only the language the product's scripts use is known: statements (assignments, ``if``/``elseif``/
``else``, ``while``, ``foreach``, ``try``/``catch``/``finally``, ``exit``, ``return``, ``break``,
functions with a ``param`` list), and expressions (literals, variables, ``@()``, ``@{}``, casts,
members, indexes, ``+``, comparisons, ``-split``, ``-match``, ``-and``/``-or``/``-not``,
``-bor``/``-band``, ``+=``/``-=``). Anything else raises :class:`Unsupported`: a script the model
cannot read fails the test instead of being guessed at.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tree_sitter import Node

from tests import pwsh


class Unsupported(Exception):
    """The script uses a construct the interpreter does not know."""


class ScriptExit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Return(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


class _Break(Exception):
    pass


class PwshError(Exception):
    """A terminating error inside the script (a .NET exception): ``catch`` takes it."""


Command = Callable[[list[Any], dict[str, Any]], Any]


def text(node: Node) -> str:
    return (node.text or b"").decode()


def truth(value: Any) -> bool:
    if isinstance(value, list):
        return len(value) > 1 or (len(value) == 1 and truth(value[0]))
    if value is None:
        return False
    if isinstance(value, (bool, int, float, str)):
        return bool(value)
    return True


def member(obj: Any, name: str) -> Any:
    """``obj.Name``: an attribute of a stand-in object (any case), or what PowerShell gives strings,
    lists and hashtables."""
    lower = name.lower()
    if isinstance(obj, str) and lower == "length":
        return len(obj)
    if isinstance(obj, (list, dict)) and lower == "count":
        return len(obj)
    if isinstance(obj, (list, bytearray)) and lower == "length":  # an array (byte[]: a bytearray)
        return len(obj)
    if isinstance(obj, dict):
        return obj.get(name)
    for attr in dir(obj):
        if attr.lower() == lower and not attr.startswith("__"):
            return getattr(obj, attr)
    raise Unsupported(f"no member {name} on {type(obj).__name__}")


def call_method(obj: Any, name: str, args: list[Any]) -> Any:
    lower = name.lower()
    if isinstance(obj, str):
        if lower == "trim" and not args:
            return obj.strip()
        if lower == "trimend":
            return obj.rstrip("".join(str(a) for a in args))
        if lower == "tostring":
            return obj
        # .NET's ordinal string methods (case-sensitive, as PowerShell calls them)
        if lower == "contains":
            return str(args[0]) in obj
        if lower == "endswith":
            return obj.endswith(str(args[0]))
        if lower == "replace":
            return obj.replace(str(args[0]), str(args[1]))
        if lower == "substring":
            start = int(args[0])
            return obj[start:] if len(args) == 1 else obj[start : start + int(args[1])]
    if isinstance(obj, list) and lower == "add":
        obj.append(args[0])
        return None
    if isinstance(obj, dict) and lower == "containskey":
        return args[0] in obj
    method = member(obj, name)
    if not callable(method):
        raise Unsupported(f"{name} is not a method of {type(obj).__name__}")
    return method(*args)


def cast(type_name: str, value: Any) -> Any:
    lower = type_name.lower()
    try:
        if lower in ("int", "long", "int32", "int64"):
            return int(float(value)) if isinstance(value, (int, float, str)) else int(value)
        if lower == "byte":
            number = int(value)
            if not 0 <= number <= 255:
                raise ValueError(number)
            return number
        if lower == "string":
            return "" if value is None else str(value)
        if lower == "bool":
            return truth(value)
        if lower == "double":
            return float(value)
        if lower == "char":
            return chr(value) if isinstance(value, int) else str(value)[:1]
        if lower == "object[]":
            return [] if value is None else (list(value) if isinstance(value, list) else [value])
    except (TypeError, ValueError) as exc:
        raise PwshError(f"Cannot convert value {value!r} to type {type_name}") from exc
    raise Unsupported(f"cast to [{type_name}]")


def _unescape(body: str) -> str:
    """An expandable string's escapes (no variables: the product's expandable strings have none)."""
    if "$" in body:
        raise Unsupported(f"a variable in an expandable string: {body!r}")
    return re.sub(
        r"`(.)", lambda m: {"n": "\n", "r": "\r", "t": "\t", "0": "\0"}.get(m.group(1), m.group(1)), body
    )


def compare(op: str, left: Any, right: Any) -> Any:
    op = op.lower()
    if op in ("-split",):
        return re.split(str(right), "" if left is None else str(left), flags=re.I)
    if op in ("-match", "-notmatch", "-cmatch"):
        flags = 0 if op == "-cmatch" else re.I
        found = re.search(str(right), "" if left is None else str(left), flags) is not None
        return found if op != "-notmatch" else not found
    if isinstance(left, list):
        return [item for item in left if compare(op, item, right)]
    if left is None or right is None:
        same = left is right or (left is None and right is None)
        if op == "-eq":
            return same
        if op == "-ne":
            return not same
    if isinstance(left, str):
        a, b = left.lower(), ("" if right is None else str(right)).lower()
    elif isinstance(left, bool):
        a, b = left, truth(right)
    elif isinstance(left, (int, float)):
        a = left
        try:
            b = float(right)
        except (TypeError, ValueError) as exc:
            raise PwshError(f"cannot compare {left!r} with {right!r}") from exc
    else:
        a, b = left, right
    ops: dict[str, Callable[[Any, Any], bool]] = {
        "-eq": lambda x, y: x == y,
        "-ne": lambda x, y: x != y,
        "-gt": lambda x, y: x > y,
        "-ge": lambda x, y: x >= y,
        "-lt": lambda x, y: x < y,
        "-le": lambda x, y: x <= y,
    }
    if op not in ops:
        raise Unsupported(f"operator {op}")
    return ops[op](a, b)


class Interpreter:
    """Runs statements of one script: ``variables`` (lower-cased names, with ``$``), the model's
    ``commands`` and ``statics`` (``"[type]::member"`` lower-cased: a value, or a function of the
    arguments for a method), and the script's own functions once :meth:`define` has seen them."""

    def __init__(
        self,
        variables: dict[str, Any] | None = None,
        commands: dict[str, Command] | None = None,
        statics: dict[str, Any] | None = None,
    ) -> None:
        self.scopes: list[dict[str, Any]] = [
            {"$true": True, "$false": False, "$null": None, **(variables or {})}
        ]
        self.commands = {k.lower(): v for k, v in (commands or {}).items()}
        self.statics = {k.lower(): v for k, v in (statics or {}).items()}
        self.functions: dict[str, Node] = {}

    # -- variables ------------------------------------------------------------------------------------

    def get(self, name: str) -> Any:
        name = name.lower()
        name = name.replace("$script:", "$")
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise Unsupported(f"variable {name} is not set")  # StrictMode: an unset variable is an error

    def set(self, name: str, value: Any) -> None:
        name = name.lower()
        if name.startswith("$script:"):
            self.scopes[0]["$" + name[8:]] = value
            return
        self.scopes[-1][name] = value

    # -- functions ------------------------------------------------------------------------------------

    def define(self, tree_or_node: Any) -> None:
        """Every ``function NAME`` of the script (a model command of the same name wins)."""
        root = getattr(tree_or_node, "root_node", tree_or_node)
        for node in pwsh.walk(root):
            if node.type == "function_statement":
                name = text(node.child_by_field_name("function_name") or _first(node, "function_name"))
                self.functions.setdefault(name.lower(), node)

    def invoke(self, name: str, positional: list[Any], named: dict[str, Any]) -> Any:
        lower = name.lower()
        if lower in self.commands:
            return self.commands[lower](positional, named)
        node = self.functions.get(lower)
        if node is None:
            raise Unsupported(f"command {name}")
        params: list[tuple[str, str | None]] = []
        declaration = _first(node, "function_parameter_declaration")
        if declaration is not None:
            for p in pwsh.walk(declaration):
                if p.type == "script_parameter":
                    variable = _first(p, "variable")
                    attribute = _first(p, "type_literal")
                    type_name = text(attribute)[1:-1] if attribute is not None else None
                    params.append((text(variable).lower(), type_name))
        scope: dict[str, Any] = {}
        rest = list(positional)
        for variable, type_name in params:
            key = variable[1:]
            if key in named:
                value = named[key]
            elif rest:
                value = rest.pop(0)
            else:
                value = None
            scope[variable] = cast(type_name, value) if type_name else value
        self.scopes.append(scope)
        try:
            body = _first(node, "script_block")
            outputs = self.block(body) if body is not None else []
        except _Return as done:
            return done.value
        finally:
            self.scopes.pop()
        return outputs[0] if len(outputs) == 1 else (outputs or None)

    # -- statements -----------------------------------------------------------------------------------

    def run(self, nodes: list[Node]) -> list[Any]:
        """Statements in order; the values they output (PowerShell's pipeline output)."""
        out: list[Any] = []
        for node in nodes:
            value = self.statement(node)
            if value is not _NOTHING:
                out.append(value)
        return out

    def block(self, node: Node) -> list[Any]:
        statements: list[Node] = []
        for child in pwsh.walk(node):
            if child.type == "statement_list":
                statements = list(child.children)
                break
        return self.run(statements)

    def statement(self, node: Node) -> Any:
        kind = node.type
        if kind in ("empty_statement", "comment", ";"):
            return _NOTHING
        if kind == "function_statement":
            self.define(node)
            return _NOTHING
        if kind in ("pipeline", "pipeline_chain") and node.named_child_count == 1:
            return self.statement(node.named_children[0])
        if kind == "assignment_expression":
            self.assign(node)
            return _NOTHING
        if kind == "if_statement":
            return self._if(node)
        if kind == "while_statement":
            condition = _condition(node)
            body = _first(node, "statement_block")
            try:
                while truth(self.value(condition)):
                    self.block(body)
            except _Break:
                pass
            return _NOTHING
        if kind == "foreach_statement":
            variable = text(_first(node, "variable"))
            items = self.value(node.named_children[1])
            try:
                for item in items if isinstance(items, list) else [items]:
                    self.set(variable, item)
                    self.block(_first(node, "statement_block"))
            except _Break:
                pass
            return _NOTHING
        if kind == "try_statement":
            return self._try(node)
        if kind == "flow_control_statement":
            word = node.children[0].type
            argument = node.named_children[0] if node.named_child_count else None
            if word == "exit":
                raise ScriptExit(int(self.value(argument)) if argument is not None else 0)
            if word == "return":
                raise _Return(self.value(argument) if argument is not None else None)
            if word == "break":
                raise _Break()
            raise Unsupported(text(node))
        value = self.value(node)
        return _NOTHING if value is None and kind == "command" else value

    def _if(self, node: Node) -> Any:
        if truth(self.value(_condition(node))):
            return _one(self.block(_first(node, "statement_block")))
        clauses = _first(node, "elseif_clauses")
        for clause in clauses.named_children if clauses is not None else []:
            if truth(self.value(_condition(clause))):
                return _one(self.block(_first(clause, "statement_block")))
        otherwise = _first(node, "else_clause")
        if otherwise is not None:
            return _one(self.block(_first(otherwise, "statement_block")))
        return _NOTHING

    def _try(self, node: Node) -> Any:
        finally_clause = _first(node, "finally_clause")
        try:
            return _one(self.block(_first(node, "statement_block")))
        except PwshError as error:
            clauses = _first(node, "catch_clauses")
            if clauses is None:
                raise
            self.scopes[-1]["$_"] = error
            return _one(self.block(_first(clauses.named_children[0], "statement_block")))
        finally:
            if finally_clause is not None:
                self.block(_first(finally_clause, "statement_block"))

    def assign(self, node: Node) -> None:
        left = text(node.children[0]).strip()
        op = text(node.children[1]).strip()
        right = self.value(node.children[-1])
        if left.lower() == "$null":
            return
        if op == "=":
            self.set(left, right)
        elif op == "+=":
            current = self.get(left)
            self.set(left, _add(current, right))
        elif op == "-=":
            self.set(left, self.get(left) - right)
        else:
            raise Unsupported(f"assignment {op}")

    # -- expressions ----------------------------------------------------------------------------------

    def value(self, node: Node) -> Any:
        kind = node.type.replace("_argument_expression", "_expression")
        named = node.named_children
        if (
            kind
            in (
                "pipeline",
                "pipeline_chain",
                "while_condition",
                "unary_expression",
                "assignment_value",
                "argument_expression",
                "string_literal",
                "parenthesized_expression",
                "expression_with_unary_operator",
            )
            and len(named) == 1
            and kind != "expression_with_unary_operator"
        ):
            return self.value(named[0])
        if kind == "parenthesized_expression" or (kind == "pipeline" and len(named) == 1):
            return self.value(named[0])
        if kind == "variable":
            return self.get(text(node))
        if kind == "integer_literal":
            return int(text(node))
        if kind == "real_literal":
            return float(text(node))
        if kind == "verbatim_string_characters":
            return text(node)[1:-1].replace("''", "'")
        if kind == "expandable_string_literal":
            return _unescape(text(node)[1:-1])
        if kind == "array_expression":
            inner = _first(node, "statement_list")
            values = self.run(list(inner.children)) if inner is not None else []
            flat: list[Any] = []
            for v in values:
                flat.extend(v if isinstance(v, list) else [v])
            return flat
        if kind == "array_literal_expression":  # a, b, c
            return [self.value(item) for item in named]
        if kind == "hash_literal_expression":
            table: dict[str, Any] = {}
            for entry in pwsh.walk(node):
                if entry.type == "hash_entry":
                    key, val = entry.named_children[0], entry.named_children[-1]
                    table[text(key).strip()] = self.value(val)
            return table
        if kind == "expression_with_unary_operator":
            return self._unary(node)
        if kind == "cast_expression":
            type_node = _first(node, "type_literal")
            return cast(text(type_node)[1:-1], self.value(named[-1]))
        if kind in ("logical_expression",):
            left = truth(self.value(named[0]))
            op = text(node.children[1]).lower()
            if op == "-and":
                return left and truth(self.value(named[-1]))
            if op == "-or":
                return left or truth(self.value(named[-1]))
            raise Unsupported(op)
        if kind == "bitwise_expression":
            op = text(node.children[1]).lower()
            left, right = self.value(named[0]), self.value(named[-1])
            if op == "-bor":
                return int(left) | int(right)
            if op == "-band":
                return int(left) & int(right)
            raise Unsupported(op)
        if kind == "comparison_expression":
            op = text(_first(node, "comparison_operator"))
            return compare(op, self.value(named[0]), self.value(named[-1]))
        if kind == "additive_expression":
            op = text(node.children[1])
            left, right = self.value(named[0]), self.value(named[-1])
            if op == "+":
                return _add(left, right)
            if op == "-":
                return left - right
            raise Unsupported(op)
        if kind == "multiplicative_expression":
            op = text(node.children[1])
            left, right = self.value(named[0]), self.value(named[-1])
            if op == "*":
                return left * right
            if op == "/":
                return left / right
            if op == "%":
                return left % right
            raise Unsupported(op)
        if kind == "member_access":
            target, name = named[0], text(named[-1])
            if target.type == "type_literal":
                return self._static(text(target), name, None)
            return member(self.value(target), name)
        if kind == "invocation_expression":
            target, name = named[0], text(_first(node, "member_name"))
            arguments = _first(node, "argument_list")
            listed = _first(arguments, "argument_expression_list") if arguments is not None else None
            args = [self.value(a) for a in listed.named_children] if listed is not None else []
            if target.type == "type_literal":
                return self._static(text(target), name, args)
            return call_method(self.value(target), name, args)
        if kind == "element_access":
            items = self.value(named[0])
            index = int(self.value(named[1]))
            try:
                return items[index]
            except (IndexError, TypeError):
                return None
        if kind == "command":
            return self._command(node)
        raise Unsupported(f"{kind}: {text(node)[:80]}")

    def _unary(self, node: Node) -> Any:
        first = node.children[0]
        if first.type == "cast_expression" or node.named_children[0].type == "cast_expression":
            return self.value(node.named_children[0])
        op = text(first).lower()
        operand = self.value(node.named_children[-1])
        if op in ("-not", "!"):
            return not truth(operand)
        if op == "-":
            return -operand
        raise Unsupported(f"unary {op}")

    def _static(self, type_text: str, name: str, args: list[Any] | None) -> Any:
        key = f"{type_text}::{name}".lower()
        if key not in self.statics:
            raise Unsupported(f"{type_text}::{name}")
        found = self.statics[key]
        return found(*args) if args is not None else found

    def _command(self, node: Node) -> Any:
        name = text(node.child_by_field_name("command_name") or node.named_children[0])
        positional: list[Any] = []
        named: dict[str, Any] = {}
        elements = node.child_by_field_name("command_elements")
        pending: str | None = None
        for el in elements.children if elements is not None else []:
            if el.type == "command_argument_sep":
                continue
            if el.type == "command_parameter":
                if pending is not None:
                    named[pending] = True
                pending = text(el)[1:].lower()
                continue
            value = self.value(el) if el.type != "generic_token" else text(el)
            if pending is not None:
                named[pending] = value
                pending = None
            else:
                positional.append(value)
        if pending is not None:
            named[pending] = True
        return self.invoke(name, positional, named)


class _Nothing:
    pass


_NOTHING: Any = _Nothing()


def _one(values: list[Any]) -> Any:
    return values[0] if len(values) == 1 else (values if values else _NOTHING)


def _add(left: Any, right: Any) -> Any:
    if isinstance(left, list):
        return left + (right if isinstance(right, list) else [right])
    if isinstance(left, str):
        return left + ("" if right is None else str(right))
    return left + right


def _first(node: Node, kind: str) -> Any:
    for child in node.children:
        if child.type == kind:
            return child
    return None


def _condition(node: Node) -> Node:
    """The condition of ``if``/``elseif``/``while``: what stands between its parentheses."""
    for child in node.children:
        if child.type in ("pipeline", "while_condition"):
            return child
    raise Unsupported(f"no condition in {text(node)[:60]}")


def functions_of(script: str) -> Interpreter:
    """An interpreter knowing the script's functions (nothing run yet)."""
    tree = pwsh.assert_parses(script)
    interpreter = Interpreter()
    interpreter.define(tree)
    return interpreter


def statements_after(tree: Any, variable: str) -> list[Node]:
    """The script's top-level statements after the one assigning ``variable`` (``$name``)."""
    top = _first(tree.root_node, "statement_list")
    statements = list(top.children) if top is not None else []
    for index, node in enumerate(statements):
        if text(node).lower().startswith(variable.lower() + " ="):
            return statements[index + 1 :]
    raise Unsupported(f"{variable} is never assigned at the top of the script")
