"""w32time on Windows nodes: PowerShell scripts that point the Windows Time service at the cluster's
source, report, and undo it. Generated here; ``apply`` runs them over WinRM on the Windows host (a WSL2
distribution follows the host's clock) as ``become`` scripts: a session that is not elevated stops
before anything changes, with the product's error and fix (``platforms.windows_admin``).

- configure: keeps the previous ``NtpServer``/``Type`` registry values in
  ``%ProgramData%\\cluster-bootstrap\\w32time-before.json`` (first run only: a second run must not
  overwrite the true original), then ``w32tm /config /manualpeerlist:"<peers>" /syncfromflags:manual
  /reliable:no /update``, restarts w32time and forces a resync. Peers get flag ``0x8`` (client mode
  requests, what ``ntpd``/chrony servers answer). Prints ``unchanged`` and touches nothing when the
  service already follows exactly these peers.
- status: ``w32tm /query /status`` (source, stratum, last sync) and an offset measured against the
  first peer with ``w32tm /stripchart /dataonly`` (what chrony's figure is on Linux).
- restore: puts the saved values back and restarts the service.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.platforms.powershell import PowerShell
from orchestrator.steps.timesync.chrony.config import time_source

# PowerShell expressions (not strings): %ProgramData%\cluster-bootstrap\w32time-before.json
STATE_DIR = "(Join-Path -Path $env:ProgramData -ChildPath 'cluster-bootstrap')"
STATE_FILE = f"(Join-Path -Path {STATE_DIR} -ChildPath 'w32time-before.json')"
_PARAMETERS = "HKLM:\\SYSTEM\\CurrentControlSet\\Services\\W32Time\\Parameters"


def peer_list(peers: Sequence[str]) -> str:
    """``a,0x8 b,0x8``: w32time's NtpServer syntax (space-separated, each with its flags). Every peer
    must be an IP address or a DNS name (ValueError else): a space or comma would add peers."""
    return " ".join(f"{time_source(p)},0x8" for p in peers)


def _w32tm(shell: PowerShell, *args: str) -> str:
    """``w32tm ARGS`` with exactly these arguments (the platform builds the command line), failing the
    script when w32tm exits non-zero."""
    return (
        shell.native(["w32tm", *args])
        + "\nif ($LASTEXITCODE -ne 0) { throw ('w32tm "
        + args[0]
        + " failed with exit code ' + $LASTEXITCODE) }"
    )


def configure_script(peers: Sequence[str], shell: PowerShell | None = None) -> str:
    """Point w32time at ``peers`` (idempotent; prints ``unchanged`` or ``configured``)."""
    shell = shell or PowerShell()
    if not peers:
        raise ValueError("w32time needs at least one peer")
    wanted = peer_list(peers)
    q = shell.quote
    return "\n".join(
        [
            f"$cbWanted = {q(wanted)}",
            f"$cbParams = Get-ItemProperty -Path {q(_PARAMETERS)}",
            "$cbService = Get-Service -Name w32time",
            "if ($cbParams.NtpServer -eq $cbWanted -and $cbParams.Type -eq 'NTP' "
            "-and $cbService.Status -eq 'Running') {",
            "  Write-Output 'unchanged'",
            "  return",
            "}",
            f"$cbDir = {STATE_DIR}",
            f"$cbState = {STATE_FILE}",
            "if (-not (Test-Path -LiteralPath $cbState)) {",
            "  New-Item -ItemType Directory -Force -Path $cbDir | Out-Null",
            "  $cbBefore = [ordered]@{ NtpServer = $cbParams.NtpServer; Type = $cbParams.Type;"
            " StartType = [string]$cbService.StartType; Status = [string]$cbService.Status }",
            "  ConvertTo-Json -InputObject $cbBefore | Set-Content -LiteralPath $cbState -Encoding UTF8",
            "}",
            "Set-Service -Name w32time -StartupType Automatic",
            "if ($cbService.Status -ne 'Running') { Start-Service -Name w32time }",
            _w32tm(
                shell,
                "/config",
                f"/manualpeerlist:{wanted}",
                "/syncfromflags:manual",
                "/reliable:no",
                "/update",
            ),
            "Restart-Service -Name w32time -Force",
            # the first resync right after a restart may find no sample yet: w32tm says so, not fatal
            shell.native(["w32tm", "/resync", "/force"]),
            "Write-Output 'configured'",
        ]
    )


def status_script(first_peer: str, shell: PowerShell | None = None) -> str:
    """Source and last sync (``/query /status``), and the offset from ``first_peer`` in seconds."""
    shell = shell or PowerShell()
    peer = time_source(first_peer)
    return "\n".join(
        [
            _w32tm(shell, "/query", "/status"),
            shell.native(["w32tm", "/stripchart", f"/computer:{peer}", "/samples:3", "/dataonly"]),
        ]
    )


def restore_script(shell: PowerShell | None = None) -> str:
    """Put back the peers, type and service state saved by the first configure; ``nothing`` when none."""
    shell = shell or PowerShell()
    return "\n".join(
        [
            f"$cbState = {STATE_FILE}",
            "if (-not (Test-Path -LiteralPath $cbState)) { Write-Output 'nothing'; return }",
            "$cbBefore = Get-Content -LiteralPath $cbState -Raw | ConvertFrom-Json",
            f"Set-ItemProperty -Path {shell.quote(_PARAMETERS)} -Name NtpServer -Value $cbBefore.NtpServer",
            f"Set-ItemProperty -Path {shell.quote(_PARAMETERS)} -Name Type -Value $cbBefore.Type",
            _w32tm(shell, "/config", "/update"),
            "Set-Service -Name w32time -StartupType $cbBefore.StartType",
            "if ($cbBefore.Status -eq 'Running') { Restart-Service -Name w32time -Force }"
            " else { Stop-Service -Name w32time -Force }",
            "Remove-Item -LiteralPath $cbState -Force",
            "Write-Output 'restored'",
        ]
    )


def parse_stripchart(output: str) -> float | None:
    """The median offset (seconds) of ``w32tm /stripchart /dataonly`` lines ``10:15:01, +00.0012345s``."""
    values = []
    for line in output.splitlines():
        _, sep, rest = line.partition(", ")
        if sep and rest.strip().endswith("s"):
            try:
                values.append(float(rest.strip()[:-1]))
            except ValueError:
                continue
    if not values:
        return None
    values.sort()
    return values[len(values) // 2]
