"""Pure parts of the WinRM transport: CLIXML decoding, chunk planning, transfer scripts, error mapping,
settings checks. The protocol itself is exercised against the test server in tests/integration."""

from __future__ import annotations

import base64
import errno
from typing import Any

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st
from urllib3.exceptions import MaxRetryError, NewConnectionError
from winrm.exceptions import InvalidCredentialsError, WinRMTransportError, WSManFaultError
from winrm.protocol import Protocol

from orchestrator.errors import AuthenticationError, ExitCode, UnreachableError, UsageError
from orchestrator.inventory import WinRMSettings
from orchestrator.platforms.powershell import PowerShell
from orchestrator.platforms.transfer import get_script, put_script, remove_script
from orchestrator.transports.winrm import (
    MAX_ENVELOPE,
    ClixmlDecoder,
    Endpoint,
    WinRMTransport,
    auth_rejected,
    decode_clixml,
    explain,
    plan_chunks,
    send_chunk_size,
    unescape_clixml,
)
from tests import pwsh

# What Windows PowerShell 5.1 writes to a redirected stderr for `Get-Item C:\nope` (a first run also
# shows the "Preparing modules for first use." progress record).
REAL_ERROR = (
    '#< CLIXML\r\n<Objs Version="1.1.0.1" xmlns="http://schemas.microsoft.com/powershell/2004/04">'
    '<Obj S="progress" RefId="0"><TN RefId="0"><T>System.Management.Automation.PSCustomObject</T>'
    '<T>System.Object</T></TN><MS><I64 N="SourceId">1</I64><PR N="Record"><AV>Preparing modules for '
    "first use.</AV><AI>0</AI><Nil /><PI>-1</PI><PC>-1</PC><T>Completed</T><SR>-1</SR><SD> </SD></PR>"
    "</MS></Obj>"
    "<S S=\"Error\">Get-Item : Cannot find path 'C:\\nope' because it does not exist._x000D__x000A_</S>"
    '<S S="Error">At line:1 char:1_x000D__x000A_</S>'
    '<S S="Error">+ Get-Item C:\\nope_x000D__x000A_</S>'
    '<S S="Error">+ ~~~~~~~~~~~~~~~~_x000D__x000A_</S>'
    '<S S="Error">    + CategoryInfo          : ObjectNotFound: (C:\\nope:String) [Get-Item], '
    "ItemNotFoundEx _x000D__x000A_</S>"
    '<S S="Error">   ception_x000D__x000A_</S>'
    '<S S="Error">    + FullyQualifiedErrorId : PathNotFound,'
    "Microsoft.PowerShell.Commands.GetItemCommand_x000D__x000A_</S>"
    '<S S="Error"> _x000D__x000A_</S>'
    "</Objs>"
)
REAL_ERROR_TEXT = [
    "Get-Item : Cannot find path 'C:\\nope' because it does not exist.",
    "At line:1 char:1",
    "+ Get-Item C:\\nope",
    "+ ~~~~~~~~~~~~~~~~",
    "    + CategoryInfo          : ObjectNotFound: (C:\\nope:String) [Get-Item], ItemNotFoundEx ",
    "   ception",
    "    + FullyQualifiedErrorId : PathNotFound,Microsoft.PowerShell.Commands.GetItemCommand",
    " ",
]


def test_a_real_error_record_reads_as_the_console_shows_it() -> None:
    assert decode_clixml(REAL_ERROR).split("\r\n")[:-1] == REAL_ERROR_TEXT


def test_clixml_split_at_every_position_decodes_the_same() -> None:
    whole = decode_clixml(REAL_ERROR)
    for cut in range(1, len(REAL_ERROR)):
        decoder = ClixmlDecoder()
        text = decoder.feed(REAL_ERROR[:cut]) + decoder.feed(REAL_ERROR[cut:]) + decoder.close()
        assert text == whole, cut


def test_plain_stderr_and_text_around_documents_pass_through() -> None:
    assert decode_clixml("python: can't open file 'x.py'\r\n") == "python: can't open file 'x.py'\r\n"
    mixed = 'native line\r\n#< CLIXML\r\n<Objs Version="1.1.0.1"><S S="Error">boom_x000A_</S></Objs>after\n'
    assert decode_clixml(mixed) == "native line\r\nboom\nafter\n"


