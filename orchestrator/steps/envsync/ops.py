"""The OS-specific part of an environment sync: the exact commands a node runs.

Everything else (deciding, comparing, the wheelhouse) is the same for every OS. A strategy turns a
:class:`BuildPlan` into one script in the node's shell, with every value quoted by the platform.

Layout on a node (Linux; ``P`` = ``env.path``)::

    P                  symlink -> P.versions/<id>   (the stable path: launch runs P/bin/python)
    P.versions/<id>/   one complete venv per build (the active one and the previous one are kept)
    P.wheels/          offline mode: the wheels pushed by the controller

Index locations (which may hold a login) reach the installer through its environment: an owner-only
file ``P.versions/<id>.index.env`` (``NAME=VALUE`` lines, uploaded before the build) that the build
script reads into its environment and deletes before the installer starts. Nothing secret is ever in
the script or the installer's command line, which every user of the node can read (``ps``).

Why a symlink switch and not ``mv venv.new venv``: a venv is not relocatable: pip writes the venv's
absolute path into every console script (``bin/torchrun``'s shebang), so a renamed venv has broken
scripts. Each build lives at its final path; the switch is an atomic rename of a symlink.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING

from orchestrator.platforms import PosixShell
from orchestrator.platforms.powershell import PowerShell
from orchestrator.records import PYTHON_ENCODER, new_nonce
from orchestrator.steps.envsync.spec import STAMP_NAME

if TYPE_CHECKING:
    from orchestrator.platforms import Platform

#: the kinds of the records a build prints (orchestrator/records.py), with the build's nonce: what
#: it does next (one field: a few words for the progress display), and what it installed (one field:
#: the JSON listing). Nothing else a build prints (the installer's lines) can be taken for them.
STEP_RECORD = "step"
INSTALLED_RECORD = "installed"

# What is installed (canonical name -> version): the probe lists an unchanged venv with the same code.
_LIST_BODY = (
    "import json, re, sys\n"
    "from importlib import metadata\n"
    "out = {}\n"
    "for d in metadata.distributions():\n"
    "    name = d.metadata['Name']\n"
    "    if name:\n"
    "        out[re.sub(r'[-_.]+', '-', name).lower()] = d.version\n"
)
_LISTING = "json.dumps({'packages': out, 'python': '%d.%d.%d' % sys.version_info[:3]})"
LIST_CODE = _LIST_BODY + f"print({_LISTING})\n"
#: run by the new venv's interpreter after a build (argument: the build's nonce): the listing as the
#: ``installed`` record, written by the records encoder itself (no shell between it and the output)
LIST_RECORD_CODE = (
    "import base64\n"
    + PYTHON_ENCODER
    + _LIST_BODY
    + f"sys.stdout.write(record(sys.argv[1], {INSTALLED_RECORD!r}, {_LISTING}))\n"
)

# A cloned venv still names the old directory in its console scripts' shebangs, activate scripts and
# pyvenv.cfg: point them at the new one. Files are replaced (new inode), never edited in place: the
# clone shares every other file with the previous build through hard links.
REBASE_CODE = (
    "import os, sys\n"
    "old, new = sys.argv[1].encode(), sys.argv[2].encode()\n"
    "paths = [os.path.join(sys.argv[2], 'pyvenv.cfg')]\n"
    "bindir = os.path.join(sys.argv[2], 'bin')\n"
    "paths += [os.path.join(bindir, n) for n in os.listdir(bindir)]\n"
    "for p in paths:\n"
    "    if os.path.islink(p) or not os.path.isfile(p):\n"
    "        continue\n"
    "    with open(p, 'rb') as fh:\n"
    "        data = fh.read()\n"
    "    if old not in data:\n"
    "        continue\n"
    "    tmp = p + '.cb-tmp'\n"
    "    with open(tmp, 'wb') as fh:\n"
    "        fh.write(data.replace(old, new))\n"
    "    os.chmod(tmp, os.stat(p).st_mode & 0o7777)\n"
    "    os.replace(tmp, p)\n"
)


def probe_code() -> str:
    """The environment probe as a node runs it: with ``unsafe_path`` before it."""
    from orchestrator.steps.preflight.shared_fs import safe_path_source

    return (
        safe_path_source()
        + resources.files("orchestrator.steps.envsync.probes").joinpath("env_probe.py").read_text()
    )


@dataclass(frozen=True)
class BuildPlan:
    """One node's build, decided on the controller."""

    interpreter: str  # the node's Python, which creates the venv
    path: str  # the stable path (as the inventory says it: "~/" allowed)
    build_id: str
    clone: bool  # start from a hard-link copy of the active build (only changed packages move)
    installer: str  # "pip" | "uv"
    uv: str | None  # uv's path on the node
    # options without a location from the inventory: --no-index / --no-index --find-links <wheelhouse>
    index_args: tuple[str, ...]
    require_hashes: bool
    stamp: dict[str, object]
    #: byte-compile while installing; else pip gets --no-compile (uv compiles nothing unless asked)
    compile_bytecode: bool = False
    offline: bool = False  # installs from the node's wheelhouse, which the controller fills
    # how pip reaches the venv (made --without-pip: ensurepip costs seconds per venv): "base" (the
    # node's own pip, --python), "wheel" (pip_wheel, run from the wheel), "venv" (ensurepip after all)
    pip_runner: str = "venv"
    pip_wheel: str | None = None
    #: pip's --progress-bar: "raw" (pip 24.1+: byte counts while downloading) or "off"
    progress_bar: str = "off"
    remove_wheels: tuple[str, ...] = ()  # offline: wheels in the node's wheelhouse no longer wanted
    #: the installer's index variables (spec.index_environment): uploaded in ``index_env_file``
    index_env: tuple[tuple[str, str], ...] = ()
    #: the nonce of the records the build prints (its steps, its listing)
    nonce: str = field(default_factory=new_nonce)

    @property
    def compile_args(self) -> list[str]:
        """Both installers compile the same: only when asked (byte-compiling every module of a torch
        environment takes longer than unpacking it; Python compiles what it imports, once)."""
        if self.installer == "uv":
            return ["--compile-bytecode"] if self.compile_bytecode else []
        return [] if self.compile_bytecode else ["--no-compile"]

    @property
    def versions_dir(self) -> str:
        return self.path.rstrip("/\\") + ".versions"

    @property
    def wheelhouse(self) -> str:
        return self.path.rstrip("/\\") + ".wheels"

    @property
    def requirements_file(self) -> str:
        return f"{self.versions_dir}/{self.build_id}.requirements.txt"

    @property
    def index_env_file(self) -> str | None:
        """Where the build script finds ``index_env`` (None: no variables, no file)."""
        return f"{self.versions_dir}/{self.build_id}.index.env" if self.index_env else None


