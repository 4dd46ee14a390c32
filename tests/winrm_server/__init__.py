"""A WS-Management / WinRS server for the tests (Windows cannot run here): speaks the real protocol over
HTTP(S) to the unmodified pywinrm client, with Basic, NTLM (and WinRM message encryption) or client
certificate authentication, real fault envelopes, cmd commands run via /bin/sh, PowerShell decoded,
parsed (tests/pwsh.py), recorded and answered by a handler, and wsl.exe commands run for real as Linux
processes (stopping one ends wsl.exe only, as on Windows: the Linux processes run on).

By default it is a default Windows host: over plain HTTP only NTLM-sealed messages pass
(``AllowUnencrypted=false``; ``allow_unencrypted=True`` opts out), requests over 500 KiB get HTTP 413
(``MaxEnvelopeSizekb``; ``max_envelope_kb=``), 30 shells per user.

In-process (a thread)::

    with WinRMServer(auth="ntlm", username="bob", password="pw", on_powershell=handler) as server:
        ...  # server.endpoint, server.calls, server.commands, server.files, server.parse_errors

Inside a namespace host of tests/cluster.py (a subprocess)::

    handle = start_in_host(cluster, host, auth="ntlm", username="bob", password="pw", tls=True)
    handle.endpoint, handle.ca_file, handle.calls(), handle.stop()

See docs/testing.md, section "WS-Management test server".
"""

from tests.winrm_server.server import Answer, FakeFiles, PwshCall, WinRMServer
from tests.winrm_server.wsl import Distro, WslConfig

__all__ = ["Answer", "Distro", "FakeFiles", "PwshCall", "WinRMServer", "WslConfig", "start_in_host"]


def start_in_host(*args, **kwargs):  # type: ignore[no-untyped-def]
    """See :func:`tests.winrm_server.host.start_in_host` (imported lazily: it needs tests.cluster)."""
    from tests.winrm_server.host import start_in_host as start

    return start(*args, **kwargs)