def test_warnings_and_verbose_get_the_console_prefix_and_progress_is_dropped() -> None:
    doc = (
        '#< CLIXML\r\n<Objs Version="1.1.0.1" xmlns="http://schemas.microsoft.com/powershell/2004/04">'
        '<S S="warning">disk almost full</S><S S="verbose">step 2</S>'
        '<Obj S="progress" RefId="1"><MS><PR N="Record"><AV>Copying</AV></PR></MS></Obj></Objs>'
    )
    assert decode_clixml(doc) == "WARNING: disk almost full\r\nVERBOSE: step 2\r\n"


def test_escapes_entities_underscores_and_surrogate_pairs() -> None:
    assert unescape_clixml("a &lt;b&gt; &amp; c") == "a <b> & c"
    assert unescape_clixml("tab_x0009_end_x005F_x0041_") == "tab\tend_x0041_"
    assert unescape_clixml("smile _xD83D__xDE00_") == "smile \U0001f600"
    assert (
        unescape_clixml("_x6100_ is a CJK character, _xZZZZ_ is text")
        == "\u6100 is a CJK character, _xZZZZ_ is text"
    )


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_any_error_text_survives_the_clixml_round_trip(text: str) -> None:
    # how PowerShell escapes a string record: XML entities, control characters and "_x" as _xHHHH_
    escaped = []
    for index, char in enumerate(text):
        if char == "_" and text[index + 1 : index + 2] == "x":
            escaped.append("_x005F_")
        elif ord(char) < 0x20 or char in "\ufffe\uffff":
            escaped.append(f"_x{ord(char):04X}_")
        else:
            escaped.append({"<": "&lt;", ">": "&gt;", "&": "&amp;"}.get(char, char))
    doc = f'#< CLIXML\r\n<Objs Version="1.1.0.1"><S S="Error">{"".join(escaped)}</S></Objs>'
    assert decode_clixml(doc) == text


# -- chunk planning ---------------------------------------------------------------------------------


def test_every_send_envelope_stays_under_the_smallest_windows_limit() -> None:
    """Measured on pywinrm's own Send message: the largest chunk, base64 line and all."""
    protocol = Protocol("http://host:5985/wsman", transport="basic", username="u", password="p")
    sent: list[bytes] = []
    protocol.send_message = lambda message: sent.append(message.encode()) or b""  # type: ignore[method-assign,func-returns-value]
    chunk = send_chunk_size()
    line = base64.b64encode(b"\xff" * chunk) + b"\r\n"
    protocol.send_command_input(
        "8F1B2C3D-0000-0000-0000-000000000000", "C0FFEE00-0000-0000-0000-0000000000FF", line
    )
    assert len(sent[0]) <= MAX_ENVELOPE
    assert len(sent[0]) > MAX_ENVELOPE * 0.9  # and not wastefully small
    assert chunk % 3 == 0


def test_chunks_cover_the_file_exactly_and_an_empty_file_is_one_send() -> None:
    assert plan_chunks(0, 10) == [(0, 0)]
    assert plan_chunks(25, 10) == [(0, 10), (10, 10), (20, 5)]
    assert plan_chunks(30, 10) == [(0, 10), (10, 10), (20, 10)]


# -- scripts ----------------------------------------------------------------------------------------

AWKWARD_PATHS = ["C:\\data\\model.bin", "~\\it's here\\x.bin", "C:\\a\u2019b\\$env:x `n;.txt", "relative\\f"]


@pytest.mark.parametrize("path", AWKWARD_PATHS)
def test_transfer_scripts_parse_and_carry_the_path_as_one_literal(path: str) -> None:
    platform = PowerShell()
    digest = "ab" * 32
    for script in (
        put_script(platform, path, digest),
        get_script(platform, path),
        remove_script(platform, path),
    ):
        tree = pwsh.assert_parses(script)
        literals = [
            (n.text or b"").decode()
            for n in pwsh.walk(tree.root_node)
            if n.type == "verbatim_string_characters"
        ]
        assert platform.quote(path) in literals
    put = pwsh.assert_parses(put_script(platform, None, digest, suffix=".ps1"))
    names = [c.name for c in pwsh.commands(put)]
    assert "Join-Path" in names and "Move-Item" in names and "Remove-Item" in names


