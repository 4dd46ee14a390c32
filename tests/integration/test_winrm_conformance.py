"""Conformance of the WS-Management test server with real Windows: the WinRS request/response transcripts
recorded against real Windows hosts and shipped in the pypsrp 0.9.1 sdist (MIT; downloaded from PyPI at
test time, never committed) are replayed against tests/winrm_server and every response's STRUCTURE is
compared with the recorded one (docs/testing.md, "WS-Management test server", lists what is compared).
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import tarfile
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from ruamel.yaml import YAML

from tests.winrm_server import Answer, PwshCall, WinRMServer
from tests.winrm_server.soap import NS

#: a self-test of the test harness (select with -m harness, leave out with -m 'not harness')
pytestmark = pytest.mark.harness

SDIST = "pypsrp==0.9.1"
# every WinRS transcript of the sdist (pypsrp's own WinRS tests and its Client.execute_cmd tests)
TRANSCRIPT_GLOBS = ("test_winrs_*.yml", "test_client_execute_cmd*.yml")
EXPECTED = {
    "test_winrs_bad_cmd_id",
    "test_winrs_environment",
    "test_winrs_extra_opts",
    "test_winrs_fail_poll_process",
    "test_winrs_no_cmd_shell",
    "test_winrs_noprofile",
    "test_winrs_open_already_opened",
    "test_winrs_operation_timeout",
    "test_winrs_send",
    "test_winrs_standard",
    "test_winrs_stderr_rc",
    "test_winrs_unicode",
    "test_client_execute_cmd",
    "test_client_execute_cmd_environment",
}
STATE_DONE = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell/CommandState/Done"


def _transcript_dir(tmp: Path) -> Path:
    """Download the sdist and extract its WinRS transcripts; skip (fail with CI=true) when impossible."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-binary",
            ":all:",
            "--no-deps",
            SDIST,
            "-d",
            str(tmp),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    tarballs = list(tmp.glob("pypsrp-0.9.1.tar.gz"))
    if res.returncode != 0 or not tarballs:
        reason = f"cannot download the {SDIST} sdist from PyPI: {res.stderr.strip()[-500:]}"
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    out = tmp / "responses"
    out.mkdir()
    with tarfile.open(tarballs[0]) as tar:
        for member in tar.getmembers():
            path = Path(member.name)
            if (
                path.parent.name == "responses"
                and any(path.match(g) for g in TRANSCRIPT_GLOBS)
                and member.isfile()
            ):
                data = tar.extractfile(member)
                assert data is not None
                (out / path.name).write_bytes(data.read())
    return out


@pytest.fixture(scope="module")
def transcripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, str]]]:
    directory = _transcript_dir(tmp_path_factory.mktemp("pypsrp"))
    yaml = YAML(typ="safe")
    found = {
        p.stem: yaml.load(p.read_text(encoding="utf-8"))["messages"] for p in sorted(directory.glob("*.yml"))
    }
    assert set(found) == EXPECTED, f"the sdist's WinRS transcripts changed: {sorted(found)}"
    return found


# -- what a response looks like, as far as clients depend on it -------------------------------------------


def _q(prefix: str, local: str) -> str:
    return f"{{{NS[prefix]}}}{local}"


