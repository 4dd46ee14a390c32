"""Transports move bytes; platforms speak the shell (docs/design.md, issue 13).

Two rules, checked on the source of ``orchestrator/transports/``:

- no shell, PowerShell or cmd text: every script a transport sends (file transfers, clean-up, the
  runner of an uploaded script) and every command it tells a person to type on a node comes from a
  platform;
- no probing of a platform: what a transport needs is declared on ``Platform`` (``getattr`` on a
  platform would hide a method missing from the base class), and no ``isinstance`` per dialect.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TRANSPORTS = Path(__file__).resolve().parents[2] / "orchestrator" / "transports"

#: text that only a shell script (sh, PowerShell, cmd) holds
SHELL_TEXT = [
    "$ErrorActionPreference",
    "$ProgressPreference",
    "Set-Content",
    "[Convert]::",
    "[Console]::",
    "[IO.",
    "New-Item",
    "New-Object",
    "Remove-Item",
    "Move-Item",
    "Join-Path",
    "Get-FileHash",
    "Set-ItemProperty",
    "New-NetFirewallRule",
    "Enable-PSRemoting",
    "winrm set ",
    "$env:",
    "printf",
    "base64 -d",
    "base64 -w",
    "sha256sum",
    "mv -f",
    "rm -f",
    "mkdir -p",
    "2>/dev/null",
    "/bin/sh",
]
_SHELL_TEXT = re.compile("|".join(re.escape(s) for s in SHELL_TEXT))
#: the platform classes: a transport that asks "which dialect is this?" is doing a platform's job
DIALECTS = {"PosixShell", "PowerShell", "WslShell"}


def _modules() -> list[Path]:
    found = sorted(TRANSPORTS.glob("*.py"))
    assert found, f"no modules under {TRANSPORTS}"
    return found


def shell_text(path: Path) -> list[str]:
    """``file:line: text`` for every line of ``path`` holding shell text (comments included)."""
    hits = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        match = _SHELL_TEXT.search(line)
        if match:
            hits.append(f"{path.name}:{number}: {match.group(0)!r} in {line.strip()[:100]}")
    return hits


def _names_platform(node: ast.expr) -> bool:
    """``platform``, ``self.platform``, ``transport.platform``, ``inner_platform``..."""
    if isinstance(node, ast.Name):
        return "platform" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "platform" in node.attr.lower() or _names_platform(node.value)
    return False


def platform_probes(path: Path) -> list[str]:
    """``file:line`` of every getattr/hasattr on a platform and every isinstance against a dialect."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        name = node.func.id
        if name in ("getattr", "hasattr") and _names_platform(node.args[0]):
            hits.append(f"{path.name}:{node.lineno}: {name}() on {ast.unparse(node.args[0])}")
        if name == "isinstance" and len(node.args) == 2:
            classes = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            classes |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if classes & DIALECTS:
                hits.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_transports_hold_no_shell_text() -> None:
    hits = [hit for path in _modules() for hit in shell_text(path)]
    assert not hits, "shell text in orchestrator/transports (move it to the platform):\n" + "\n".join(hits)


def test_transports_never_probe_a_platform() -> None:
    hits = [hit for path in _modules() for hit in platform_probes(path)]
    assert not hits, "declare what transports use on Platform instead:\n" + "\n".join(hits)


# -- the checks themselves catch what they are for ----------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "SCRIPT = \"$ErrorActionPreference = 'Stop'\"\n",
        "line = f'rm -f -- {path}'\n",
        "x = 'echo \"sha256 $(sha256sum < f)\"'\n",
        "hint = 'run `winrm set winrm/config/winrs @{MaxShellsPerUser=\"50\"}`'\n",
    ],
)
def test_shell_text_is_found_with_its_line(tmp_path: Path, source: str) -> None:
    module = tmp_path / "fake.py"
    module.write_text("import os\n" + source)
    assert [hit.split(":")[:2] for hit in shell_text(module)] == [["fake.py", "2"]]


def test_probing_is_found_and_other_getattr_is_not(tmp_path: Path) -> None:
    module = tmp_path / "fake.py"
    module.write_text(
        "limit = getattr(platform, 'MAX_COMMAND_LINE', 8191)\n"
        "run = getattr(self.platform, 'run_script', None)\n"
        "ok = isinstance(self.platform, (PowerShell, x.PosixShell))\n"
        "reason = getattr(exc, 'reason', None)\n"
        "fine = isinstance(exc, OSError)\n"
    )
    assert [hit.split(":")[1] for hit in platform_probes(module)] == ["1", "2", "3"]
