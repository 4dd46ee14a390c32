"""The framed record codec (orchestrator/records.py): whatever bytes a field holds, and whatever else
the node prints around the records, the decoder returns exactly the fields each producer encoded.

Producers: the Python encoder (as node-side helpers run it: its source alone), the POSIX sh
functions run by the real /bin/sh (fields as arguments, binary through stdin, and the fact sections
of ``Platform.sectioned`` with any output and exit code), and the
PowerShell function: no PowerShell runs here, so its statements run in the played Windows node's
interpreter (tests/winrm_server/interpret.py, .NET's StringBuilder, UTF8 and Base64 as stand-ins),
its text is checked statement by statement, and every record call of the Windows run scripts."""

from __future__ import annotations

import base64
import subprocess
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import records
from orchestrator.facts.base import split_sections
from orchestrator.platforms import PosixShell, PowerShell
from orchestrator.runs.windows import WindowsRuns
from tests import pwsh
from tests.winrm_server.interpret import Interpreter
from tests.winrm_server.native import ENCODER_STATICS, StringBuilder, console_writer

SH = PosixShell()
PS = PowerShell()
NONCE = "cb-0123456789ab"

#: every line separator str.splitlines knows, and the bytes that end or fake lines elsewhere
SEPARATORS = ["\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x00"]
#: what a hostile node prints: it does not know the nonce of the command (the controller's secret)
FAKES = [
    "@@cb-aaaaaaaaaaaa state :bm8tcnVu",  # a guessed nonce
    f"@@{NONCE} stop :e!",  # the nonce, but not the grammar (whatever follows)
    f"@@{NONCE} Stop :ZXhpdGVk",
    f"x@@{NONCE} stop :ZXhpdGVk",
    "@@stop exited 0",
    "@@dir 0 .",
    "rc=0",
    "alive=0",
    "@@ran-before",
    " :",
    "@@",
]


def hostile_text(*, nul: bool = True) -> st.SearchStrategy[str]:
    pieces = st.sampled_from([s for s in SEPARATORS if nul or s != "\x00"] + FAKES) | st.text(max_size=8)
    text = st.lists(pieces, max_size=8).map("".join)
    return text if nul else text.map(lambda t: t.replace("\x00", ""))


hostile_bytes = st.lists(
    st.binary(max_size=12) | hostile_text().map(lambda t: t.encode("utf-8", "surrogatepass")), max_size=6
).map(b"".join)


def node_python_encoder() -> Any:
    """The encoder as a node-side helper gets it: its source text, with only ``base64`` imported."""
    namespace: dict[str, Any] = {"base64": base64}
    exec(records.PYTHON_ENCODER, namespace)
    return namespace["record"]


@settings(max_examples=300, deadline=None)
@given(
    fields=st.lists(hostile_bytes, max_size=4),
    before=hostile_text(),
    after=hostile_text(),
    kind=st.from_regex(r"[a-z][a-z-]{0,10}", fullmatch=True),
)
def test_the_python_encoder_round_trips_any_bytes_among_any_output(
    fields: list[bytes], before: str, after: str, kind: str
) -> None:
    line = node_python_encoder()(NONCE, kind, *fields)
    assert line == records.record(NONCE, kind, *fields)  # the shipped source is the controller's encoder
    # the node's other output around it: anything, but complete lines (a record starts a line)
    output = before + "\n" + line + after
    expected = [records.Record(kind, tuple(fields))]
    assert records.decode(output, NONCE) == expected
    assert records.decode(output.replace("\n", "\r\n"), NONCE) == expected  # a Windows console
    # nothing the output holds is a record of another nonce, or of none
    assert records.decode(output, "cb-ffffffffffff") == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fields=st.lists(hostile_text(nul=False), max_size=3),
    stdin=hostile_bytes,
    noise=hostile_text(nul=False),
)
def test_the_sh_encoder_round_trips_any_argument_and_any_stdin(
    fields: list[str], stdin: bytes, noise: str
) -> None:
    words = " ".join(SH.quote(f) for f in fields)
    script = (
        SH.record_functions(NONCE)
        + f"\nprintf '%s\\n' {SH.quote(noise)}\n"  # the node's own output: plain, whatever it holds
        + f"_cb_rec args {words}\n"
        + f"printf '%s\\n' {SH.quote(noise)}\n"
        + f"_cb_recin bin {words}\n"
    )
    done = subprocess.run(["/bin/sh", "-c", script], input=stdin, capture_output=True, check=True, timeout=30)
    encoded = [f.encode("utf-8", "surrogateescape") for f in fields]
    assert records.decode(done.stdout.decode("utf-8", "replace"), NONCE) == [
        records.Record("args", tuple(encoded)),
        records.Record("bin", (*encoded, stdin)),  # NUL bytes and trailing newlines kept
    ]


