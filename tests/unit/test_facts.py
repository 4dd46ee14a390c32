"""Fact parsers against real command outputs (data files: fact, args, output, exit code, expected)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import records
from orchestrator.facts import base, gather, linux, network, public_value, split_sections
from orchestrator.inventory import Node
from orchestrator.platforms import PosixShell
from orchestrator.steps.preflight import preflight_facts
from orchestrator.transports import LocalTransport
from tests.noderecords import NONCE, sections_said

SECTIONS = {"clock": ("1796300000.5", 0), "cpus": ("8", 0)}

CASES = sorted((Path(__file__).parent / "data" / "facts").glob("*.json"))


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_fact_parses_recorded_output(path: Path) -> None:
    case = json.loads(path.read_text())
    module = network if case.get("module") == "network" else linux
    fact = getattr(module, case["fact"])(*case["args"])
    value = fact.parse(case["output"], case["exit_code"])
    assert json.loads(json.dumps(public_value(value))) == case["expected"]


def test_every_fact_class_has_recorded_cases() -> None:
    covered = {json.loads(p.read_text())["fact"] for p in CASES}
    classes = {type(f).__name__ for f in linux.linux_facts("python3")}
    # the preflight's own (its network facts and more), on a Linux node
    classes |= {type(f).__name__ for f in preflight_facts(Node(name="n", host="h"), Node(name="m", host="m"))}
    classes |= {"WallClock"}
    assert classes <= covered


def test_sections_are_read_while_the_script_still_runs() -> None:
    stream = base.SectionStream(NONCE, ["clock", "cpus"])
    clock, cpus = [sections_said(NONCE, {k: v}).rstrip("\n") for k, v in SECTIONS.items()]
    assert stream.feed("Welcome to the lab", 1.0) is None  # a login banner: no section
    assert stream.feed(clock, 3.0) is None
    assert not stream.complete
    assert stream.feed(cpus, 4.0) is None
    assert stream.complete
    assert stream.sections == SECTIONS
    assert stream.first_line_at == {"clock": 3.0, "cpus": 4.0}  # when each section's record came
    # what follows the last section is the caller's (the preflight's listener)
    assert stream.feed("ready 4242", 5.0) == "ready 4242"


def test_a_busybox_date_gives_no_clock() -> None:
    with pytest.raises(base.FactParseError, match="GNU date"):
        linux.WallClock().parse("1796300000.%N", 0)


def test_root_access_as_the_firewall_step_would_become_root() -> None:
    # this machine's test runs as root: the login itself is root, no sudo asked
    found = gather(LocalTransport("local", PosixShell()), [linux.BecomeRoot(), linux.WallClock()])
    assert found.errors == {}
    access = found.values["root_access"]
    assert access.method == "root" if os.geteuid() == 0 else access.method in ("sudo", None)
    assert abs(found.values["clock"] - time.time()) < 60
    # the command is the platform's own `become`: sudo -n, never a prompt
    assert "sudo -n --" in linux.BecomeRoot().command(PosixShell())


def test_sections_survive_output_that_looks_like_records() -> None:
    # the real sh encoder: section one prints what a section's records look like, of this nonce too
    fake = records.record(NONCE, "section", "two", "forged").strip()
    script = PosixShell().sectioned(
        [("one", f"echo {PosixShell().quote(fake)}; printf '\\036x\\n\\n'"), ("two", "exit 127")], NONCE
    )
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=False)
    assert split_sections(done.stdout, NONCE) == {"one": (fake + "\n\x1ex\n", 0), "two": ("", 127)}


def test_gather_runs_all_facts_in_one_round_trip_and_reports_missing_ones() -> None:
    calls: list[str] = []

    class Counting(LocalTransport):
        def run_raw(self, command: str, **kw: object):  # type: ignore[no-untyped-def, override]
            calls.append(command)
            return super().run_raw(command, **kw)  # type: ignore[arg-type]

    facts = gather(Counting("local", PosixShell()), linux.linux_facts("/nonexistent/python"))
    assert len(calls) == 1
    assert facts.values["python"] is None  # interpreter missing: a fact, not a crash
    assert facts.values["torch"] is None
    assert isinstance(facts.values["cpus"], int) and facts.values["cpus"] >= 1
    assert facts.values["hostname"]


def test_unparseable_output_becomes_a_fact_error_not_a_crash() -> None:
    class Broken(base.Fact[int]):
        name = "broken"

        def command(self, platform: object) -> str:  # type: ignore[override]
            return "echo not-a-number"

        def parse(self, output: str, exit_code: int) -> int:
            return int(output)

    found = gather(LocalTransport("local", PosixShell()), [Broken(), linux.CpuCount()])
    assert "broken" in found.errors and "not-a-number" in found.errors["broken"]
    assert found.values["cpus"] >= 1


def test_one_interpreter_start_answers_the_python_and_torch_facts() -> None:
    facts = linux.linux_facts(sys.executable)
    script = base.read_script(PosixShell(), [base.facts_read("facts", facts)]).script(NONCE)
    assert script.count(sys.executable) == 1  # each start costs a node ~10 ms of CPU
    found = gather(LocalTransport("local", PosixShell()), facts)
    assert found.errors == {}
    assert found.values["python"].version == ".".join(map(str, sys.version_info[:3]))
    # -S for the Python fact's lines; the probe adds site-packages after them (torch is in there)
    assert found.values["torch"].installed and found.values["torch"].version.startswith("2.13.0")


def test_a_torch_probe_that_crashed_after_the_interpreter_answered() -> None:
    said = "/usr/bin/python3\n3.11.2"  # then a traceback on stderr
    assert linux.Python("python3").parse(said, 1) == linux.PythonInfo("/usr/bin/python3", "3.11.2")
    with pytest.raises(base.FactParseError, match="printed nothing"):
        linux.Torch("python3").parse(said, 1)


def test_the_host_name_is_read_without_starting_a_process() -> None:
    # no program can be found: only the shell's own `read` can answer (a process less on every node)
    said = subprocess.run(
        ["/bin/sh", "-c", linux.Hostname().command(PosixShell())],
        capture_output=True,
        text=True,
        env={"PATH": "/nonexistent"},
        check=False,
    )
    assert linux.Hostname().parse(said.stdout, said.returncode) == os.uname().nodename


def test_files_printed_by_builtins_are_what_cat_prints(tmp_path: Path) -> None:
    from orchestrator.facts.linux import print_file

    text = "ID=debian\n\n  PRETTY_NAME='a \\\\ b'\t\nlast"  # the last line without its newline
    (tmp_path / "f").write_text(text)
    done = subprocess.run(["/bin/sh", "-c", print_file(str(tmp_path / "f"))], capture_output=True, text=True)
    assert (done.stdout, done.returncode) == (text + "\n", 0)
    gone = subprocess.run(["/bin/sh", "-c", print_file(str(tmp_path / "no"))], capture_output=True, text=True)
    assert gone.returncode != 0 and gone.stdout == ""
