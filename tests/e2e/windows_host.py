"""A Windows machine in WSL mode for end-to-end tests: the WS-Management test server run inside a
namespace host (so what its wsl.exe runs, runs in that host's network and UTS namespaces), with the
Windows side played, since no PowerShell runs here:

- file transfers (the transport's put/get/remove scripts, used for scripts over cmd.exe's 8191
  characters, such as the Windows facts) are emulated on the server's in-memory files by
  ``tests.integration.test_winrm_transport.Emulator``, which reads their values off the parse tree;
- the Windows facts script is answered as a Windows 11 23H2 machine with WSL 2, the distribution
  running and mirrored networking would answer it (no Windows Python: native mode unavailable);
- any other PowerShell gets an empty answer with exit code 0, and is recorded (every script is
  parsed: a parse error fails the test through ``parse_errors()``).

Run as ``python -m tests.e2e.windows_host`` with the options of ``python -m tests.winrm_server``;
tests start it with :func:`start_windows_host`.
"""

from __future__ import annotations

from typing import Any

from tests.noderecords import sections_asked, sections_said
from tests.winrm_server import Answer, PwshCall
from tests.winrm_server.host import HostedServer, start_in_host

DISTRO = "Ubuntu-22.04"

#: what each Windows-side fact prints on such a machine: (output, exit code)
WINDOWS_SIDE: dict[str, tuple[str, int]] = {
    "windows": (
        "caption=Microsoft Windows 11 Pro\nversion=10.0.22631\nbuild=22631\narchitecture=64-bit\n"
        "osversion=10.0.22631.0\nubr=4460\ndisplay_version=23H2\nrelease_id=2009\n",
        0,
    ),
    "wsl": (
        "--- version exit=0\nWSL version: 2.3.26.0\nKernel version: 5.15.167.4-1\n"
        f"--- status exit=0\nDefault Distribution: {DISTRO}\nDefault Version: 2\n"
        f"--- list exit=0\n  NAME            STATE           VERSION\n* {DISTRO:<16}Running         2\n"
        "--- wslconfig exit=0\n[wsl2]\nnetworkingMode=mirrored\n",
        0,
    ),
    "windows_python": ("", 127),
}


def windows_side(call: PwshCall) -> Answer | None:
    """The answer to a sectioned facts script (see PowerShell.sectioned for the framing)."""
    sections = sections_asked(call.script)
    if not sections:
        return None
    out = [sections_said(token, {name: WINDOWS_SIDE.get(name, ("", 1))}) for token, name in sections]
    return Answer(stdout="".join(out))


def main() -> int:
    from tests.integration.test_winrm_transport import Emulator
    from tests.winrm_server import __main__ as server_main

    base = server_main.WinRMServer

    class PlayedWindows(base):  # type: ignore[misc, valid-type]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.on_powershell = Emulator(self.files, windows_side)

    server_main.WinRMServer = PlayedWindows  # type: ignore[misc]
    return server_main.main()


def start_windows_host(cluster: Any, host: Any, *, username: str, password: str) -> HostedServer:
    """Start this server on ``host`` with NTLM over HTTPS on 5986 (its CA in ``ca_file``); returns once
    it accepts connections (``tests.winrm_server.start_in_host`` with this module as entry point)."""
    return start_in_host(
        cluster, host, auth="ntlm", username=username, password=password, tls=True, module=__name__
    )


if __name__ == "__main__":
    raise SystemExit(main())
