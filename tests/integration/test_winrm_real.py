"""WinRMTransport against a REAL Windows host: opt-in, never run by default (nor in CI).

Set these to run them (see docs/windows.md, "What the tests prove")::

    WINRM_ENDPOINT=winbox            # host, host:port or https://host:5986/wsman
    WINRM_USER='.\\admin'            # an administrator of that machine
    WINRM_PASSWORD=...
    WINRM_TRANSPORT=ntlm             # optional: ntlm (default), basic, kerberos, credssp
    WINRM_CA_BUNDLE=/path/ca.pem     # optional: CA of the listener's certificate
    WINRM_CERT_VALIDATION=false      # optional: skip TLS verification (a lab machine); needs
    WINRM_ALLOW_INSECURE=1           # ...this too (as allow_insecure: true in an inventory), also
                                     # for WINRM_TRANSPORT=basic over http

Without WINRM_ENDPOINT, WINRM_USER and WINRM_PASSWORD every test here is skipped, also when CI=true:
no Windows machine exists on the development or CI machines. What these prove that the test server
cannot: real powershell.exe parsing and running our scripts, real CLIXML, real job-object clean-up,
real TLS/NTLM from Windows' HTTP.sys.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from orchestrator.inventory import WinRMSettings
from orchestrator.platforms.powershell import PowerShell
from orchestrator.transports.winrm import WinRMTransport

_NEEDED = ("WINRM_ENDPOINT", "WINRM_USER", "WINRM_PASSWORD")
pytestmark = pytest.mark.skipif(
    not all(os.environ.get(name) for name in _NEEDED),
    reason="no real Windows host: set WINRM_ENDPOINT, WINRM_USER and WINRM_PASSWORD to run these",
)


def _settings() -> dict[str, Any]:
    endpoint = os.environ["WINRM_ENDPOINT"]
    if "://" not in endpoint:
        endpoint = "https://" + endpoint
    url = urlsplit(endpoint)
    scheme = url.scheme if url.scheme in ("http", "https") else "https"
    return {
        "host": url.hostname or "",
        "port": url.port,
        "winrm": WinRMSettings(
            scheme=scheme,  # type: ignore[arg-type]
            transport=os.environ.get("WINRM_TRANSPORT", "ntlm"),  # type: ignore[arg-type]
            cert_validation=os.environ.get("WINRM_CERT_VALIDATION", "true").lower() != "false",
            ca_bundle=os.environ.get("WINRM_CA_BUNDLE") or None,
        ),
    }


@pytest.fixture
def windows() -> Iterator[WinRMTransport]:
    s = _settings()
    transport = WinRMTransport(
        "real-windows",
        PowerShell(),
        host=s["host"],
        port=s["port"],
        user=os.environ["WINRM_USER"],
        settings=s["winrm"],
        password=lambda: os.environ["WINRM_PASSWORD"],
        allow_insecure=os.environ.get("WINRM_ALLOW_INSECURE") == "1",
    )
    try:
        yield transport
    finally:
        transport.close()


def _processes_with(transport: WinRMTransport, marker: str) -> str:
    script = (
        "Get-CimInstance -ClassName Win32_Process | Where-Object { $null -ne $_.CommandLine -and "
        f"$_.CommandLine.Contains({transport.platform.quote(marker)}) -and $_.ProcessId -ne $PID }} | "
        "ForEach-Object { $_.ProcessId }"
    )
    return transport.run(script).stdout.strip()


def test_lines_stream_and_exit_codes_propagate(windows: WinRMTransport) -> None:
    times: list[float] = []
    result = windows.run(
        "Write-Output 'one'; Start-Sleep -Seconds 3; Write-Output 'two'; exit 7",
        on_line=lambda stream, line: times.append(time.monotonic()),
    )
    assert result.exit_code == 7 and result.stdout.split() == ["one", "two"]
    assert len(times) == 2 and times[1] - times[0] > 2  # line one arrived while the command slept


def test_native_exit_code_and_unicode_output(windows: WinRMTransport) -> None:
    result = windows.run(windows.platform.join(["cmd.exe", "/c", "exit 42"]))
    assert result.exit_code == 42
    assert windows.run("Write-Output 'Grüße – 日本'").stdout.strip() == "Grüße – 日本"


def test_a_real_error_is_readable_text(windows: WinRMTransport) -> None:
    result = windows.run("Get-Item -LiteralPath 'C:\\cbt-does-not-exist'")
    assert result.exit_code == 1
    assert "cbt-does-not-exist" in result.stderr
    assert "CLIXML" not in result.stderr and "_x000D_" not in result.stderr


def test_timeout_and_cancel_stop_every_process_of_the_command(windows: WinRMTransport) -> None:
    marker = f"cbt-{uuid.uuid4().hex[:12]}"
    child = windows.platform.join(["powershell.exe", "-NoProfile", "-Command", f"Start-Sleep 600 # {marker}"])
    result = windows.run(f"Write-Output started; {child}", timeout=5)
    assert result.timed_out and result.stdout.strip() == "started"
    assert _processes_with(windows, marker) == ""

    marker = f"cbt-{uuid.uuid4().hex[:12]}"
    child = windows.platform.join(["powershell.exe", "-NoProfile", "-Command", f"Start-Sleep 600 # {marker}"])
    started = threading.Event()
    threading.Thread(target=lambda: (started.wait(30), windows.close()), daemon=True).start()
    result = windows.run(f"Write-Output started; {child}", on_line=lambda s, line: started.set())
    assert result.exit_code is None
    s = _settings()
    check = WinRMTransport(
        "real-windows",
        PowerShell(),
        host=s["host"],
        port=s["port"],
        user=os.environ["WINRM_USER"],
        settings=s["winrm"],
        password=lambda: os.environ["WINRM_PASSWORD"],
    )
    try:
        deadline = time.monotonic() + 30
        while _processes_with(check, marker) and time.monotonic() < deadline:
            time.sleep(1)
        assert _processes_with(check, marker) == ""
    finally:
        check.close()


def test_a_long_script_runs_from_a_file(windows: WinRMTransport) -> None:
    body = "\n".join(f"$x{n} = '{'y' * 80}'" for n in range(150)) + "\nWrite-Output ('total ' + $x149.Length)"
    assert len(windows.platform.login_command(windows.platform.wrap(body))) > 8191
    result = windows.run(body)
    assert result.ok and result.stdout.strip() == "total 80"


def test_files_round_trip_with_sha256(windows: WinRMTransport, tmp_path: Path) -> None:
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(1_500_000))
    remote = f"~\\cbt-test-{uuid.uuid4().hex[:8]}\\payload.bin"
    progress: list[int] = []
    try:
        windows.put(src, remote, progress=lambda done, total: progress.append(done))
        windows.get(remote, tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
        assert progress[-1] == src.stat().st_size
    finally:
        folder = remote.rsplit("\\", 1)[0]
        windows.run(f"Remove-Item -LiteralPath {windows.platform.path_word(folder)} -Recurse -Force")  # type: ignore[attr-defined]
