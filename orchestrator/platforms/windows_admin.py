"""What an administrator types on a Windows machine to let WinRM in: the fixes that error hints show.

Never run by the product (it cannot reach a machine whose WinRM refuses it); kept beside the
PowerShell dialect so that the transports hold no PowerShell or cmd text (issue 13). Each function
returns the command in backquotes, ready to be placed in a sentence. The errors built here: what a
step that needs an administrator raises when the session is not one (:func:`not_elevated_error`;
:func:`check_elevated_run`, the verdict on such a script), and a WinRS shell quota met.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import CommandFailedError
from orchestrator.platforms.powershell import NOT_ELEVATED_EXIT, NOT_ELEVATED_MESSAGE

if TYPE_CHECKING:
    from orchestrator.transports.base import Result

#: where each WinRM quota setting lives in ``winrm set``
QUOTA_SCOPES = {
    "MaxShellsPerUser": "winrm/config/winrs",
    "MaxConcurrentUsers": "winrm/config/winrs",
    "MaxConcurrentOperationsPerUser": "winrm/config/service",
    "MaxConcurrentOperations": "winrm/config/service",
    "MaxProcessesPerShell": "winrm/config/winrs",
    "MaxMemoryPerShellMB": "winrm/config/winrs",
}
#: what to raise a WinRS shell quota to when a command meets it (Windows' defaults: 25 and 1024)
SHELL_QUOTA_RAISED = {"MaxProcessesPerShell": 100, "MaxMemoryPerShellMB": 8192}


def listener_fix(scheme: str, port: int) -> str:
    """The commands that make a Windows host listen for WinRM (run as administrator)."""
    if scheme == "https":
        return (
            "on the Windows machine, in an administrator PowerShell: "
            "`$c = New-SelfSignedCertificate -DnsName $env:COMPUTERNAME -CertStoreLocation "
            "Cert:\\LocalMachine\\My; New-Item -Path WSMan:\\localhost\\Listener -Transport HTTPS "
            "-Address * -CertificateThumbPrint $c.Thumbprint -Force; New-NetFirewallRule -DisplayName "
            f"'WinRM HTTPS' -Direction Inbound -Protocol TCP -LocalPort {port} -Action Allow` "
            "(or `winrm quickconfig -transport:https` when a certificate for the host name is "
            "installed); see docs/windows.md"
        )
    return (
        "on the Windows machine, in an administrator PowerShell: `Enable-PSRemoting -Force` "
        "(HTTP listener on 5985); prefer HTTPS, see docs/windows.md"
    )


def firewall_rule(port: int) -> str:
    """Allow inbound TCP ``port`` in Windows Defender Firewall."""
    return (
        f"`New-NetFirewallRule -DisplayName 'WinRM' -Direction Inbound -Protocol TCP -LocalPort {port} "
        "-Action Allow`"
    )


def certificate_for(what: str) -> str:
    """Issue a self-signed certificate (for the listener) naming ``what``."""
    return f"`New-SelfSignedCertificate -DnsName {what}`"


def enable_auth(setting: str) -> str:
    """Turn on one authentication scheme of the WinRM service (``Basic``, ``Negotiate``, ``CredSSP``)."""
    return f"`winrm set winrm/config/service/auth '@{{{setting}=\"true\"}}'`"


def allow_unencrypted() -> str:
    """Let the WinRM service accept unencrypted messages (what Basic over HTTP needs)."""
    return "`winrm set winrm/config/service '@{AllowUnencrypted=\"true\"}'`"


def certificate_mapping() -> str:
    """Turn certificate authentication on (it is off by default) and map client certificates of one
    issuer to a local account: WinRM logs a client certificate in only through such a mapping."""
    return (
        "`winrm set winrm/config/service/auth '@{Certificate=\"true\"}'` and "
        "`winrm create winrm/config/service/certmapping?Issuer=<thumbprint of the CA that issued the "
        "certificate>+Subject=<the certificate's user principal name>+URI=* "
        '\'@{UserName="<local account>";Password="<its password>"}\' -remote:localhost` '
        "(`winrm enumerate winrm/config/service/certmapping` lists the mappings)"
    )


def max_envelope_size(kb: int) -> str:
    """Let the WinRM service accept requests of up to ``kb`` KiB (``MaxEnvelopeSizekb``)."""
    return f"`winrm set winrm/config '@{{MaxEnvelopeSizekb=\"{int(kb)}\"}}'`"


def join_administrators(user: str | None) -> str:
    """Make ``user`` a member of the machine's Administrators group."""
    member = user or "<the account bootstrap logs in as>"
    if member.startswith(".\\"):  # `.\name`, a local account as WinRM logs in: the group wants `name`
        member = member[2:]
    return f"`Add-LocalGroupMember -Group Administrators -Member '{member.replace(chr(39), chr(39) * 2)}'`"


