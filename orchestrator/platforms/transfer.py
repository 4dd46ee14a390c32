"""File transfer through a command's stdin and stdout, in each dialect.

Used wherever no file-transfer protocol is available: WinRM (there is none), WSL distributions
behind WinRM, and SSH servers without an sftp subsystem (hardened hosts; Ansible falls back the
same way). The transport runs the script with :meth:`Platform.login_command` and speaks this
protocol; the text of the scripts lives here, the transport never writes any.

Upload (``upload_script``): stdin carries the file as base64 text, one line per chunk (any length;
an empty file is no line at all). The script writes it to a temporary name beside the target,
hashes what it wrote, and only when the SHA-256 equals the one the script was given renames it
into place and prints::

    sha256 HEX
    path FULL-PATH

A mismatch removes the temporary file, prints ``sha256 mismatch: received X, sent Y`` on stderr and
exits 3: the target is never replaced by bytes that differ from the sender's.

Download (``download_script``): stdout is ``size N``, then ``data BASE64`` lines (one per chunk of
at most ``chunk`` bytes), then ``sha256 HEX`` of the bytes read. A missing or unreadable file exits
non-zero with the reason on stderr.

Relative paths are relative to the user's home (POSIX) or profile directory (Windows), as over SFTP.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.platforms.base import Platform

#: raw bytes per ``data`` line of a download: 48 KiB -> 64 KiB of base64 per line
GET_CHUNK = 48 * 1024
#: what the temporary file of an upload is called: the target's name plus this
PART_SUFFIX = ".bootstrap-part"


# -- PowerShell --------------------------------------------------------------------------------------
# Values reach the scripts only through the platform's quote(); the receiving script reads stdin
# through $input, which powershell.exe fills from the command's stdin (the WinRS stdin stream).

_RESOLVE = "$target = $ExecutionContext.SessionState.Path.GetUnresolvedProviderPathFromPSPath({path})"
_TEMP_TARGET = "$target = Join-Path ([IO.Path]::GetTempPath()) {name}"
_PUT_SCRIPT = """\
$ErrorActionPreference = 'Stop'
$ProgressPreference = 'SilentlyContinue'
{target}
$expected = {expected}
$directory = [IO.Path]::GetDirectoryName($target)
if ($directory) {{ [void][IO.Directory]::CreateDirectory($directory) }}
$part = $target + {suffix}
$sha = [Security.Cryptography.SHA256]::Create()
$file = [IO.File]::Open($part, [IO.FileMode]::Create, [IO.FileAccess]::Write)
try {{
    foreach ($line in $input) {{
        if (-not $line) {{ continue }}
        $bytes = [Convert]::FromBase64String($line)
        $file.Write($bytes, 0, $bytes.Length)
        [void]$sha.TransformBlock($bytes, 0, $bytes.Length, $bytes, 0)
    }}
    [void]$sha.TransformFinalBlock((New-Object byte[] 0), 0, 0)
}} finally {{
    $file.Dispose()
}}
$actual = -join ($sha.Hash | ForEach-Object {{ $_.ToString('x2') }})
if ($actual -ne $expected) {{
    Remove-Item -LiteralPath $part -Force
    [Console]::Error.WriteLine('sha256 mismatch: received ' + $actual + ', sent ' + $expected)
    exit 3
}}
Move-Item -LiteralPath $part -Destination $target -Force
[Console]::Out.WriteLine('sha256 ' + $actual)
[Console]::Out.WriteLine('path ' + $target)
"""
_GET_SCRIPT = """\
$ErrorActionPreference = 'Stop'
$ProgressPreference = 'SilentlyContinue'
{target}
$sha = [Security.Cryptography.SHA256]::Create()
$file = [IO.File]::OpenRead($target)
try {{
    [Console]::Out.WriteLine('size ' + $file.Length)
    $buffer = New-Object byte[] {chunk}
    while (($count = $file.Read($buffer, 0, $buffer.Length)) -gt 0) {{
        [void]$sha.TransformBlock($buffer, 0, $count, $buffer, 0)
        [Console]::Out.WriteLine('data ' + [Convert]::ToBase64String($buffer, 0, $count))
    }}
    [void]$sha.TransformFinalBlock($buffer, 0, 0)
}} finally {{
    $file.Dispose()
}}
[Console]::Out.WriteLine('sha256 ' + (-join ($sha.Hash | ForEach-Object {{ $_.ToString('x2') }})))
"""
_REMOVE_SCRIPT = "Remove-Item -LiteralPath {path} -Force -ErrorAction SilentlyContinue\n"


def put_script(platform: Platform, remote: str | None, expected_sha256: str, *, suffix: str = ".tmp") -> str:
    """PowerShell that writes its stdin (base64 lines) to ``remote`` (a Windows path; None: a new
    file named ``bootstrap-RANDOM{suffix}`` in the temp directory) through a temporary name, checks
    the SHA-256 and prints ``sha256 HEX`` and ``path P``."""
    if remote is None:
        target = _TEMP_TARGET.format(name=platform.quote(f"bootstrap-{uuid.uuid4().hex}{suffix}"))
    else:
        target = _RESOLVE.format(path=platform.quote(remote))
    return _PUT_SCRIPT.format(
        target=target, expected=platform.quote(expected_sha256), suffix=platform.quote(PART_SUFFIX)
    )


def get_script(platform: Platform, remote: str, chunk: int = GET_CHUNK) -> str:
    """PowerShell printing ``size N``, then ``data BASE64`` lines, then ``sha256 HEX`` for ``remote``."""
    return _GET_SCRIPT.format(target=_RESOLVE.format(path=platform.quote(remote)), chunk=int(chunk))


def remove_script(platform: Platform, remote: str) -> str:
    """PowerShell deleting the file ``remote`` (no error when it is gone already)."""
    return _REMOVE_SCRIPT.format(path=platform.quote(remote))


# -- POSIX sh (GNU coreutils: base64, sha256sum) -------------------------------------------------------
# The temporary name carries the shell's pid: two uploads to one target (nodes sharing an NFS home)
# never write into each other's file. It is removed on every way out but the rename.

_POSIX_PUT = """\
set -e
cd
target={target}
expected={expected}
mkdir -p -- "$(dirname -- "$target")"
{umask}part="$target{suffix}.$$"
trap 'rm -f -- "$part"' EXIT
trap 'exit 1' HUP INT TERM PIPE
tr -d '\\r' | base64 -d > "$part"
actual=$(sha256sum < "$part" | cut -d ' ' -f 1)
if [ "$actual" != "$expected" ]; then
  echo "sha256 mismatch: received $actual, sent $expected" >&2
  exit 3
