"""Why a WinRM endpoint cannot be used, in one clear message each, with the fix.

Two moments: before connecting (:func:`check_settings`: combinations that cannot work or are
insecure) and after a failure (:func:`explain` and the functions it dispatches to: refused,
timed out, TLS, HTTP status, authentication, WS-Management faults such as quotas). The commands an
administrator types to fix a Windows machine come from :mod:`orchestrator.platforms.windows_admin`.
"""

from __future__ import annotations

import errno
import os
import socket
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import requests
from winrm.exceptions import InvalidCredentialsError, WinRMError, WinRMTransportError, WSManFaultError

from orchestrator.errors import AuthenticationError, ConnectError, UnreachableError, UsageError
from orchestrator.platforms import windows_admin
from orchestrator.platforms.windows_admin import listener_fix
from orchestrator.transports.winrm_shell import MAX_ENVELOPE

if TYPE_CHECKING:
    from orchestrator.inventory import WinRMSettings

__all__ = [
    "Endpoint",
    "auth_rejected",
    "check_settings",
    "explain",
    "explain_fault",
    "http_failure",
    "listener_fix",
    "offered_schemes",
    "tls_failure",
]

# WSManFault codes (wsmerror.h) of quota violations: which setting to raise for each
_QUOTA_SETTINGS: dict[int, str] = {
    0x803381A5: "MaxShellsPerUser",  # ERROR_WSMAN_QUOTA_MAX_SHELLS
    0x803381A6: "MaxConcurrentOperationsPerUser",  # ERROR_WSMAN_QUOTA_MAX_OPERATIONS
    0x803381A7: "MaxConcurrentOperationsPerUser",  # ERROR_WSMAN_QUOTA_USER
    0x803381A8: "MaxConcurrentOperations",  # ERROR_WSMAN_QUOTA_SYSTEM
    0x803381AB: "MaxConcurrentUsers",  # ERROR_WSMAN_QUOTA_MAX_SHELLUSERS
}
_ACCESS_DENIED = 5


@dataclass(frozen=True)
class Endpoint:
    """Where a transport goes, for messages (never a secret)."""

    node: str
    host: str
    port: int
    scheme: Literal["https", "http"]
    auth: str
    user: str | None

    @property
    def where(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.where}/wsman"


def check_settings(
    settings: WinRMSettings, ep: Endpoint, *, allow_insecure: bool, key_file: str | None
) -> list[str]:
    """Refuse settings that cannot work, and insecure ones unless the inventory allows them;
    returns the warnings to repeat on every run."""
    s, node = settings, ep.node
    warnings: list[str] = []
    # the inventory refuses these too (exit 2, naming file and line); this covers every other caller
    for item in s.insecure():
        if not allow_insecure:
            raise UsageError(
                f"{item.risk}; refused",
                node=node,
                hint=f"{item.fix}; on an isolated test network set allow_insecure: true",
            )
        warnings.append(f"allow_insecure: {item.risk} (WinRM on {ep.where})")
    if s.transport == "certificate":
        if s.scheme != "https":
            raise UsageError(
                "winrm.transport: certificate works only over HTTPS",
                node=node,
                hint="set winrm.scheme: https",
            )
        if not key_file or not os.path.isfile(os.path.expanduser(key_file)):
            raise UsageError(
                "winrm.transport: certificate needs the client certificate"
                + (f": key_file {key_file!r} is not a readable file" if key_file else ""),
                node=node,
                hint="set key_file: to a PEM file holding the client certificate and its private key",
            )
    if s.transport in ("ntlm", "basic", "credssp") and not ep.user:
        raise UsageError(
            f"winrm.transport: {s.transport} needs a user name",
            node=node,
            hint="set user: (a local account as `.\\name` or `HOST\\name`, a domain one as `DOMAIN\\name`)",
        )
    if s.transport == "kerberos":
        from winrm.transport import HAVE_KERBEROS

        if not HAVE_KERBEROS:
            raise UsageError(
                "winrm.transport: kerberos needs the Kerberos libraries",
                node=node,
                hint="pip install 'pywinrm[kerberos]' (and have a ticket: kinit user@REALM)",
            )
    if s.transport == "credssp":
        from winrm.transport import HAVE_CREDSSP

        if not HAVE_CREDSSP:
            raise UsageError(
                "winrm.transport: credssp needs requests-credssp",
                node=node,
                hint="pip install 'pywinrm[credssp]'",
            )
    if s.ca_bundle and not os.path.isfile(os.path.expanduser(s.ca_bundle)):
        raise UsageError(
            f"winrm.ca_bundle {s.ca_bundle!r} is not a readable file",
            node=node,
            hint="point it at a PEM file with the CA certificate of the WinRM listener",
        )
    return warnings