def test_the_put_script_renames_only_after_the_hash_matches() -> None:
    script = put_script(PowerShell(), "C:\\x", "ab" * 32)
    assert script.index("$actual -ne $expected") < script.index("Move-Item")
    assert "exit 3" in script[script.index("$actual -ne $expected") : script.index("Move-Item")]


# -- errors ----------------------------------------------------------------------------------------

EP = Endpoint(node="win1", host="winbox", port=5986, scheme="https", auth="ntlm", user="bob")


def _requests_error(cls: type[Exception], inner: BaseException) -> Exception:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise MaxRetryError(None, "/wsman", exc) from exc  # type: ignore[arg-type]
    except MaxRetryError as wrapped:
        return cls(wrapped)


def test_connection_refused_names_the_listener_commands() -> None:
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    error = explain(
        _requests_error(requests.exceptions.ConnectionError, NewConnectionError(None, str(refused))), EP
    )  # type: ignore[arg-type]
    assert isinstance(error, UnreachableError) and error.exit_code == ExitCode.CONNECTION
    assert "WinRM is not listening on winbox:5986" in str(error)
    assert "New-Item -Path WSMan:\\localhost\\Listener -Transport HTTPS" in str(error)
    http = explain(
        _requests_error(requests.exceptions.ConnectionError, refused),
        Endpoint("win1", "winbox", 5985, "http", "ntlm", "bob"),
    )
    assert "Enable-PSRemoting -Force" in str(http)


def test_timeouts_name_the_firewall_rule() -> None:
    error = explain(requests.exceptions.ConnectTimeout("timed out"), EP, connect_timeout=3)
    assert isinstance(error, UnreachableError)
    assert "timed out after 3s" in str(error) and "-LocalPort 5986" in str(error)


def test_tls_failures_point_at_ca_bundle_or_the_scheme() -> None:
    unknown = requests.exceptions.SSLError(
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate"
    )
    text = str(explain(unknown, EP))
    assert "not trusted" in text and "winrm.ca_bundle" in text and "cert_validation: false" in text
    mismatch = requests.exceptions.SSLError(
        "certificate verify failed: Hostname mismatch, certificate is not valid for 'winbox'"
    )
    assert "not issued for 'winbox'" in str(explain(mismatch, EP))
    plain = requests.exceptions.SSLError("[SSL: WRONG_VERSION_NUMBER] wrong version number")
    assert "winrm.scheme: http" in str(explain(plain, EP))


def test_rejected_credentials_and_disabled_schemes() -> None:
    error = explain(InvalidCredentialsError("the specified credentials were rejected by the server"), EP)
    assert isinstance(error, AuthenticationError) and "'bob'" in str(error) and "rejected" in str(error)
    basic = Endpoint("win1", "winbox", 5985, "http", "basic", "bob")
    disabled = auth_rejected(basic, offered=["Negotiate", "Kerberos"])
    assert "winrm set winrm/config/service/auth '@{Basic=\"true\"}'" in str(disabled)
    unencrypted = auth_rejected(basic, offered=["Basic", "Negotiate"])
    assert 'AllowUnencrypted="true"' in str(unencrypted)
    assert (unencrypted.hint or "").startswith("set winrm.scheme: https")  # not "check the password"
    over_tls = auth_rejected(Endpoint("win1", "winbox", 5986, "https", "basic", "bob"), offered=None)
    assert (over_tls.hint or "").startswith("check user: and the password")
    certificate = auth_rejected(Endpoint("win1", "winbox", 5986, "https", "certificate", None), offered=None)
    assert "client certificate" in str(certificate) and "password_env" not in str(certificate)
    assert "winrm create winrm/config/service/certmapping?Issuer=" in str(certificate)


def _fault(code: int, reason: str) -> WSManFaultError:
    return WSManFaultError(500, "Bad HTTP response", "<xml/>", reason, wsman_fault_code=code)