fi
{chmod}mv -f -- "$part" "$target"
echo "sha256 $actual"
echo "path $target"
"""
_POSIX_GET = """\
set -e
cd
source={source}
if [ ! -f "$source" ] || [ ! -r "$source" ]; then
  echo "cannot read $source: no such file or not readable" >&2
  exit 1
fi
echo "size $(wc -c < "$source" | tr -d ' ')"
base64 -w {width} < "$source" | sed 's/^/data /'
echo "sha256 $(sha256sum < "$source" | cut -d ' ' -f 1)"
"""
#: mode None: an existing target keeps its permission bits (as SFTP's open for writing does)
_KEEP_MODE = 'if [ -f "$target" ]; then chmod --reference="$target" -- "$part" 2>/dev/null || :; fi\n'


def posix_put_script(
    platform: Platform, remote: str, expected_sha256: str, *, mode: int | None = None
) -> str:
    """sh writing its stdin (base64 lines) to ``remote`` through a temporary name in the same
    directory, SHA-256 checked. With ``mode`` (e.g. 0o600) the content is written under umask 077
    (never readable by others, not even while it arrives) and the file gets ``mode`` before the
    rename; without, it gets the node's umask, or an existing target's bits. Directories it creates
    get the node's umask, as over SFTP."""
    return _POSIX_PUT.format(
        umask="umask 077\n" if mode is not None else "",
        target=platform.path_word(remote),
        expected=platform.quote(expected_sha256),
        suffix=PART_SUFFIX,
        chmod=f'chmod {mode:o} -- "$part"\n' if mode is not None else _KEEP_MODE,
    )


def posix_get_script(platform: Platform, remote: str, chunk: int = GET_CHUNK) -> str:
    """sh printing ``size N``, ``data BASE64`` lines of at most ``chunk`` bytes, ``sha256 HEX``."""
    return _POSIX_GET.format(source=platform.path_word(remote), width=(int(chunk) // 3) * 4)


def posix_remove_script(platform: Platform, remote: str) -> str:
    """sh deleting the file ``remote`` (no error when it is gone already)."""
    return f"rm -f -- {platform.path_word(remote)}"
