"""Fact parsers against real command outputs (data files: fact, args, output, exit code, expected)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.facts import base, gather, linux, network, public_value, split_sections
from orchestrator.inventory import Node
from orchestrator.platforms import PosixShell
from orchestrator.steps.preflight import preflight_facts
from orchestrator.transports import LocalTransport

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
    stream = base.SectionStream("cb-1", ["clock", "cpus"])
    assert stream.feed("Welcome to the lab", 1.0) is None  # a login banner: no section
    assert stream.feed("@@cb-1 begin clock@@", 2.0) is None
    assert stream.feed("1796300000.5", 3.0) is None
    assert stream.feed("", 3.0) is None
    assert stream.feed("@@cb-1 end clock 0@@", 3.0) is None
    assert not stream.complete
    for line in ("@@cb-1 begin cpus@@", "8", "", "@@cb-1 end cpus 0@@"):
        assert stream.feed(line, 4.0) is None
    assert stream.complete
    assert stream.sections == {"clock": ("1796300000.5", 0), "cpus": ("8", 0)}
    assert stream.first_line_at == {"clock": 3.0, "cpus": 4.0}  # when each section's output came
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


def test_sections_survive_output_that_looks_like_markers() -> None:
    token = "cb-abc"
    stdout = (
        "@@cb-abc begin one@@\nline @@cb-xyz end one 0@@\n\n@@cb-abc end one 0@@\n"
        "@@cb-abc begin two@@\n\n@@cb-abc end two 127@@\n"
    )
    assert split_sections(stdout, token) == {"one": ("line @@cb-xyz end one 0@@", 0), "two": ("", 127)}


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