def test_the_sh_encoder_keeps_an_empty_field_and_a_field_that_is_only_newlines() -> None:
    script = (
        SH.record_functions(NONCE) + "\n_cb_rec k '' \"$(printf 'x\\n')\" '\n\n'\nprintf '' | _cb_recin e"
    )
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, check=True, text=True)
    assert records.decode(done.stdout, NONCE) == [
        records.Record("k", (b"", b"x", b"\n\n")),
        records.Record("e", (b"",)),
    ]


@pytest.mark.parametrize(
    "line",
    [
        f"@@{NONCE} kind :eA== trailing",
        f"@@{NONCE} kind :e",  # not base64
        f"@@{NONCE} Kind :eA==",
        f"@@{NONCE}  kind",
        f" @@{NONCE} kind",
        f"@@{NONCE} kind :eA==\x1e",
        f"@@{NONCE} kind:eA==",
        f"@@{NONCE}x kind",
        f"@@{NONCE} kind\r\r",
    ],
)
def test_only_whole_lines_of_the_grammar_are_records(line: str) -> None:
    assert records.decode_line(line, NONCE) is None
    assert records.decode(line + "\n", NONCE) == []


def test_the_decoder_never_splits_on_what_splitlines_splits() -> None:
    # one record whose line is cut by splitlines at \x1e: the decoder sees one line of plain output
    forged = f"epoch 1\x1e@@{NONCE} rc :MA==\u2028@@{NONCE} alive :MA==\n"
    assert records.decode(forged, NONCE) == []
    assert records.plain(forged, NONCE) == forged


# -- PowerShell: the encoder's text, and every call of it in the Windows run scripts ---------------------