def test_quota_faults_name_the_setting_to_raise() -> None:
    shells = explain(
        _fault(
            0x803381A5,
            "This user is allowed a maximum number of 30 concurrent shells, which has been exceeded.",
        ),
        EP,
    )
    assert "winrm set winrm/config/winrs '@{MaxShellsPerUser=\"50\"}'" in str(shells)
    users = explain(_fault(0x803381AB, "The maximum number of concurrent users has been exceeded."), EP)
    assert "winrm set winrm/config/winrs '@{MaxConcurrentUsers=\"50\"}'" in str(users)
    denied = explain(_fault(5, "Access is denied."), EP)
    assert isinstance(denied, AuthenticationError) and "Administrators" in str(denied).replace(
        "administrator", "Administrators"
    )


def test_http_errors() -> None:
    assert "no WinRM endpoint at /wsman" in str(explain(WinRMTransportError("http", 404, ""), EP))
    http_ntlm = Endpoint("win1", "winbox", 5985, "http", "ntlm", "bob")
    assert "winrm.scheme: https" in str(explain(WinRMTransportError("http", 400, ""), http_ntlm))
    too_large = explain(WinRMTransportError("http", 413, ""), EP)
    assert too_large.exit_code == ExitCode.CONNECTION
    assert f"winrm set winrm/config '@{{MaxEnvelopeSizekb=\"{MAX_ENVELOPE // 1024}\"}}'" in str(too_large)
    assert "MAX_ENVELOPE in orchestrator/transports/winrm_shell.py" in str(too_large)


# -- settings --------------------------------------------------------------------------------------


def _make(**kwargs: Any) -> WinRMTransport:
    settings = WinRMSettings(**kwargs.pop("settings", {}))
    return WinRMTransport(
        "win1",
        PowerShell(),
        host="winbox",
        port=None,
        user=kwargs.pop("user", "bob"),
        settings=settings,
        password=lambda: "pw",
        **kwargs,
    )


def test_basic_over_http_needs_allow_insecure_and_then_warns() -> None:
    with pytest.raises(UsageError) as caught:
        _make(settings={"transport": "basic", "scheme": "http"})
    assert caught.value.node == "win1" and "winrm.scheme: http" in str(caught.value)
    assert caught.value.exit_code == ExitCode.USAGE
    allowed = _make(settings={"transport": "basic", "scheme": "http"}, allow_insecure=True)
    assert any("allow_insecure" in w for w in allowed.warnings)
    assert allowed.endpoint.port == 5985 and allowed.describe() == "winrm http://bob@winbox:5985 (basic)"


def test_settings_that_cannot_work_are_refused_before_connecting() -> None:
    with pytest.raises(UsageError, match="certificate works only over HTTPS"):
        _make(settings={"transport": "certificate", "scheme": "http"})
    with pytest.raises(UsageError, match="key_file"):
        _make(settings={"transport": "certificate"})
    with pytest.raises(UsageError, match="needs a user name"):
        _make(user=None)
    with pytest.raises(UsageError, match="ca_bundle"):
        _make(settings={"ca_bundle": "/nonexistent/ca.pem"})
    assert _make().warnings == [] and _make().endpoint.port == 5986


def test_unchecked_certificate_needs_allow_insecure_and_then_warns() -> None:
    with pytest.raises(UsageError) as caught:
        _make(settings={"cert_validation": False})
    assert caught.value.node == "win1" and caught.value.exit_code == ExitCode.USAGE
    assert "winrm.cert_validation: false" in str(caught.value) and "allow_insecure: true" in str(caught.value)
    allowed = _make(settings={"cert_validation": False}, allow_insecure=True)
    assert [w for w in allowed.warnings if "cert_validation" in w and "winbox:5986" in w]
    # over HTTP there is no certificate to check: NTLM encrypts every message, nothing to allow
    assert _make(settings={"cert_validation": False, "scheme": "http"}).warnings == []


def test_dry_run_plan_shows_the_script_and_says_when_it_is_uploaded() -> None:
    transport = _make()
    assert transport.plan("Write-Output hi") == "Write-Output hi"
    long_script = "Write-Output '" + "x" * 5000 + "'"
    assert transport.plan(long_script).startswith("# ") and "uploaded to a temporary file" in transport.plan(
        long_script
    )