def offered_schemes(settings: WinRMSettings, ep: Endpoint, *, connect_timeout: float) -> list[str] | None:
    """The authentication schemes the endpoint advertises (an unauthenticated POST's 401), or None."""
    s = settings
    try:
        response = requests.post(
            ep.url,
            data=b"",
            headers={"Content-Type": "application/soap+xml;charset=UTF-8"},
            timeout=(connect_timeout, 10.0),
            verify=(os.path.expanduser(s.ca_bundle) if s.ca_bundle else True) if s.cert_validation else False,
            proxies={"http": "", "https": ""},
        )
    except requests.RequestException:
        return None
    if response.status_code != 401:
        return None
    header = response.headers.get("WWW-Authenticate", "")
    return [part.strip().split(" ")[0] for part in header.split(",") if part.strip()]


def _errnos(exc: BaseException) -> set[int]:
    """Every errno in an exception's cause/context chain (requests wraps urllib3 wraps OSError)."""
    found: set[int] = set()
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and isinstance(current.errno, int):
            found.add(current.errno)
        for arg in current.args:
            if isinstance(arg, BaseException):
                stack.append(arg)
        reason = getattr(current, "reason", None)
        if isinstance(reason, BaseException):
            stack.append(reason)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                stack.append(linked)
    return found


def _text_chain(exc: BaseException) -> str:
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(parts) < 6:
        parts.append(str(current))
        current = current.__cause__ or current.__context__
    return " | ".join(parts)


def explain(exc: BaseException, ep: Endpoint, *, connect_timeout: float | None = None) -> ConnectError:
    """One clear message per way reaching a WinRM endpoint fails, with the fix."""
    where, node = ep.where, ep.node
    text = _text_chain(exc)
    if isinstance(exc, InvalidCredentialsError):
        if "requires a username" in str(exc):
            return AuthenticationError(
                f"WinRM {ep.auth} authentication needs a user name", node=node, hint="set user: for this node"
            )
        if "requires a password" in str(exc):
            return AuthenticationError(
                f"WinRM {ep.auth} authentication needs a password",
                node=node,
                hint="set password_env: (and export it) or password_prompt: true for this node",
            )
        return auth_rejected(ep, offered=None)
    if isinstance(exc, WSManFaultError):
        return explain_fault(exc, ep)
    if isinstance(exc, (requests.exceptions.SSLError, ssl.SSLError)):
        return tls_failure(text, ep)
    codes = _errnos(exc)
    if errno.ECONNREFUSED in codes or "Connection refused" in text:
        return UnreachableError(
            f"WinRM is not listening on {where} (connection refused)",
            node=node,
            hint=listener_fix(ep.scheme, ep.port),
        )
    if isinstance(exc, requests.exceptions.ConnectTimeout) or (
        isinstance(exc, (socket.timeout, TimeoutError))
        and not isinstance(exc, requests.exceptions.ReadTimeout)
    ):
        after = f" after {connect_timeout:g}s" if connect_timeout else ""
        return UnreachableError(
            f"connection to {where} timed out{after}",
            node=node,
            hint=f"is the machine on and the address right? A firewall dropping TCP {ep.port} looks "
            f"the same: allow it on the Windows machine with {windows_admin.firewall_rule(ep.port)}",
        )
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return UnreachableError(
            f"WinRM on {where} stopped answering (read timed out)",
            node=node,
            hint="the machine may be overloaded or gone off the network",
        )
    if (
        codes & {errno.EHOSTUNREACH, errno.ENETUNREACH}
        or "No route to host" in text
        or "Network is unreachable" in text
    ):
        return UnreachableError(
            f"no route to {where}", node=node, hint="is the machine on this network and powered on?"
        )
    if "Name or service not known" in text or "nodename nor servname" in text or "getaddrinfo" in text:
        return UnreachableError(
            f"cannot resolve host name {ep.host!r}",
            node=node,
            hint="fix host: in the inventory or add the name to DNS / /etc/hosts",
        )
    if isinstance(exc, requests.exceptions.ConnectionError):
        dropped = any(w in text for w in ("RemoteDisconnected", "Connection aborted", "BadStatusLine"))
        if dropped and ep.scheme == "http":
            return UnreachableError(
                f"{where} closed the connection without an HTTP answer",
                node=node,
                hint="is this an HTTPS listener? set winrm.scheme: https (port 5986)",
            )
        return UnreachableError(f"cannot connect to WinRM on {where}: {exc}", node=node)
    if isinstance(exc, WinRMTransportError):
        return http_failure(exc.code, exc.response_text, ep)
    if isinstance(exc, WinRMError) and "message encryption" in str(exc):
        return ConnectError(
            f"WinRM over HTTP needs message encryption, which {ep.auth} cannot provide here: {exc}",
            node=node,
            hint="use winrm.scheme: https (recommended) or winrm.transport: ntlm",
        )
    if isinstance(exc, WinRMError):
        return ConnectError(f"WinRM error from {where}: {exc}", node=node)
    return UnreachableError(f"cannot reach WinRM on {where}: {type(exc).__name__}: {exc}", node=node)