@settings(max_examples=200, deadline=None)
@given(
    fields=st.lists(st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cs",)))), max_size=3),
    kind=st.from_regex(r"[a-z][a-z-]{0,10}", fullmatch=True),
)
def test_the_powershell_encoder_run_round_trips_any_text(fields: list[str | None], kind: str) -> None:
    """The encoder's own statements run (the played node's interpreter, with .NET's StringBuilder,
    UTF8 and Base64 as stand-ins): whatever a field holds, the controller decodes it back."""
    names = [f"$f{i}" for i in range(len(fields))]
    script = PS.record_functions(NONCE) + f"\nOut-CbRecord '{kind}' @({', '.join(names) or '$null'})\n"
    tree = pwsh.assert_parses(script)
    lines: list[str] = []
    interpreter = Interpreter(
        dict(zip(names, fields, strict=True)),
        {"New-Object": lambda positional, named: StringBuilder()},
        {**ENCODER_STATICS, "[Console]::Out": console_writer(lines)},
    )
    interpreter.define(tree)
    interpreter.block(tree.root_node)
    # $null fields travel as empty ones; `@($null)` is one $null field
    expected = tuple((f or "").encode() for f in fields) if fields else (b"",)
    assert records.decode("".join(line + "\n" for line in lines), NONCE) == [records.Record(kind, expected)]


def test_the_powershell_encoder_writes_the_same_format() -> None:
    text = PS.record_functions(NONCE)
    tree = pwsh.assert_parses(PS.wrap(text + "\nOut-CbRecord 'k' @('a', $null, 'b')"))
    assert f"$cbNonce = '{NONCE}'" in text
    # '@@' NONCE ' ' KIND, then ' :' + base64 of each field's UTF-8 bytes, then one "\n" (never
    # WriteLine: "\r\n" on Windows, which the decoder takes, but one format is simpler)
    statements = [line.strip() for line in text.split("\n")]
    assert "$null = $cbLine.Append('@@').Append($cbNonce).Append(' ').Append($Kind)" in statements
    assert "$cbBytes = [System.Text.Encoding]::UTF8.GetBytes([string]$cbField)" in statements
    assert "$null = $cbLine.Append(' :').Append([System.Convert]::ToBase64String($cbBytes))" in statements
    assert "[Console]::Out.Write($cbLine.Append([char]10).ToString())" in statements
    assert "WriteLine" not in text
    # no field at all: no " :" (a record without fields)
    assert "if ($null -ne $Fields) {" in statements
    assert [c.arguments for c in pwsh.commands(tree) if c.name == "Out-CbRecord"] == [
        ["'k'", "@('a', $null, 'b')"]
    ]
    with pytest.raises(ValueError):
        PS.record_functions("cb-'; evil")


def test_every_windows_record_has_a_literal_kind_and_a_field_array() -> None:
    runs = WindowsRuns(PS)
    scripts = [
        runs.start("C:/r/n", "C:/r/n/node.log", "m", NONCE),
        runs.stop("C:/r/n", "m", 5.0, NONCE),
        runs.status("C:/r/n", "m", "C:/r/n/node.log", NONCE),
        runs.list_files([["C:/r/n/a"], ["D:/b"]], NONCE),
        runs.which_exist(["C:/r/n/out/a b.pt", "D:/x'y"], NONCE),
        PS.sectioned([("one", "'x'"), ("two", "throw 'boom'")], NONCE),
    ]
    for script in scripts:
        tree = pwsh.assert_parses(PS.wrap(script))
        calls = [c for c in pwsh.commands(tree) if c.name == "Out-CbRecord"]
        assert calls
        for call in calls:
            kind, fields = call.arguments
            assert kind.startswith("'") and records.check_kind(kind.strip("'"))
            assert fields.startswith("@(") and fields.endswith(")")
        assert "[Console]::Out.WriteLine('@@" not in script  # nothing printed outside the codec


def test_a_nonce_must_have_its_shape() -> None:
    for bad in ("", "cb-12", "cb-0123456789AB", "x; rm -rf /"):
        with pytest.raises(ValueError):
            SH.record_functions(bad)
    assert records.NONCE.fullmatch(records.new_nonce())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(outputs=st.lists(st.tuples(hostile_bytes, st.integers(0, 255)), min_size=1, max_size=3))
def test_fact_sections_carry_any_output_and_their_exit_codes(outputs: list[tuple[bytes, int]]) -> None:
    # the real sectioned script: each command prints its bytes (octal escapes) and exits with its code
    sections = [
        (f"s{i}", "printf '" + "".join(f"\\{b:03o}" for b in data) + f"'; exit {code}")
        for i, (data, code) in enumerate(outputs)
    ]
    done = subprocess.run(["/bin/sh", "-c", SH.sectioned(sections, NONCE)], capture_output=True, check=True)

    def shown(data: bytes) -> str:  # what a fact parser gets: text, CRLF as LF, without the last LF
        text = data.decode("utf-8", "replace").replace("\r\n", "\n")
        return text[:-1] if text.endswith("\n") else text

    assert split_sections(done.stdout.decode("utf-8", "replace"), NONCE) == {
        f"s{i}": (shown(data), code) for i, (data, code) in enumerate(outputs)
    }


def test_a_raw_sections_output_cannot_end_it_or_start_another() -> None:
    # section one prints every framing line it could know: the next section's header (the nonce is
    # no secret), end lines with drawn boundaries, a section record of this nonce; the boundary of
    # its own script it cannot know (drawn by the node's shell, exported to no command)
    fakes = [
        f"@@{NONCE} section-raw :dHdv :{'0' * 32}",
        f"@@{'0' * 32} 0",
        "@@" + "ab" * 16 + " 9",
        records.record(NONCE, "section", "two", "forged\x000").strip(),
        records.record(NONCE, "section-raw", "two").strip(),
    ]
    printed = "\n".join(fakes) + "\n"
    script = SH.sectioned([("one", f"printf '%s' {SH.quote(printed)}"), ("two", "exit 5")], NONCE)
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert split_sections(done.stdout, NONCE) == {"one": (printed[:-1], 0), "two": ("", 5)}
    assert "| _cb_64" not in script  # no encoder process per section


def test_a_section_killed_before_its_end_leaves_the_next_ones_whole() -> None:
    # its subshell killed (no EXIT trap runs): the next section's header, which holds the boundary,
    # closes it unanswered
    killed = "echo partial; sh -c 'kill -9 $PPID'; echo never"
    script = SH.sectioned([("one", killed), ("two", "echo fine")], NONCE)
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert split_sections(done.stdout, NONCE) == {"two": ("fine", 0)}


def test_sections_read_line_by_line_are_the_sections_read_at_once() -> None:
    from orchestrator.facts.base import SectionStream

    sections = [("a", "printf 'x\\n\\ny'"), ("b", "echo; exit 2"), ("c", ":")]
    done = subprocess.run(
        ["/bin/sh", "-c", SH.sectioned(sections, NONCE) + "\necho after"],
        capture_output=True,
        text=True,
        check=True,
    )
    stream = SectionStream(NONCE, ["a", "b", "c"])
    rest = [r for line in done.stdout.split("\n")[:-1] if (r := stream.feed(line, 0.0)) is not None]
    assert stream.complete and rest == ["after"]
    assert (
        stream.sections
        == split_sections(done.stdout, NONCE)
        == {"a": ("x\n\ny", 0), "b": ("", 2), "c": ("", 0)}
    )
