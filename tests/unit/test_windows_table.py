"""docs/windows.md "What the tests prove": every row names tests that exist, or says why none can.

A row backs its claim with test references written as `tests/path.py::test_name` (a parametrized
test without its ``[...]``), or says **real Windows only** or **documented, not recorded**. Test
names are collected by parsing the files with ``ast``: a renamed or deleted test fails here, not
silently in the documentation.

A row whose evidence is the played node or the test server (its second column says so: see
:data:`PLAYED`) must name an integration or end-to-end test: a unit test of script text proves what
the script says, not what a node does with it. A row backed only by the script's text says
**script text only** and names the unit tests that read it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "windows.md"
SECTION = "## What the tests prove"
#: a reference to a file under tests/, with an optional ::test_name
REFERENCE = re.compile(r"`(tests/[A-Za-z0-9_./-]+?)(?:::([A-Za-z_][A-Za-z0-9_]*)(?:\[[^\]`]*\])?)?`")
VERDICTS = ("real Windows only", "documented, not recorded")
#: words of a row's second column that claim a stand-in node showed the behaviour
PLAYED = ("played node", "the server plays", "the server runs", "the server emulates", "the server enforces")
SCRIPT_TEXT_ONLY = "script text only"
#: tests that run against a server or a cluster (not a unit test of text)
RUNNING = ("tests/integration/", "tests/e2e/")
#: what issue 18 found missing from the table: each must keep a row
REQUIRED_TOPICS = (
    "Defender",
    "Hyper-V",
    "w32time",
    "env sync to native nodes",
    "code sync to native nodes",
    "validate on native nodes",
    "reachability mesh on a native node",
    "mode checks",
    "elevation check",
    "WSL run-as-root",
    "elastic and NCCL refused",
    "idle shell",
    "winrm.transport: certificate",
    "native Windows node beside Linux",
    "WSL_UTF8",
    "UTF-16LE",
    "kill_tree",
    "MaxProcessesPerShell",
    "MaxMemoryPerShellMB",
    "outside the WinRS shell's job",
    "composed, not recorded",
    # issue 32
    "run -b",
    "train.script",
    "NVSMI",
    "65001",
    "/resync",
    "-Profile Any",
    "bench",
    "`started-before` record",
    "MaxMemoryPerShellMB",
)


def table_rows(text: str) -> list[str]:
    """The body rows of every table in the section (header and separator rows left out)."""
    start = text.index(SECTION)
    following = text.find("\n## ", start + len(SECTION))
    section = text[start : following if following >= 0 else len(text)]
    rows: list[str] = []
    for block in re.split(r"\n\s*\n", section):
        lines = [line for line in block.splitlines() if line.startswith("|")]
        if len(lines) >= 2 and re.fullmatch(r"\|( *-+ *\|)+", lines[1].replace(":", "-")):
            rows.extend(lines[2:])
    return rows


def defined_functions(path: Path) -> set[str]:
    """Every function defined in the file (tests, also inside classes), by parsing it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def problems(rows: list[str], root: Path = REPO) -> list[str]:
    """What is wrong with the rows: a named file or test that does not exist, a row with neither a
    test nor a verdict, a row without its three columns."""
    found: list[str] = []
    names: dict[Path, set[str]] = {}
    for row in rows:
        label = row[:70]
        cells = re.split(r"(?<!\\)\|", row.strip().strip("|"))
        if len(cells) != 3:
            found.append(f"{label}...: {len(cells)} columns, not 3")
        references = REFERENCE.findall(row)
        if not references and not any(verdict in row for verdict in VERDICTS):
            found.append(f"{label}...: names no test and says neither of {VERDICTS}")
        backing = cells[1] if len(cells) == 3 else row
        running = [file for file, _ in references if file.startswith(RUNNING)]
        if any(word in backing for word in PLAYED) and not running:
            found.append(f"{label}...: says a stand-in node showed it but names no integration or e2e test")
        if SCRIPT_TEXT_ONLY in backing and not any(file.startswith("tests/unit/") for file, _ in references):
            found.append(f"{label}...: says {SCRIPT_TEXT_ONLY!r} but names no unit test")
        for file, name in references:
            path = root / file
            if not path.is_file():
                found.append(f"{label}...: {file} does not exist")
                continue
            if not name:
                continue
            if path.suffix != ".py":
                found.append(f"{label}...: {file}::{name} is not a Python file")
                continue
            if path not in names:
                names[path] = defined_functions(path)
            if name not in names[path]:
                found.append(f"{label}...: {file} has no test {name}")
    return found


def test_every_row_names_existing_tests_or_says_why_none() -> None:
    rows = table_rows(DOC.read_text(encoding="utf-8"))
    assert len(rows) >= 40, f"only {len(rows)} rows found: is the section still there?"
    assert problems(rows) == []


def test_the_table_keeps_every_behaviour_the_issue_listed() -> None:
    rows = "\n".join(table_rows(DOC.read_text(encoding="utf-8")))
    assert [topic for topic in REQUIRED_TOPICS if topic not in rows] == []


def test_the_checker_notices_a_missing_test_a_missing_file_and_an_unbacked_row() -> None:
    rows = [
        "| a | `tests/unit/test_windows_table.py::table_rows` and `tests/unit/test_windows_table.py` | x |",
        "| b | `tests/unit/test_windows_table.py::test_that_was_renamed[native]` | x |",
        "| c | `tests/unit/no_such_file.py::test_x` | x |",
        "| d | believed, not shown | x |",
        "| e | real Windows only | everything |",
        "| f | `tests/unit/test_windows_table.py::problems[param-1]` | x | extra |",
        "| g | `tests/unit/test_windows_table.py::table_rows` (the played node follows the script) | x |",
        "| h | script text only | x |",
        "| i | `tests/integration/test_launch_windows.py::test_stop_takes_the_runs_processes_by_identity_never_a_reused_pid`"  # noqa: E501
        " (played node) | x |",
    ]
    found = problems(rows)
    assert len(found) == 7, found
    assert "has no test test_that_was_renamed" in found[0]
    assert "no_such_file.py does not exist" in found[1]
    assert "names no test" in found[2]
    assert "4 columns" in found[3]
    assert "g | `tests/unit" in found[4] and "names no integration or e2e test" in found[4]
    assert "h | script" in found[5] and "names no test" in found[5]
    assert "h | script" in found[6] and "'script text only' but names no unit test" in found[6]


def test_parametrized_names_are_checked_without_their_brackets() -> None:
    match = REFERENCE.search(
        "`tests/unit/test_facts_windows.py::test_fact_parses_recorded_output[os_win11_23h2]`"
    )
    assert match is not None and match.groups() == (
        "tests/unit/test_facts_windows.py",
        "test_fact_parses_recorded_output",
    )
