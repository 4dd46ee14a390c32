"""WS-Management SOAP envelopes: parsing the requests clients send and building the responses and
faults the way a real Windows WinRM service words and shapes them (prefixes s/a/x/w/rsp/p, ``xml:lang``,
``uuid:`` message ids in upper case, trailing spaces in fault texts: copied from recorded real
responses, see docs/testing.md "WS-Management test server")."""

from __future__ import annotations

import re
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

NS = {
    "s": "http://www.w3.org/2003/05/soap-envelope",
    "a": "http://schemas.xmlsoap.org/ws/2004/08/addressing",
    "x": "http://schemas.xmlsoap.org/ws/2004/09/transfer",
    "e": "http://schemas.xmlsoap.org/ws/2004/08/eventing",
    "n": "http://schemas.xmlsoap.org/ws/2004/09/enumeration",
    "w": "http://schemas.dmtf.org/wbem/wsman/1/wsman.xsd",
    "p": "http://schemas.microsoft.com/wbem/wsman/1/wsman.xsd",
    "rsp": "http://schemas.microsoft.com/wbem/wsman/1/windows/shell",
    "f": "http://schemas.microsoft.com/wbem/wsman/1/wsmanfault",
}
SHELL_CMD_URI = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell/cmd"
ACTION_CREATE = "http://schemas.xmlsoap.org/ws/2004/09/transfer/Create"
ACTION_DELETE = "http://schemas.xmlsoap.org/ws/2004/09/transfer/Delete"
ACTION_COMMAND = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell/Command"
ACTION_RECEIVE = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell/Receive"
ACTION_SEND = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell/Send"
ACTION_SIGNAL = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell/Signal"
ACTION_FAULT = "http://schemas.dmtf.org/wbem/wsman/1/wsman/fault"
STATE_RUNNING = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell/CommandState/Running"
STATE_DONE = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell/CommandState/Done"
SIGNAL_TERMINATE = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell/signal/terminate"
SIGNAL_CTRL_C = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell/signal/ctrl_c"
SIGNAL_CTRL_BREAK = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell/signal/ctrl_break"
ANONYMOUS = "http://schemas.xmlsoap.org/ws/2004/08/addressing/role/anonymous"


def _q(prefix: str, local: str) -> str:
    return f"{{{NS[prefix]}}}{local}"


class BadRequest(Exception):
    """The request cannot be understood (not XML, not SOAP, a required element missing)."""


@dataclass
class Request:
    """The parts of a WS-Management request the server acts on."""

    action: str
    message_id: str
    resource_uri: str
    operation_timeout: float | None  # seconds
    selectors: dict[str, str]
    options: dict[str, str]
    body: ET.Element
    root: ET.Element = field(repr=False)
    max_envelope: int | None = None  # the client's w:MaxEnvelopeSize (octets), if it sent one

    def find(self, path: str) -> ET.Element | None:
        return self.body.find(path, NS)

    def findall(self, path: str) -> list[ET.Element]:
        return self.body.findall(path, NS)