def shape(xml: str, ids: dict[str, str]) -> dict[str, Any]:
    """The client-relevant structure of a response. ``ids`` maps server-issued ids to symbolic names."""
    root = ET.fromstring(xml)
    header = root.find("s:Header", NS)
    body = root.find("s:Body", NS)
    assert header is not None and body is not None
    action = header.find("a:Action", NS)
    out: dict[str, Any] = {
        "root": root.tag,
        "action": (action.text or "").strip() if action is not None else None,
        "relates_to": header.find("a:RelatesTo", NS) is not None,
        "body": [child.tag for child in body],
    }
    fault = body.find("s:Fault", NS)
    if fault is not None:
        wsman = fault.find("s:Detail/f:WSManFault", NS)
        detail = fault.find("s:Detail/w:FaultDetail", NS)
        out["fault"] = {
            "code": fault.findtext("s:Code/s:Value", namespaces=NS),
            "subcode": fault.findtext("s:Code/s:Subcode/s:Value", namespaces=NS),
            "reason": fault.findtext("s:Reason/s:Text", namespaces=NS),
            "wsman_code": wsman.get("Code") if wsman is not None else None,
            "detail": detail.text if detail is not None else None,
            "provider_fault": fault.find(".//f:ProviderFault", NS) is not None,
        }
    created = body.find("x:ResourceCreated", NS)
    if created is not None:
        selector = created.find("a:ReferenceParameters/w:SelectorSet/w:Selector[@Name='ShellId']", NS)
        shell = body.find("rsp:Shell", NS)
        assert selector is not None and shell is not None
        out["create"] = {
            "address": created.find("a:Address", NS) is not None,
            "resource_uri": created.findtext("a:ReferenceParameters/w:ResourceURI", namespaces=NS),
            "shell_id": ids.get((selector.text or "").strip(), "?"),
            "rsp_shell_id_matches": shell.findtext("rsp:ShellId", namespaces=NS) == selector.text,
            "shell_children": [c.tag for c in shell],
        }
    command = body.find("rsp:CommandResponse/rsp:CommandId", NS)
    if command is not None:
        out["command_id"] = ids.get((command.text or "").strip(), "?")
    receive = body.find("rsp:ReceiveResponse", NS)
    if receive is not None:
        streams = receive.findall("rsp:Stream", NS)
        state = receive.find("rsp:CommandState", NS)
        out["receive"] = {
            "with_data": sorted({s.get("Name") for s in streams if s.text}),
            "ended": sorted(s.get("Name") for s in streams if s.get("End") == "true"),
            "stream_command_ids": sorted({ids.get(s.get("CommandId") or "", "?") for s in streams}),
            "state": state.get("State") if state is not None else None,
            "state_command_id": ids.get(state.get("CommandId") or "", "?") if state is not None else None,
            "exit_code": state.findtext("rsp:ExitCode", namespaces=NS) if state is not None else None,
        }
    return out