def tls_failure(text: str, ep: Endpoint) -> ConnectError:
    where = ep.where
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        if "Hostname mismatch" in text or "doesn't match" in text or "IP address mismatch" in text:
            return ConnectError(
                f"the TLS certificate of {where} is not issued for {ep.host!r}",
                node=ep.node,
                hint="use the host name the certificate names in host:, or issue a certificate for "
                f"this name ({windows_admin.certificate_for('...')}) and bind it to the listener",
            )
        return ConnectError(
            f"the TLS certificate of {where} is not trusted (certificate verify failed)",
            node=ep.node,
            hint="set winrm.ca_bundle to a PEM file with the CA (or self-signed certificate) of the "
            "WinRM listener; only on a network you control: winrm.cert_validation: false together "
            "with allow_insecure: true",
        )
    if "WRONG_VERSION_NUMBER" in text or "wrong version number" in text or "record layer failure" in text:
        return ConnectError(
            f"{where} does not speak TLS: it looks like an HTTP listener",
            node=ep.node,
            hint="set winrm.scheme: http with port 5985 (NTLM then encrypts every message), or "
            "create an HTTPS listener (docs/windows.md)",
        )
    return ConnectError(f"TLS handshake with {where} failed: {text}", node=ep.node)


def auth_rejected(ep: Endpoint, *, offered: list[str] | None) -> ConnectError:
    """HTTP 401. ``offered``: the schemes the server's WWW-Authenticate header lists, when known."""
    who = f"{ep.user!r}" if ep.user else "the configured user"
    if ep.auth == "certificate":
        # no password involved: the host maps a client certificate to an account, or refuses it
        return AuthenticationError(
            f"the client certificate (key_file:) was rejected by WinRM on {ep.where}: the host maps no "
            "account to it, or has certificate authentication turned off",
            node=ep.node,
            hint="on the Windows machine, as administrator: "
            + windows_admin.certificate_mapping()
            + "; the issuing CA must be in the machine's Trusted Root store (Cert:\\LocalMachine\\Root), "
            "and the certificate needs the Client Authentication usage and a user principal name in "
            "its subject alternative name",
        )
    if offered is not None:
        names = {o.lower() for o in offered}
        wanted = {"basic": "basic", "ntlm": "negotiate", "credssp": "credssp", "kerberos": "negotiate"}
        need = wanted.get(ep.auth)
        if need and need not in names and not (need == "negotiate" and "ntlm" in names):
            setting = {"basic": "Basic", "negotiate": "Negotiate", "credssp": "CredSSP"}[need]
            listed = ", ".join(offered) if offered else "none"
            return AuthenticationError(
                f"{ep.auth} authentication is disabled on {ep.where} (the server offers: {listed})",
                node=ep.node,
                hint=f"on the Windows machine, as administrator: {windows_admin.enable_auth(setting)}, "
                "or set winrm.transport: to one the server offers",
            )
    if ep.auth == "basic" and ep.scheme == "http":
        # a default Windows host (AllowUnencrypted=false) answers 401 to Basic over HTTP whatever the
        # password: that is the likelier cause, and no password should travel in clear text anyway
        return AuthenticationError(
            f"basic authentication as {who} over unencrypted HTTP on {ep.where} was rejected: Windows "
            "refuses Basic over HTTP unless its WinRM service allows unencrypted messages (it does not "
            "by default), whatever the password",
            node=ep.node,
            hint="set winrm.scheme: https (HTTPS on port 5986: TLS then protects the password), or "
            "winrm.transport: ntlm, which encrypts every message over HTTP. Only on a lab host whose "
            "clear text this inventory accepts (allow_insecure: true): "
            f"{windows_admin.allow_unencrypted()} there. If that is set already: check user: (a local "
            "account, `.\\user`: Basic works only with local accounts) and the password "
            "(password_env / prompt)",
        )
    hint = (
        "check user: and the password (password_env / prompt); a local account is written "
        "`.\\user` or `HOST\\user`, a domain account `DOMAIN\\user`"
    )
    if ep.auth == "basic":
        hint += "; Basic works only with local accounts"
    return AuthenticationError(
        f"{ep.auth} authentication as {who} on {ep.where} was rejected", node=ep.node, hint=hint
    )


