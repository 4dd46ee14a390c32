"""What an administrator types on a Windows machine to let WinRM in: the fixes that error hints show.

Never run by the product (it cannot reach a machine whose WinRM refuses it); kept beside the
PowerShell dialect so that the transports hold no PowerShell or cmd text (issue 13). Each function
returns the command in backquotes, ready to be placed in a sentence.
"""

from __future__ import annotations

#: where each WinRM quota setting lives in ``winrm set``
QUOTA_SCOPES = {
    "MaxShellsPerUser": "winrm/config/winrs",
    "MaxConcurrentUsers": "winrm/config/winrs",
    "MaxConcurrentOperationsPerUser": "winrm/config/service",
    "MaxConcurrentOperations": "winrm/config/service",
}


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
    return f'`winrm set winrm/config/service/auth @{{{setting}="true"}}`'


def allow_unencrypted() -> str:
    """Let the WinRM service accept unencrypted messages (what Basic over HTTP needs)."""
    return '`winrm set winrm/config/service @{AllowUnencrypted="true"}`'


def raise_quota(setting: str, value: int = 50) -> str:
    """Raise one WinRM quota (a key of :data:`QUOTA_SCOPES`)."""
    return f'`winrm set {QUOTA_SCOPES[setting]} @{{{setting}="{value}"}}`'


def local_account_token_filter() -> str:
    """Give local administrators their full token over the network (what ``Enable-PSRemoting`` sets)."""
    return (
        "`Set-ItemProperty HKLM:\\SOFTWARE\\Microsoft\\Windows\\CurrentVersion\\Policies\\System "
        "LocalAccountTokenFilterPolicy 1`"
    )
