"""Windows: Windows Defender Firewall rules for native ranks, Hyper-V firewall rules for WSL ranks.

One script per node converges on the node itself (Windows has no stable text form of its rules to diff
here): for each wanted rule it creates it, or updates its ports and remote addresses when they differ,
or counts it unchanged; then it removes every rule of ours that is no longer wanted, and prints a JSON
report ``{"added", "updated", "removed", "unchanged"}``.

- Native Python ranks listen in Windows: Defender rules (``New-NetFirewallRule``), all in the group
  named by the cluster's tag (``cluster-bootstrap:<name>:<digest>``, rules.ClusterTag;
  ``Get-NetFirewallRule -Group`` finds exactly ours), one rule per port range with the peers as its
  ``RemoteAddress`` list. The ephemeral range is Windows' own dynamic port
  range (``Get-NetTCPSetting``: 49152-65535 by default), read on the node.
- WSL ranks (mirrored networking) listen inside the WSL VM: inbound traffic to it is filtered by the
  Hyper-V firewall, not by Defender rules (Windows 11 22H2+). Hyper-V rules have no group: ours are the
  ones whose whole Name is ``<tag with - for :>-tcp-<ports>`` (matched exactly, never by prefix: the
  name of another cluster may start like ours); they are scoped to WSL's VM creator id.
- Rules of the legacy tag (the group ``cluster-bootstrap:<name>``, Hyper-V names
  ``cluster-bootstrap-<name>-tcp-<ports>``) are removed by every run: a rerun writes them anew.
  The ephemeral range is the Linux one inside WSL (``ip_local_port_range``).

Scripts are generated with the PowerShell platform's quoting. The firewall step (the package's ``Firewall``)
runs them over WinRM on the Windows host, native and WSL nodes alike, as ``become`` scripts: they need
an elevated session (WinRM sessions of administrators are), check it first, and a session that is
not elevated stops before any rule changes with the product's error and fix
(``platforms.windows_admin.not_elevated_error``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.platforms.powershell import PowerShell
from orchestrator.steps.firewall.rules import ClusterTag, PortRange, normalize_source

#: WSL's VM creator id (``Get-NetFirewallHyperVVMCreator``), fixed by Microsoft
WSL_VM_CREATOR_ID = "{40E0AC32-46A5-438A-A0B2-2B479E8F2E90}"
#: the Linux default inside WSL when the caller knows no better
WSL_DEFAULT_EPHEMERAL = PortRange(32768, 60999)


def rule_prefix(cluster_name: str) -> str:
    """Names of our rules are this plus ``tcp-<ports>`` (Hyper-V rules have no group to find them by)."""
    return ClusterTag(cluster_name).windows_prefix


def _rule_name(prefix: str, ports: PortRange | None) -> str:
    return f"{prefix}tcp-{ports}" if ports is not None else f"{prefix}tcp-ephemeral"


def rule_name_pattern(prefix: str) -> str:
    """A .NET regular expression matching exactly the names :func:`_rule_name` makes with ``prefix``."""
    return "^" + re.escape(prefix) + r"tcp-(ephemeral|[0-9]+(-[0-9]+)?)$"


_DEFENDER_FUNCTION = """\
function Set-CbRule {
  param([string]$Name, [string]$Port, [string[]]$Remote)
  $rule = Get-NetFirewallRule -Name $Name -ErrorAction SilentlyContinue
  if ($null -eq $rule) {
    New-NetFirewallRule -Name $Name -DisplayName $Name -Group $cbGroup -Direction Inbound -Action Allow `
      -Protocol TCP -LocalPort $Port -RemoteAddress $Remote -Profile Any | Out-Null
    $cbReport.added++
    return
  }
  $havePorts = @(($rule | Get-NetFirewallPortFilter).LocalPort) -join ','
  $haveRemote = @(($rule | Get-NetFirewallAddressFilter).RemoteAddress | Sort-Object) -join ','
  if ($havePorts -eq $Port -and $haveRemote -eq (@($Remote | Sort-Object) -join ',')) {
    $cbReport.unchanged++
  } else {
    Set-NetFirewallRule -Name $Name -LocalPort $Port -RemoteAddress $Remote -Action Allow
    $cbReport.updated++
  }
}"""

_HYPERV_FUNCTION = """\
function Set-CbRule {
  param([string]$Name, [string]$Port, [string[]]$Remote)
  $rule = Get-NetFirewallHyperVRule -Name $Name -ErrorAction SilentlyContinue
  if ($null -eq $rule) {
    New-NetFirewallHyperVRule -Name $Name -DisplayName $Name -Direction Inbound -VMCreatorId $cbCreator `
      -Protocol TCP -LocalPorts $Port -RemoteAddresses $Remote -Action Allow | Out-Null
    $cbReport.added++
    return
  }
  $havePorts = @($rule.LocalPorts) -join ','
  $haveRemote = @($rule.RemoteAddresses | Sort-Object) -join ','
  if ($havePorts -eq $Port -and $haveRemote -eq (@($Remote | Sort-Object) -join ',')) {
    $cbReport.unchanged++
  } else {
    Set-NetFirewallHyperVRule -Name $Name -LocalPorts $Port -RemoteAddresses $Remote
    $cbReport.updated++
  }
}"""

_NATIVE_EPHEMERAL = """\
$cbTcp = Get-NetTCPSetting -SettingName Internet
$cbFirst = [int]$cbTcp.DynamicPortRangeStartPort
$cbEphemeral = '{0}-{1}' -f $cbFirst, ($cbFirst + [int]$cbTcp.DynamicPortRangeNumberOfPorts - 1)"""


def firewall_script(
    platform: PowerShell,
    *,
    cluster_name: str,
    ports: Sequence[PortRange],
    ephemeral: PortRange | None,
    sources: Sequence[str],
    wsl: bool = False,
    remove: bool = False,
) -> str:
    """The PowerShell that converges one Windows node (``remove``: deletes every rule of ours).

    ``ports``: fixed ports (rendezvous on the master, extra ports); ``ephemeral``: the range ranks
    listen on, None to read Windows' dynamic range on the node (native ranks only). ``sources``: the
    peers' addresses (never empty when there is a rule to make: no rule is ever open to everyone).
    """
    q = platform.quote
    ids = ClusterTag(cluster_name)
    prefix = ids.windows_prefix
    for source in sources:  # the only values from outside that reach the script
        if normalize_source(source) != source:
            raise ValueError(f"not a canonical IPv4 address or network: {source!r}")
    lines = [
        f"$cbGroup = {q(ids.tag)}",
        f"$cbLegacyGroup = {q(ids.legacy)}",
        f"$cbPattern = {q(rule_name_pattern(prefix))}",
        f"$cbLegacyPattern = {q(rule_name_pattern(ids.legacy_windows_prefix))}",
        "$cbReport = @{ added = 0; updated = 0; removed = 0; unchanged = 0 }",
    ]
    wanted: list[str] = []
    if not remove and sources:
        if wsl:
            lines.append(f"$cbCreator = {q(WSL_VM_CREATOR_ID)}")
        lines.append(_HYPERV_FUNCTION if wsl else _DEFENDER_FUNCTION)
        remote = "@(" + ", ".join(q(s) for s in sorted(sources)) + ")"
        for port in sorted(set(ports)):
            name = _rule_name(prefix, port)
            wanted.append(name)
            lines.append(f"Set-CbRule -Name {q(name)} -Port {q(str(port))} -Remote {remote}")
        if ephemeral is None and not wsl:
            lines.append(_NATIVE_EPHEMERAL)
            name = _rule_name(prefix, None)
            wanted.append(name)
            lines.append(f"Set-CbRule -Name {q(name)} -Port $cbEphemeral -Remote {remote}")
        elif ephemeral is not None or wsl:
            span = ephemeral or WSL_DEFAULT_EPHEMERAL
            name = _rule_name(prefix, span)
            wanted.append(name)
            lines.append(f"Set-CbRule -Name {q(name)} -Port {q(str(span))} -Remote {remote}")
    lines.append("$cbWanted = @(" + ", ".join(q(n) for n in wanted) + ")")
    if wsl:
        lines.append(
            "Get-NetFirewallHyperVRule -ErrorAction SilentlyContinue |\n"
            "  Where-Object { ($_.Name -cmatch $cbPattern -and $cbWanted -notcontains $_.Name) -or "
            "$_.Name -cmatch $cbLegacyPattern } |\n"
            "  ForEach-Object { Remove-NetFirewallHyperVRule -Name $_.Name; $cbReport.removed++ }"
        )
    else:
        lines.append(
            "Get-NetFirewallRule -Group $cbGroup -ErrorAction SilentlyContinue |\n"
            "  Where-Object { $cbWanted -notcontains $_.Name } |\n"
            "  ForEach-Object { Remove-NetFirewallRule -Name $_.Name; $cbReport.removed++ }"
        )
        lines.append(
            "Get-NetFirewallRule -Group $cbLegacyGroup -ErrorAction SilentlyContinue |\n"
            "  ForEach-Object { Remove-NetFirewallRule -Name $_.Name; $cbReport.removed++ }"
        )
    lines.append("[Console]::Out.WriteLine(($cbReport | ConvertTo-Json -Compress))")
    return "\n".join(lines)


_REPORT_RE = re.compile(r"\{[^{}]*\"added\"[^{}]*\}")


def parse_report(stdout: str) -> dict[str, int]:
    """The script's last JSON report line -> counts (missing keys: 0)."""
    import json

    found = _REPORT_RE.findall(stdout)
    if not found:
        raise ValueError("no firewall report in the output")
    data = json.loads(found[-1])
    return {k: int(data.get(k, 0)) for k in ("added", "updated", "removed", "unchanged")}