def _merge_receive(first: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """Two Receive responses read as one (a client polling again until Done)."""
    merged = dict(later)
    merged["receive"] = dict(later["receive"])
    merged["receive"]["with_data"] = sorted(
        set(first["receive"]["with_data"]) | set(later["receive"]["with_data"])
    )
    return merged


# -- replay -------------------------------------------------------------------------------------------------


@dataclass
class Gate:
    """Start-Sleep in an emulated script waits here; the replayer opens it when the recording says the
    command finished."""

    event: threading.Event

    def wait(self) -> None:
        assert self.event.wait(60), "the replay never released Start-Sleep"


def _emulate(gate: Gate, encoding: str) -> Any:
    """Enough of PowerShell for the transcripts' scripts: Write-Host (which writes LF, as recorded),
    Start-Sleep (blocks until the replay opens the gate), pwd (the shell's WorkingDirectory, CRLF as
    Out-Default writes), anything else: no output."""

    def handler(call: PwshCall) -> Answer:
        def pieces() -> Iterator[bytes]:
            for cmd in call.commands:
                name = cmd.name.lower()
                if name == "write-host":
                    words = [a.strip("'\"") for a in cmd.arguments]
                    yield (" ".join(words) + "\n").encode(
                        "utf-8" if encoding == "65001" else "cp437", "replace"
                    )
                elif name == "start-sleep":
                    gate.wait()
                elif name in ("pwd", "get-location"):
                    yield ((call.cwd or "C:\\Users\\bob") + "\r\n").encode("cp437")

        return Answer(chunks=pieces())

    return handler


def _with_live_ids(text: str, live: dict[str, str]) -> str:
    for recorded, current in live.items():
        text = text.replace(recorded, current)
    return text


def replay(name: str, messages: list[dict[str, str]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Send each recorded request to a fresh server; return (recorded shape, live shape) pairs."""
    gate = Gate(threading.Event())
    codepage = "65001" if any('WINRS_CODEPAGE">65001' in m["request"] for m in messages) else "437"
    pairs = []
    # the recorded requests are replayed as clear-text SOAP with Basic: the server must accept that
    # over HTTP, as a host with AllowUnencrypted=true does (its default refuses it)
    with WinRMServer(allow_unencrypted=True, on_powershell=_emulate(gate, codepage), strict=True) as server:
        http = requests.Session()
        http.auth = ("bob", "pw")
        live: dict[str, str] = {}  # recorded id -> id our server issued
        symbolic_rec: dict[str, str] = {}
        symbolic_live: dict[str, str] = {}
        for index, message in enumerate(messages):
            recorded_xml = message["response"]
            if re.search(r'CommandState/Done"', recorded_xml):
                gate.event.set()  # the recording says the command ended by now
            request = _with_live_ids(message["request"], live)
            # the operation-timeout transcript waited PT10S per Receive; a second is as good here
            request = request.replace("<wsman:OperationTimeout>PT10S<", "<wsman:OperationTimeout>PT1S<")
            answer = http.post(
                server.endpoint,
                data=request.encode("utf-8"),
                headers={"Content-Type": "application/soap+xml;charset=UTF-8"},
                timeout=60,
            )
            live_xml = answer.text
            # learn the ids the recorded and the live server issued, under one symbolic name each
            for pattern in (r'<w:Selector Name="ShellId">([^<]+)<', r"<rsp:CommandId>([^<]+)<"):
                rec_ids = re.findall(pattern, recorded_xml)
                live_ids = re.findall(pattern, live_xml)
                for rec_id, live_id in zip(rec_ids, live_ids, strict=False):
                    live[rec_id] = live_id
                    label = f"id{len(symbolic_rec)}"
                    symbolic_rec.setdefault(rec_id, label)
                    symbolic_live.setdefault(live_id, symbolic_rec[rec_id])
            expected = shape(recorded_xml, symbolic_rec)
            got = shape(live_xml, symbolic_live)
            # a command may still be Running when the recording (a slower machine) had it Done: poll on
            while (
                expected.get("receive", {}).get("state") == STATE_DONE
                and got.get("receive", {}).get("state") != STATE_DONE
            ):
                again = re.sub(
                    r"uuid:[0-9A-Fa-f-]{36}</wsa:MessageID>",
                    f"uuid:{index:08d}-0000-4000-8000-000000000000</wsa:MessageID>",
                    request,
                )
                more = http.post(server.endpoint, data=again.encode("utf-8"), timeout=60).text
                got = _merge_receive(got, shape(more, symbolic_live))
            status_ok = answer.status_code == (500 if "fault" in expected else 200)
            assert status_ok, f"{name} #{index}: HTTP {answer.status_code}\n{live_xml}"
            pairs.append((expected, got))
    return pairs


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_replayed_transcript_matches_real_windows(
    name: str, transcripts: dict[str, list[dict[str, str]]]
) -> None:
    for index, (expected, got) in enumerate(replay(name, transcripts[name])):
        assert got == expected, f"{name} message #{index}"


def test_shape_sees_what_clients_depend_on() -> None:
    """The comparison is not vacuous: a Done state, an exit code or a stream End differing is noticed."""
    base = (
        '<s:Envelope xmlns:s="{s}" xmlns:a="{a}" xmlns:rsp="{rsp}"><s:Header><a:Action>x</a:Action>'
        "<a:RelatesTo>uuid:1</a:RelatesTo></s:Header><s:Body><rsp:ReceiveResponse>"
        '<rsp:Stream Name="stdout" CommandId="C">{data}</rsp:Stream>'
        '<rsp:Stream Name="stdout" CommandId="C"{end}></rsp:Stream>'
        '<rsp:CommandState CommandId="C" State="{state}">{code}</rsp:CommandState>'
        "</rsp:ReceiveResponse></s:Body></s:Envelope>"
    )

    def make(
        data: str = "aGk=",
        end: str = ' End="true"',
        state: str = STATE_DONE,
        code: str = "<rsp:ExitCode>0</rsp:ExitCode>",
    ) -> dict[str, Any]:
        xml = base.format(s=NS["s"], a=NS["a"], rsp=NS["rsp"], data=data, end=end, state=state, code=code)
        return shape(xml, {"C": "id1"})

    reference = make()
    assert reference["receive"]["exit_code"] == "0" and reference["receive"]["ended"] == ["stdout"]
    assert make(code="<rsp:ExitCode>1</rsp:ExitCode>") != reference
    assert make(end="") != reference
    assert make(state=STATE_DONE.replace("Done", "Running"), code="") != reference
    assert make(data="") != reference
    assert base64.b64decode("aGk=") == b"hi"