class EnvOps(ABC):
    """What one OS needs: the probe invocation, the venv's interpreter path, the build script."""

    #: a new build may start as a hard-link copy of the active one (only changed packages move)
    supports_clone = True
    #: the build script needs the node's absolute paths (no "~" expansion available)
    absolute_paths = False

    def __init__(self, platform: Platform) -> None:
        self.platform = platform

    @abstractmethod
    def probe(self, interpreter: str, args: dict[str, object], code: str | None = None) -> str:
        """Shell text running the probe under ``interpreter`` (one JSON line on stdout); ``code``
        replaces the probe's text (--dry-run names it instead of repeating it for every node)."""

    @abstractmethod
    def venv_python(self, path: str) -> str:
        """The interpreter inside the venv at ``path`` (what launch runs)."""

    @abstractmethod
    def build(self, plan: BuildPlan) -> str:
        """Shell text that builds, stamps and switches to a new environment, then lists it."""

    @abstractmethod
    def prepare(self, plan: BuildPlan) -> str:
        """Shell text creating the directories the uploads of a build go to."""


class PosixEnvOps(EnvOps):
    """Linux nodes (and WSL distributions: their platform is a POSIX shell too)."""

    platform: PosixShell

    def probe(self, interpreter: str, args: dict[str, object], code: str | None = None) -> str:
        text = probe_code() if code is None else code
        return self.platform.join([interpreter, "-c", text, json.dumps(args, sort_keys=True)])

    def venv_python(self, path: str) -> str:
        return f"{path.rstrip('/')}/bin/python"

    def prepare(self, plan: BuildPlan) -> str:
        """The build's directories walked, made, then walked again: a link another user planted
        where a parent should be is refused before ``mkdir -p`` follows it, and a directory another
        user made meanwhile (after the probe's walk, which ends where the path does not exist yet)
        before anything goes into it (exit UNSAFE_DIR_EXIT). A directory that passed stays ours: only
        root or we can change it, and no one else can rename it out of a sticky one."""
        p = self.platform
        dirs = [plan.versions_dir] + ([plan.wheelhouse] if plan.offline else [])
        walked = p.check_paths([plan.path, *dirs])
        made = p.no_group_write("\n".join(p.mkdir(d) for d in dirs))
        return "\n".join([walked, made, walked])

    def install_command(self, plan: BuildPlan) -> str:
        """The installer invocation (``$new`` and ``$req`` are set by the build script)."""
        q = self.platform.quote
        opts = [q(a) for a in plan.index_args]
        if plan.require_hashes:
            opts.append("--require-hashes")
        opts += plan.compile_args
        if plan.installer == "uv":
            assert plan.uv is not None
            return " ".join([q(plan.uv), "pip", "install", '--python "$new/bin/python"', *opts, '-r "$req"'])
        flags = f"install --disable-pip-version-check --no-input --progress-bar {q(plan.progress_bar)}"
        if plan.pip_runner == "base":
            pip = f'{q(plan.interpreter)} -m pip --python "$new/bin/python" {flags}'
        elif plan.pip_runner == "wheel":
            assert plan.pip_wheel is not None
            pip = f'"$new/bin/python" {q(plan.pip_wheel + "/pip")} {flags}'
        else:
            pip = f'"$new/bin/python" -m pip {flags}'
        return " ".join([pip, *opts, '-r "$req"'])

    def build(self, plan: BuildPlan) -> str:
        p = self.platform
        word = p.path_word
        stamp = json.dumps(plan.stamp, sort_keys=True)
        lines = [
            "set -u",
            # walked again: what the build reads (the active environment it may copy) and deletes
            # (older builds) is below these, so none may be another user's
            p.check_paths([plan.path, plan.versions_dir]),
            p.record_functions(plan.nonce),
            f"link={word(plan.path)}",
            f"versions={word(plan.versions_dir)}",
            f"new={word(plan.versions_dir + '/' + plan.build_id)}",
            f"req={word(plan.requirements_file)}",
            'cur=""',
            '[ -L "$link" ] && cur=$(readlink "$link")',
            # what a failed install leaves: said by the node too (its line shows with -v)
            'kept="no environment was installed (a first install)"',
            '[ -n "$cur" ] && kept="the previous environment is still active"',
            # a failed build leaves nothing behind, and the active environment untouched
            'fail() { echo "cluster-bootstrap: $1" >&2; rm -rf "$new" "$req"; exit 1; }',
            'rm -rf "$new"',
        ]
        if plan.index_env_file:
            # the index locations (maybe with a login) into the environment, never onto a command line
            lines += [
                f"envf={word(plan.index_env_file)}",
                'while IFS= read -r cb_line; do export "$cb_line"; done < "$envf"; cb_read=$?; rm -f "$envf"',
                '[ "$cb_read" -eq 0 ] || fail "cannot read the index settings $envf"',
            ]
            if plan.installer == "pip":
                # PIP_EXTRA_INDEX_URL replaces the extra indexes the node's pip configuration names (a
                # lab's mirror): they are kept, after the spec's
                lines.append(
                    'if [ -n "${PIP_EXTRA_INDEX_URL:-}" ]; then cb_cfg=$(env -u PIP_EXTRA_INDEX_URL '
                    f"{p.quote(plan.interpreter)} -I -m pip config list 2>/dev/null"
                    " | sed -n \"s/^[^.:]*\\.extra-index-url='\\(.*\\)'\\$/\\1/p\" | tr '\\n' ' ');"
                    " cb_cfg=${cb_cfg% };"
                    ' [ -z "$cb_cfg" ] || export PIP_EXTRA_INDEX_URL="$PIP_EXTRA_INDEX_URL $cb_cfg"; fi'
                )
        step = self.step
        if plan.clone:
            lines += [
                step("copying the active environment"),
                'cp -a -l "$cur" "$new" 2>/dev/null || cp -a "$cur" "$new" || fail "cannot copy $cur"',
                f'{p.quote(plan.interpreter)} -c {p.quote(REBASE_CODE)} "$cur" "$new" '
                '|| fail "cannot rebase the copied environment"',
            ]
        else:
            without = "" if plan.installer == "pip" and plan.pip_runner == "venv" else " --without-pip"
            lines.append(step("creating the environment"))
            lines.append(
                f'{p.quote(plan.interpreter)} -m venv{without} "$new" '
                '|| fail "python -m venv failed (Debian/Ubuntu: install the python3-venv package)"'
            )
        lines.append(step("resolving packages"))
        lines.append(f'{self.install_command(plan)} || fail "{plan.installer} install failed: $kept"')
        lines += [
            step("switching to the new environment"),
            f'printf %s {p.quote(stamp)} > "$new"/{p.quote(STAMP_NAME)} || fail "cannot write the stamp"',
            # the switch: a new symlink renamed over the old one (atomic: launch sees old or new)
            'rm -f "$link.cb-new" && ln -s "$new" "$link.cb-new" && mv -T "$link.cb-new" "$link" '
            '|| fail "cannot switch $link to the new environment"',
            'mv -f "$req" "$new/requirements.txt" 2>/dev/null',
            # keep the active build and the previous one (jobs started from it keep working)
            'for d in "$versions"/*; do [ "$d" = "$new" ] || [ "$d" = "$cur" ] || rm -rf "$d"; done',
        ]
        if plan.remove_wheels:
            names = " ".join(p.quote(n) for n in plan.remove_wheels)
            lines.append(f"(cd {word(plan.wheelhouse)} && rm -f -- {names})")
        lines.append(step("listing the environment"))
        lines.append(f'"$link/bin/python" -c {p.quote(LIST_RECORD_CODE)} {p.quote(plan.nonce)}')
        return "\n".join(lines)

    def step(self, what: str) -> str:
        """The record telling the progress display what the build does next (progress.py)."""
        return f"_cb_rec {STEP_RECORD} {self.platform.quote(what)}"


