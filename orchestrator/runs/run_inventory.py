"""The inventory as one run uses it: the training script's arguments given after ``--``, ``-e
NAME=VALUE`` added to train.env, ``--nodes`` (the job sized to them) and ``--master``."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from orchestrator.errors import UsageError
from orchestrator.inventory import Inventory, Node
from orchestrator.platforms import check_env_name
from orchestrator.redact import looks_like_token


class Selection(Protocol):
    """The nodes a command was given (``--nodes``: names, globs, tag:NAME); empty: every node."""

    @property
    def nodes(self) -> Sequence[str]: ...

    @property
    def inventory(self) -> object | None: ...


def parse_env_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``-e NAME=VALUE`` options as a dict (later ones win); a UsageError (exit 2) naming the bad one
    by its name alone: its value may be a secret (a word without ``=`` is shown only when it has an
    upper-case variable name's shape)."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            # DEBUG is shown; a token (AKIA..., hf_...) never
            named = pair.isidentifier() and pair.isupper() and not looks_like_token(pair)
            shown = repr(pair) if named else "(a word without '=', not repeated here)"
            raise UsageError(f"--env {shown}: expected NAME=VALUE")
        try:
            env[check_env_name(name)] = value
        except ValueError as exc:
            raise UsageError(f"--env {name + '=...'!r}: {exc}") from None
    return env


def for_run(
    inventory: Inventory, args: Sequence[str] | None, env_pairs: Sequence[str], script: str | None = None
) -> Inventory:
    """The inventory as this run uses it: ``args`` (given after ``--``) replace train.args, ``-e``
    values are added to train.env, ``--script`` replaces train.script."""
    return inventory.for_run(args, parse_env_pairs(env_pairs), script)


def inventory_as_command(args: Sequence[str]) -> str:
    """`bootstrap hosts.yaml`: an inventory file given where a command goes, said with the line that
    does what was meant ("": the word is no file of an inventory's kind)."""
    word = args[0] if args else ""
    if not (word.endswith((".yaml", ".yml", ".ini")) or Path(word).is_file()):
        return ""
    said = f"No such command {word!r}: an inventory is given with -i."
    if _secret_looking(args[1:]):  # never repeated: the words hold a secret-looking value
        return f"{said} Type `bootstrap -i {shlex.quote(word)}` before the rest of the line."
    return f"{said} Did you mean `{shlex.join(['bootstrap', '-i', word, *args[1:]])}`?"


def refuse_stray_args(selection: Selection, args: Sequence[str], typed: Sequence[str]) -> None:
    """Words typed for `launch` that are not after ``--`` (``args``: every word click left over, those
    before ``--`` first; ``typed``: every word after ``bootstrap``): not the training script's.
    `launch hosts.yaml` forgot -i (the embedded default would train the example with that name as its
    argument), `launch other.py` meant ``--script``, and `launch 0.1` would start every node for a
    script that refuses the word. The line to type is the one typed, those words moved."""
    after_dashes = typed[typed.index("--") + 1 :] if "--" in typed else ()
    stray = list(args[: len(args) - len(after_dashes)])
    if not stray:
        return
    first = stray[0]
    if selection.inventory is None and first.endswith((".yaml", ".yml")):
        raise UsageError(
            f"{first!r} looks like an inventory, given where the training script's arguments go",
            hint=f"`bootstrap -i {first} launch` (arguments for the script go after `--`)",
        )
    words = list(typed)
    cut = words.index("--") if "--" in words else len(words)
    before, after = words[:cut], words[cut + 1 :]
    for word in stray:  # each where it was typed: not an option's value, if it can be told apart
        spots = [i for i, w in enumerate(before) if w == word]
        loose = [i for i in spots if i == 0 or not before[i - 1].startswith("-") or "=" in before[i - 1]]
        if spots:
            del before[(loose or spots)[-1]]
    given = any(w == "--script" or w.startswith("--script=") for w in before)  # a script named already
    script = first.endswith(".py") and len(stray) == 1 and not given
    meant = "trains that script" if script else "gives them to the training script"
    if _secret_looking(typed):
        how = f"`--script {shlex.quote(first)}` trains that script" if script else "put them after `--`"
        named = f"{len(stray)} word(s) before `--`" if _secret_looking(stray) else shlex.join(stray)
        raise UsageError(
            f"{named}: words for the training script go after `--` (before it, only options)",
            hint=f"{how} (the line typed is not repeated here: it holds secret-looking values)",
        )
    if script:
        at = before.index("launch") + 1 if "launch" in before else len(before)
        before[at:at] = ["--script", first]
        line = shlex.join([*before, *(["--", *after] if after else [])])
    else:
        line = shlex.join([*before, "--", *stray, *after])
    raise UsageError(
        f"{shlex.join(stray)}: words for the training script go after `--` (before it, only options)",
        hint=f"`bootstrap {line}` {meant}",
    )


def _secret_looking(words: Sequence[str]) -> bool:
    """Words that hold a secret-looking value (`-e HF_TOKEN=...`, `--api-key X`, a URL with a
    login): a line repeating them is never printed (runs.next_command's rule for `-e` and `--`)."""
    from orchestrator.inventory.model import is_secret_name, masked_args
    from orchestrator.redact import has_url_credentials

    names = [w.removeprefix("--env=").split("=", 1)[0].removeprefix("-e") for w in words if "=" in w]
    return (
        any(has_url_credentials(w) or looks_like_token(w.rsplit("=", 1)[-1]) for w in words)
        or any(is_secret_name(name) for name in names if name)
        or masked_args(words) != tuple(words)
    )


def selected(selection: Selection, inventory: Inventory) -> list[Node]:
    """The nodes of ``inventory`` that ``--nodes`` names (all of them without it)."""
    return inventory.select(selection.nodes) if selection.nodes else list(inventory.nodes)


def run_nodes(selection: Selection, inventory: Inventory, master: str | None) -> Inventory:
    """The inventory a run uses: with ``--nodes``, only those nodes (the job is sized to them) and
    ``--master`` when given (:meth:`Inventory.only`); else the whole inventory."""
    if not selection.nodes and master is None:
        return inventory
    return inventory.only(selected(selection, inventory), master=master)