def elevation_fix(user: str | None) -> str:
    """What makes a WinRM session elevated: an administrator account, with remote UAC's filtering
    of local accounts lifted (``LocalAccountTokenFilterPolicy``, what ``Enable-PSRemoting`` sets)."""
    return (
        "connect as an account of the machine's Administrators group (in an administrator PowerShell "
        f"there: {join_administrators(user)}), or set user: to one. A local account other than the "
        "built-in Administrator gets a filtered, non-elevated token over the network (UAC remote "
        f"restrictions) until {local_account_token_filter()} is set (Enable-PSRemoting sets it); a "
        "domain account in Administrators is elevated as it is"
    )


def raise_quota(setting: str, value: int = 50) -> str:
    """Raise one WinRM quota (a key of :data:`QUOTA_SCOPES`)."""
    return f"`winrm set {QUOTA_SCOPES[setting]} '@{{{setting}=\"{value}\"}}'`"


def local_account_token_filter() -> str:
    """Give local administrators their full token over the network (what ``Enable-PSRemoting`` sets)."""
    return (
        "`Set-ItemProperty HKLM:\\SOFTWARE\\Microsoft\\Windows\\CurrentVersion\\Policies\\System "
        "LocalAccountTokenFilterPolicy 1`"
    )


def not_elevated_error(node: str, user: str | None, what: str, result: Result) -> CommandFailedError | None:
    """The product's error for a PowerShell ``become`` script (``PowerShell.elevation_check``) that
    stopped because the WinRM session is not elevated: exit code 740 (ERROR_ELEVATION_REQUIRED) or
    its message; None for any other result. ``what``: the step's work, as the message names it."""
    if result.exit_code != NOT_ELEVATED_EXIT and NOT_ELEVATED_MESSAGE not in result.stderr:
        return None
    who = f"'{user}'" if user else "the account bootstrap logs in as"
    return CommandFailedError(
        f"{what} needs an elevated (administrator) session, and the WinRM session of {who} is not "
        f"elevated (exit code {result.exit_code}); nothing was changed",
        node=node,
        hint=elevation_fix(user) + "; then rerun",
        result=result,
    )


def check_elevated_run(node: str, user: str | None, what: str, result: Result, *, then: str = "") -> None:
    """The one verdict on a PowerShell ``become`` script a step ran on a Windows host (firewall
    rules, w32time): raises :func:`not_elevated_error` when the session was not elevated, else a
    ``CommandFailedError`` naming ``what`` failed with the output's last lines when it failed;
    returns when it succeeded. ``then``: what to do after fixing it (added to the hint)."""
    if (refused := not_elevated_error(node, user, what, result)) is not None:
        raise refused
    if not result.ok:
        said = " | ".join(result.tail(4)) or f"exit code {result.exit_code}"
        raise CommandFailedError(
            f"{what} failed: {said}",
            node=node,
            hint="it needs an elevated session (a member of Administrators over WinRM)"
            + (f"; {then}" if then else ""),
            result=result,
        )


def shell_quota_error(node: str, setting: str, result: Result) -> CommandFailedError:
    """The product's error for a command that ran into its WinRS shell's quota ``setting`` (a key of
    :data:`SHELL_QUOTA_RAISED`, as ``Platform.shell_quota`` names it): which setting, why it counts
    everything the command started, and the two ways out."""
    what = "memory" if setting == "MaxMemoryPerShellMB" else "processes"
    return CommandFailedError(
        f"the command ran into the WinRM shell's {setting} quota (exit code {result.exit_code}): "
        f"Windows counts the {what} of every process a WinRM command starts, children included, "
        "against its shell, and ends or refuses what goes over",
        node=node,
        hint="start heavy work as `bootstrap launch` and `sync` do, outside the shell, rather than with "
        "`bootstrap run`; or raise the quota on that machine, as administrator: "
        f"{raise_quota(setting, SHELL_QUOTA_RAISED[setting])}; then rerun",
        result=result,
    )