class PowerShellEnvOps(EnvOps):
    """Native Windows nodes (Windows PowerShell 5.1 text; every program through ``native``).

    Differences from Linux, and why: the stable path is a directory **junction** (no administrator
    right needed, unlike a symbolic link), replaced by delete + create (a junction cannot be renamed
    over another; the gap is a few milliseconds). Builds are always fresh: a venv's ``Scripts/*.exe``
    launchers embed the interpreter path inside the executable, which a clone could not rebase
    safely. ``native`` passes literal arguments only, so paths arrive absolute (the probe reported
    them: ``BuildPlan.path`` is the node's absolute path here).
    """

    platform: PowerShell
    supports_clone = False
    absolute_paths = True

    def probe(self, interpreter: str, args: dict[str, object], code: str | None = None) -> str:
        text = probe_code() if code is None else code
        return self.platform.native([interpreter, "-c", text, json.dumps(args, sort_keys=True)])

    def venv_python(self, path: str) -> str:
        return path.rstrip("/\\") + "\\Scripts\\python.exe"

    def prepare(self, plan: BuildPlan) -> str:
        dirs = [plan.versions_dir] + ([plan.wheelhouse] if plan.offline else [])
        return "\n".join(self.platform.mkdir(d) for d in dirs)

    def _load_env(self, plan: BuildPlan) -> list[str]:
        """The index variables into this process's environment (the installer inherits it), the
        file deleted at once; nothing secret is in the script itself."""
        if not plan.index_env_file:
            return []
        q = self.platform.quote
        return [
            f"$cbEnvFile = {q(plan.index_env_file.replace('/', chr(92)))}",
            "try {",
            "  foreach ($cbLine in [System.IO.File]::ReadAllLines($cbEnvFile)) {",
            "    $cbAt = $cbLine.IndexOf('=')",
            "    if ($cbAt -gt 0) { [Environment]::SetEnvironmentVariable($cbLine.Substring(0, $cbAt), "
            "$cbLine.Substring($cbAt + 1), 'Process') }",
            "  }",
            "} catch { cbFail ('cannot read the index settings ' + $cbEnvFile) }",
            "finally { Remove-Item -LiteralPath $cbEnvFile -Force -ErrorAction SilentlyContinue }",
        ]

    def step(self, what: str) -> str:
        """The record telling the progress display what the build does next (progress.py)."""
        return f"Out-CbRecord {STEP_RECORD} @({self.platform.quote(what)})"

    def _check(self, why: str) -> str:
        return f"if ($global:LASTEXITCODE -ne 0) {{ cbFail {self.platform.quote(why)} }}"

    def build(self, plan: BuildPlan) -> str:
        p = self.platform
        q = p.quote
        new = f"{plan.versions_dir}\\{plan.build_id}".replace("/", "\\")
        new_python = self.venv_python(new)
        requirements = plan.requirements_file.replace("/", "\\")
        args = list(plan.index_args) + (["--require-hashes"] if plan.require_hashes else [])
        args += plan.compile_args
        if plan.installer == "uv":
            assert plan.uv is not None
            install = p.native([plan.uv, "pip", "install", "--python", new_python, *args, "-r", requirements])
        else:
            pip = [
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--progress-bar",
                plan.progress_bar,
            ]
            if plan.pip_runner == "base":
                argv = [plan.interpreter, "-m", "pip", "--python", new_python, *pip]
            elif plan.pip_runner == "wheel" and plan.pip_wheel:
                argv = [new_python, plan.pip_wheel + "\\pip", *pip]
            else:
                argv = [new_python, "-m", "pip", *pip]
            install = p.native([*argv, *args, "-r", requirements])
        without = [] if plan.installer == "pip" and plan.pip_runner == "venv" else ["--without-pip"]
        stamp = json.dumps(plan.stamp, sort_keys=True)
        lines = [
            p.record_functions(plan.nonce),
            f"$cbLink = {p.path_word(plan.path)}",
            f"$cbVersions = {p.path_word(plan.versions_dir)}",
            f"$cbNew = {q(new)}",
            f"$cbReq = {q(requirements)}",
            "$cbCur = $null",
            "$cbItem = Get-Item -LiteralPath $cbLink -Force -ErrorAction SilentlyContinue",
            "if ($null -ne $cbItem -and $cbItem.LinkType -eq 'Junction') { $cbCur = @($cbItem.Target)[0] }",
            "$cbKept = 'no environment was installed (a first install)'",
            "if ($null -ne $cbCur) { $cbKept = 'the previous environment is still active' }",
            # a failed build leaves nothing behind, and the active environment untouched
            "function cbFail($why) {",
            "  if (Test-Path -LiteralPath $cbNew) { Remove-Item -LiteralPath $cbNew -Recurse -Force }",
            "  Remove-Item -LiteralPath $cbReq -Force -ErrorAction SilentlyContinue",
            "  [Console]::Error.WriteLine('cluster-bootstrap: ' + $why)",
            "  exit 1",
            "}",
            "if (Test-Path -LiteralPath $cbNew) { Remove-Item -LiteralPath $cbNew -Recurse -Force }",
            *self._load_env(plan),
            self.step("creating the environment"),
            p.native([plan.interpreter, "-m", "venv", *without, new]),
            self._check("python -m venv failed"),
            self.step("resolving packages"),
            install,
            "if ($global:LASTEXITCODE -ne 0) { cbFail ("
            + q(f"{plan.installer} install failed: ")
            + " + $cbKept) }",
            self.step("switching to the new environment"),
            f"[System.IO.File]::WriteAllText($cbNew + {q(chr(92) + STAMP_NAME)}, {q(stamp)})",
            # the switch: the junction is replaced (only the link: Directory.Delete leaves its target)
            "if ($null -ne $cbItem) { [System.IO.Directory]::Delete($cbLink) }",
            "New-Item -ItemType Junction -Path $cbLink -Target $cbNew | Out-Null",
            "Move-Item -LiteralPath $cbReq -Destination ($cbNew + '\\requirements.txt') -Force",
            # keep the active build and the previous one (jobs started from it keep working)
            "Get-ChildItem -LiteralPath $cbVersions -Directory | Where-Object {",
            "  $_.FullName -ne $cbNew -and $_.FullName -ne $cbCur",
            "} | Remove-Item -Recurse -Force",
        ]
        for name in plan.remove_wheels:
            wheel = f"{plan.wheelhouse}\\{name}".replace("/", "\\")
            lines.append(f"Remove-Item -LiteralPath {q(wheel)} -Force -ErrorAction SilentlyContinue")
        lines += [
            self.step("listing the environment"),
            p.native([self.venv_python(plan.path), "-c", LIST_RECORD_CODE, plan.nonce]),
        ]
        return "\n".join(lines)


def ops_for(platform: Platform) -> EnvOps:
    """The strategy for a node's platform (WSL distributions speak POSIX sh: the Linux one)."""
    if (sh := platform.as_posix()) is not None:
        return PosixEnvOps(sh)
    if (ps := platform.as_powershell()) is not None:
        return PowerShellEnvOps(ps)
    raise NotImplementedError(f"environment sync on {platform.name} nodes is not supported yet")