def sealing_refused(ep: Endpoint) -> ConnectError:
    """HTTP 401 to an encrypted (NTLM-sealed) message after the login itself was accepted: the
    password is right, the encryption is what the host (or a proxy in between) refuses."""
    return ConnectError(
        f"WinRM on {ep.where} accepted the {ep.auth} login but refused its encrypted messages "
        "(HTTP 401 to every sealed message): the user name and password are not the problem, WinRM's "
        "message encryption over HTTP is",
        node=ep.node,
        hint="set winrm.scheme: https (port 5986: TLS encrypts, no message encryption needed); an HTTP "
        "proxy or load balancer between the controller and the host can break NTLM message encryption, "
        "as can a host policy restricting NTLM (Network security: Restrict NTLM)",
    )


def http_failure(code: int, body: str, ep: Endpoint) -> ConnectError:
    if code == 404:
        return UnreachableError(
            f"{ep.where} answers HTTP but has no WinRM endpoint at /wsman (HTTP 404)",
            node=ep.node,
            hint="is the port right (5986 HTTPS, 5985 HTTP)? " + listener_fix(ep.scheme, ep.port),
        )
    if code in (400, 415, 500) and ep.scheme == "http" and ep.auth in ("ntlm", "kerberos", "credssp"):
        return ConnectError(
            f"{ep.where} refused the encrypted WinRM message (HTTP {code})",
            node=ep.node,
            hint="the listener may not accept message encryption over HTTP: use winrm.scheme: https",
        )
    if code == 413:
        needed = MAX_ENVELOPE // 1024
        return ConnectError(
            f"WinRM on {ep.where} refused a request as too large (HTTP 413): the host's "
            f"MaxEnvelopeSizekb is under the {needed} KiB this product's requests may take",
            node=ep.node,
            hint=f"on the Windows machine, as administrator: {windows_admin.max_envelope_size(needed)} "
            "(or more: Windows 8 / Server 2012 and later default to 500); the product cuts file "
            "transfers into stdin chunks that fit MAX_ENVELOPE in orchestrator/transports/winrm_shell.py "
            "(send_chunk_size): lowering it there makes those requests smaller",
        )
    return UnreachableError(f"WinRM on {ep.where} answered HTTP {code}", node=ep.node)


def explain_fault(exc: WSManFaultError, ep: Endpoint) -> ConnectError:
    code = exc.wsman_fault_code
    reason = (exc.reason or "").strip()
    setting = _QUOTA_SETTINGS.get(code or 0)
    if setting is None and "maximum number of" in reason.lower():
        lowered = reason.lower()
        setting = (
            "MaxConcurrentUsers"
            if "users" in lowered
            else ("MaxShellsPerUser" if "shell" in lowered else "MaxConcurrentOperationsPerUser")
        )
    if setting is not None:
        return ConnectError(
            f"WinRM quota exceeded on {ep.where}: {reason}",
            node=ep.node,
            hint="close other WinRM sessions of this user, or raise the limit as administrator: "
            + windows_admin.raise_quota(setting),
        )
    if code == _ACCESS_DENIED or "access is denied" in reason.lower():
        return AuthenticationError(
            f"WinRM on {ep.where} denied access to {ep.user!r}: {reason}",
            node=ep.node,
            hint="the account must be an administrator of that machine (or a member of Remote "
            "Management Users); for a local administrator over NTLM on a workgroup machine run "
            f"{windows_admin.local_account_token_filter()} as administrator",
        )
    return ConnectError(f"WinRM on {ep.where} refused the request: {reason}", node=ep.node)


def lost(exc: BaseException, ep: Endpoint, doing: str) -> ConnectError:
    """A connection that failed while a command ran (``doing``: what the transport was doing)."""
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, WSManFaultError):
        return explain_fault(exc, ep)
    if isinstance(exc, InvalidCredentialsError):
        return auth_rejected(ep, offered=None)
    if isinstance(exc, WinRMTransportError) and exc.code == 413:
        return http_failure(exc.code, exc.response_text, ep)
    return UnreachableError(
        f"the WinRM connection to {ep.where} failed while trying to {doing}: {type(exc).__name__}: {exc}",
        node=ep.node,
        hint="the node may have gone down or off the network; output so far is in the log",
    )