_DURATION = re.compile(
    r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(text: str) -> float | None:
    """xs:duration (``PT20S``, ``PT7200.000S``, ``P0DT0H0M5S``) in seconds; None if not one."""
    m = _DURATION.match(text.strip())
    if not m or text.strip() in ("P", "PT"):
        return None
    parts = {k: float(v) if v else 0.0 for k, v in m.groupdict().items()}
    return parts["d"] * 86400 + parts["h"] * 3600 + parts["m"] * 60 + parts["s"]


def parse_request(data: bytes) -> Request:
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise BadRequest(f"not XML: {exc}") from exc
    if root.tag != _q("s", "Envelope"):
        raise BadRequest(f"not a SOAP 1.2 envelope: {root.tag}")
    header = root.find("s:Header", NS)
    body = root.find("s:Body", NS)
    if header is None or body is None:
        raise BadRequest("SOAP Header or Body missing")

    def text(path: str) -> str:
        el = header.find(path, NS)
        return (el.text or "").strip() if el is not None else ""

    action = text("a:Action")
    if not action:
        raise BadRequest("no wsa:Action")
    timeout_text = text("w:OperationTimeout")
    timeout = parse_duration(timeout_text) if timeout_text else None
    envelope_text = text("w:MaxEnvelopeSize")
    max_envelope = int(envelope_text) if envelope_text.isdigit() else None
    selectors = {
        el.get("Name", ""): (el.text or "").strip() for el in header.findall("w:SelectorSet/w:Selector", NS)
    }
    options = {
        el.get("Name", ""): (el.text or "").strip() for el in header.findall("w:OptionSet/w:Option", NS)
    }
    return Request(
        action=action,
        message_id=text("a:MessageID"),
        resource_uri=text("w:ResourceURI"),
        operation_timeout=timeout,
        selectors=selectors,
        options=options,
        body=body,
        root=root,
        max_envelope=max_envelope,
    )


def new_message_id() -> str:
    return "uuid:" + str(uuid.uuid4()).upper()


def _xmlns(prefixes: str) -> str:
    return "".join(f' xmlns:{p}="{NS[p]}"' for p in prefixes.split())


def envelope(action: str, relates_to: str, body: str, prefixes: str = "s a x w rsp p") -> str:
    """A response envelope as Windows writes it (one line, ``xml:lang`` on the root)."""
    return (
        f'<s:Envelope xml:lang="en-US"{_xmlns(prefixes)}>'
        f"<s:Header><a:Action>{escape(action)}</a:Action>"
        f"<a:MessageID>{new_message_id()}</a:MessageID>"
        f"<a:To>{ANONYMOUS}</a:To>"
        f"<a:RelatesTo>{escape(relates_to)}</a:RelatesTo></s:Header>"
        f"<s:Body>{body}</s:Body></s:Envelope>"
    )


def create_response(
    req: Request,
    address: str,
    shell_id: str,
    owner: str,
    client_ip: str,
    streams: tuple[str, str],
    working_directory: str | None = None,
    idle_timeout: float | None = None,
    environment: dict[str, str] | None = None,
) -> str:
    env = "".join(
        f"<rsp:Variable Name={quoteattr(k)}>{escape(v)}</rsp:Variable>"
        for k, v in (environment or {}).items()
    )
    body = (
        "<x:ResourceCreated>"
        f"<a:Address>{escape(address)}</a:Address>"
        f"<a:ReferenceParameters><w:ResourceURI>{SHELL_CMD_URI}</w:ResourceURI>"
        f'<w:SelectorSet><w:Selector Name="ShellId">{shell_id}</w:Selector></w:SelectorSet>'
        "</a:ReferenceParameters></x:ResourceCreated>"
        f'<rsp:Shell xmlns:rsp="{NS["rsp"]}">'
        f"<rsp:ShellId>{shell_id}</rsp:ShellId>"
        f"<rsp:ResourceUri>{SHELL_CMD_URI}</rsp:ResourceUri>"
        f"<rsp:Owner>{escape(owner)}</rsp:Owner>"
        f"<rsp:ClientIP>{escape(client_ip)}</rsp:ClientIP>"
        + (f"<rsp:Environment>{env}</rsp:Environment>" if env else "")
        + (
            f"<rsp:WorkingDirectory>{escape(working_directory)}</rsp:WorkingDirectory>"
            if working_directory
            else ""
        )
        + f"<rsp:IdleTimeOut>PT{7200.0 if idle_timeout is None else idle_timeout:.3f}S</rsp:IdleTimeOut>"
        f"<rsp:InputStreams>{escape(streams[0])}</rsp:InputStreams>"
        f"<rsp:OutputStreams>{escape(streams[1])}</rsp:OutputStreams>"
        "<rsp:ShellRunTime>P0DT0H0M0S</rsp:ShellRunTime>"
        "<rsp:ShellInactivity>P0DT0H0M0S</rsp:ShellInactivity>"
        "</rsp:Shell>"
    )
    return envelope(ACTION_CREATE + "Response", req.message_id, body)


def command_response(req: Request, command_id: str) -> str:
    body = f"<rsp:CommandResponse><rsp:CommandId>{command_id}</rsp:CommandId></rsp:CommandResponse>"
    return envelope(ACTION_COMMAND + "Response", req.message_id, body)


def receive_response(
    req: Request,
    command_id: str,
    chunks: list[tuple[str, bytes]],
    ended: list[str],
    exit_code: int | None,
) -> str:
    """``chunks``: (stream name, data) in order; ``ended``: streams that end in this response (an
    empty ``End="true"`` element each, as Windows sends); ``exit_code`` None: still Running."""
    import base64

    parts = ["<rsp:ReceiveResponse>"]
    for name, data in chunks:
        b64 = base64.b64encode(data).decode("ascii")
        parts.append(f'<rsp:Stream Name="{name}" CommandId="{command_id}">{b64}</rsp:Stream>')
    for name in ended:
        parts.append(f'<rsp:Stream Name="{name}" CommandId="{command_id}" End="true"></rsp:Stream>')
    if exit_code is None:
        parts.append(
            f'<rsp:CommandState CommandId="{command_id}" State="{STATE_RUNNING}"></rsp:CommandState>'
        )
    else:
        parts.append(
            f'<rsp:CommandState CommandId="{command_id}" State="{STATE_DONE}">'
            f"<rsp:ExitCode>{exit_code}</rsp:ExitCode></rsp:CommandState>"
        )
    parts.append("</rsp:ReceiveResponse>")
    return envelope(ACTION_RECEIVE + "Response", req.message_id, "".join(parts), "s a w rsp p")


def send_response(req: Request) -> str:
    return envelope(ACTION_SEND + "Response", req.message_id, "<rsp:SendResponse/>")


def signal_response(req: Request) -> str:
    return envelope(ACTION_SIGNAL + "Response", req.message_id, "<rsp:SignalResponse/>")


def delete_response(req: Request) -> str:
    return envelope(ACTION_DELETE + "Response", req.message_id, "", "s a w p")


@dataclass
class Fault:
    """A WS-Management fault: HTTP 500 with this envelope (what Windows answers for every fault)."""

    code: str  # "s:Sender" / "s:Receiver"
    subcode: str  # "w:TimedOut", ...
    reason: str
    wsman_code: int
    message: str
    detail: str | None = None  # w:FaultDetail URI
    provider: tuple[str, str] | None = None  # (provider, path): message wrapped in f:ProviderFault
    status: int = 500

    def render(self, relates_to: str, machine: str) -> str:
        detail = f"<w:FaultDetail>{escape(self.detail)}</w:FaultDetail>" if self.detail else ""
        message = escape(self.message)
        if self.provider is not None:
            message = (
                f"<f:ProviderFault provider={quoteattr(self.provider[0])} path={quoteattr(self.provider[1])}>"
                f"{message}</f:ProviderFault>"
            )
        body = (
            f"<s:Fault><s:Code><s:Value>{self.code}</s:Value><s:Subcode><s:Value>{self.subcode}</s:Value>"
            "</s:Subcode></s:Code><s:Reason>"
            f'<s:Text xml:lang="en-US">{escape(self.reason)}</s:Text></s:Reason>'
            f'<s:Detail>{detail}<f:WSManFault xmlns:f="{NS["f"]}" Code="{self.wsman_code}" '
            f"Machine={quoteattr(machine)}><f:Message>{message}</f:Message></f:WSManFault></s:Detail></s:Fault>"
        )
        return envelope(ACTION_FAULT, relates_to, body, "s a x e n w p")


# -- the faults this server sends, worded as Windows words them ----------------------------------------

TIMEOUT_TEXT = (
    "The WS-Management service cannot complete the operation within the time specified in OperationTimeout.  "
)
INVALID_SELECTORS_TEXT = (
    "The WS-Management service cannot process the request because the request contained invalid selectors "
    "for the resource. "
)
UNEXPECTED_SELECTORS = "http://schemas.dmtf.org/wbem/wsman/1/wsman/faultDetail/UnexpectedSelectors"


def timed_out() -> Fault:
    return Fault("s:Receiver", "w:TimedOut", TIMEOUT_TEXT, 2150858793, TIMEOUT_TEXT)


def shell_not_found(shell_id: str) -> Fault:
    return Fault(
        "s:Sender",
        "w:InvalidSelectors",
        INVALID_SELECTORS_TEXT,
        2150858843,
        f"The request for the Windows Remote Shell with ShellId {shell_id} failed because the shell was not "
        "found on the server. Possible causes are: the specified ShellId is incorrect or the shell no longer "
        "exists on the server. Provide the correct ShellId or create a new shell and retry the operation. ",
        detail=UNEXPECTED_SELECTORS,
    )


def command_not_found() -> Fault:
    return Fault(
        "s:Sender",
        "w:InvalidSelectors",
        INVALID_SELECTORS_TEXT,
        2150858843,
        "The Windows Remote Shell received a request to perform an operation on a command identifier that "
        "does not exist. Either the command has completed execution or the client specified an invalid "
        "command identifier. ",
        detail=UNEXPECTED_SELECTORS,
    )


def invalid_parameter() -> Fault:
    return Fault(
        "s:Sender",
        "w:InvalidParameter",
        "The parameter is incorrect. ",
        87,
        "The parameter is incorrect. ",
        detail="http://schemas.dmtf.org/wbem/wsman/1/wsman/faultDetail/InvalidValue",
        provider=("Shell cmd plugin", r"%systemroot%\system32\winrscmd.dll"),
    )


def shell_quota(limit: int) -> Fault:
    """MaxShellsPerUser exceeded. DOCUMENTED, NOT RECORDED: no transcript of this fault exists here (the
    pypsrp recordings have none); its subcode, code (ERROR_WSMAN_QUOTA_MAX_SHELLS, 0x803381A5) and
    wording follow Microsoft's documentation of the quota and the error text Windows users report.
    What the client depends on (the code, "maximum number of") is what the product reads."""
    text = (
        f"The WS-Management service cannot process the request. This user is allowed a maximum number of "
        f"{limit} concurrent shells, which has been exceeded. Close existing shells or raise the quota for "
        "this user. "
    )
    return Fault("s:Receiver", "w:QuotaLimit", text, 2150859173, text)


def filename_too_long() -> Fault:
    """CreateProcess refuses a command line over 32767 characters (ERROR_FILENAME_EXCED_RANGE, 206)."""
    text = "The filename or extension is too long. "
    return Fault(
        "s:Receiver",
        "w:InternalError",
        text,
        2147942606,
        text,
        provider=("Shell cmd plugin", r"%systemroot%\system32\winrscmd.dll"),
    )


def file_not_found() -> Fault:
    """CreateProcess found no such program (WINRS_SKIP_CMD_SHELL without a full path, as recorded)."""
    text = "The system cannot find the file specified. "
    return Fault(
        "s:Receiver",
        "w:InternalError",
        text,
        2147942402,
        text,
        provider=("Shell cmd plugin", r"%systemroot%\system32\winrscmd.dll"),
    )


def action_not_supported(action: str) -> Fault:
    text = "The action is not supported by the service. "
    return Fault(
        "s:Sender",
        "a:ActionNotSupported",
        text,
        2150858765,
        f"The WS-Management service cannot process the request because the action {action} is not "
        "supported. ",
        detail=None,
    )


def bad_request(reason: str) -> Fault:
    text = "The WS-Management service cannot process the request because the XML is invalid. "
    return Fault("s:Sender", "w:SchemaValidationError", text, 2150858817, text + reason, status=400)
