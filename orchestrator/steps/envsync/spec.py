"""What environment a node gets, decided on the controller from the inventory alone (pure logic).

``cluster.env`` plus the per-OS override become one :class:`EnvSpec` per OS: the exact requirement
text pushed to the nodes, the index options, the installer setting. :func:`stamp_key` turns a spec
plus what a node reports (Python version, platform) into the key written in the venv's stamp: an
unchanged key means an unchanged environment, so the node is skipped after one round trip.

Package locations (``index_url``, ``extra_index_urls``, ``find_links``) may carry a login
(``https://user:token@host/simple``). They never go on a command line, where every user of the node
sees them (``ps``): :func:`index_environment` turns them into the variables the installer reads
(``PIP_INDEX_URL``, ``UV_INDEX_URL``...), and :func:`index_flags` gives the options left, which hold
no location. Wherever a location is shown, its login is masked (:mod:`orchestrator.redact`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UsageError
from orchestrator.redact import mask_url_credentials, strip_url_credentials
from orchestrator.runs.layout import in_workdir, node_path

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.inventory.settings import EnvSettings

#: bump when the layout or the install commands change: every node then rebuilds once
FORMAT = 1
#: the stamp file inside each built environment
STAMP_NAME = ".cluster-bootstrap-env.json"

_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_PIN_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*===?\s*([^\s;,]+)\s*(;.*)?$")
# options pip accepts inside a requirements file that pull in other files: those would not reach the node
_INCLUDES = ("-r", "--requirement", "-c", "--constraint", "-e", "--editable")


def canonical_name(name: str) -> str:
    """PEP 503 normalised distribution name (``Foo_Bar`` and ``foo-bar`` are one package)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Requirement:
    line: str  # the logical line, without its --hash options
    name: str | None  # canonical name; None for URLs/paths
    pinned: str | None  # the version after == / ===


@dataclass(frozen=True)
class EnvSpec:
    """The environment nodes of one OS get."""

    os: str
    source: str  # where the requirements come from, for messages
    requirements_text: str  # the file pushed to the node, as the installer reads it
    requirements: tuple[Requirement, ...]
    hashes: bool  # the file pins hashes: install with --require-hashes
    python_wanted: str | None
    index_url: str | None
    extra_index_urls: tuple[str, ...]
    find_links: tuple[str, ...]
    no_index: bool
    offline: bool
    installer: str  # auto | uv | pip
    path_setting: str | None
    compile_bytecode: bool = False  # byte-compile while installing (env.compile_bytecode)
    base_dir: str = "."  # the inventory file's directory: relative controller paths start there
    warnings: tuple[str, ...] = ()
    #: a node that reaches no index installs from wheels this machine pushes (``--from-master``: the
    #: user asked for no package source of their own); else such a node fails before installing
    offline_fallback: bool = False

    @property
    def names(self) -> frozenset[str]:
        return frozenset(r.name for r in self.requirements if r.name)

    @property
    def pins(self) -> dict[str, str]:
        return {r.name: r.pinned for r in self.requirements if r.name and r.pinned}

    @property
    def digest(self) -> str:
        """Hash of everything in the spec that changes what gets installed (not the path). Logins in
        URLs are left out: a new token changes nothing installed, and the stamp (readable on the
        node) must not allow guessing a password from its hash."""
        material = {
            "requirements": self.requirements_text,
            "index_url": None if self.index_url is None else mask_url_credentials(self.index_url),
            "extra_index_urls": [mask_url_credentials(u) for u in self.extra_index_urls],
            "find_links": [mask_url_credentials(u) for u in self.find_links],
            "no_index": self.no_index,
            "offline": self.offline,
            "installer": self.installer,
        }
        if self.compile_bytecode:  # only when set: environments built before the setting keep their key
            material["compile_bytecode"] = True
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def stamp_key(spec: EnvSpec, *, python_version: str, platform: str) -> str:
    """The key an environment built from ``spec`` for this interpreter/platform carries."""
    material = {"format": FORMAT, "spec": spec.digest, "python": python_version, "platform": platform}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


#: pip's index when nothing names another one
PYPI_SIMPLE = "https://pypi.org/simple/"
_INDEX_OPTIONS = {"-i": "index", "--index-url": "index", "--extra-index-url": "extra"}


def index_locations(spec: EnvSpec) -> tuple[list[str], bool]:
    """(the index URLs a node's installer will fetch from, without their logins; whether the node's
    own pip configuration picks the main index): what a node must reach before it installs. Empty in
    offline mode and with ``no_index`` (the node reads only its wheelhouse or find-links)."""
    if spec.offline or spec.no_index:
        return [], False
    main: str | None = spec.index_url
    extras = list(spec.extra_index_urls)
    for line in logical_lines(spec.requirements_text):
        words = line.split()
        if words[0].startswith("--") and "=" in words[0]:  # --index-url=URL
            words = [*words[0].split("=", 1), *words[1:]]
        kind = _INDEX_OPTIONS.get(words[0]) if len(words) > 1 else None
        if kind == "index":
            main = words[1]
        elif kind == "extra":
            extras.append(words[1])
        elif words[0] == "--no-index":
            return [], False
    urls = ([main] if main else []) + extras
    return [strip_url_credentials(u) for u in dict.fromkeys(urls)], main is None


def logical_lines(text: str) -> list[str]:
    """Requirement-file lines with comments dropped and ``\\`` continuations joined (pip's rules)."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = "" if raw.lstrip().startswith("#") else re.sub(r"(^|\s)#.*$", "", raw)
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            out.append(full)
    if pending.strip():
        out.append(pending.strip())
    return out


def parse_requirements(text: str, source: str) -> tuple[tuple[Requirement, ...], bool, list[str]]:
    """(requirements, has hashes, warnings); UsageError for what cannot work on a remote node."""
    reqs: list[Requirement] = []
    hashes = False
    warnings: list[str] = []
    for line in logical_lines(text):
        words = line.split()
        if words[0].split("=")[0] in _INCLUDES:
            raise UsageError(
                f"{source}: '{words[0]}' pulls in another file, which would not reach the nodes",
                hint="flatten it into one file (pip-compile / uv pip compile output has no includes)",
            )
        if line.startswith("-"):
            continue  # --index-url and friends inside the file: the installer reads them itself
        if "--hash" in line:
            hashes = True
        requirement = " ".join(w for w in words if not w.startswith("--hash"))
        pin = _PIN_RE.match(requirement)
        if pin and "*" not in pin.group(3):
            reqs.append(Requirement(requirement, canonical_name(pin.group(1)), pin.group(3)))
            continue
        named = _NAME_RE.match(requirement)
        is_url = "://" in requirement or requirement.startswith((".", "/"))
        name = canonical_name(named.group(1)) if named and not is_url else None
        reqs.append(Requirement(requirement, name, None))
        warnings.append(
            f"{source}: '{mask_url_credentials(requirement)}' is not pinned with ==: nodes may resolve "
            "different versions "
            "(pin it, or use a lock file: pip-compile, uv pip compile)"
        )
    if not reqs:
        raise UsageError(f"{source}: no requirements in it", hint="list at least one package")
    return tuple(reqs), hashes, warnings


def resolve_spec(inventory: Inventory, os_name: str) -> EnvSpec:
    """The spec for nodes of ``os_name``; UsageError (exit 2) naming the inventory field when unusable."""
    env: EnvSettings = inventory.cluster.env
    if env.requirements is not None and env.packages:
        raise UsageError(
            f"{inventory.source}: cluster.env: give either requirements (a file) or packages (a list), "
            "not both"
        )
    override = env.linux if os_name == "linux" else env.windows if os_name == "windows" else None

    def pick(name: str) -> Any:
        value = getattr(override, name, None) if override is not None else None
        return getattr(env, name) if value is None else value

    requirements_path: str | None = pick("requirements")
    packages: tuple[str, ...] = pick("packages") or ()
    if override is not None and override.packages is not None:
        requirements_path = override.requirements  # an override list replaces a cluster-wide file
    if override is not None and override.requirements is not None:
        packages = ()
    if requirements_path:
        path = Path(requirements_path).expanduser()
        if not path.is_absolute():  # the inventory file's directory, shown resolved in messages
            path = Path(inventory.source).parent.absolute() / path
        own = override is not None and override.requirements is not None
        field_name = f"env.{os_name}.requirements" if own else "env.requirements"
        try:
            text = _read_requirements(path)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise UsageError(
                f"{inventory.source}: {field_name}: cannot read {path}: {why}",
                hint=f"a relative path is relative to the inventory file's directory "
                f"({Path(inventory.source).parent.absolute()}): copy {requirements_path} there too, "
                "or give an absolute path",
            ) from None
        source = str(path)
    elif packages:
        text = "".join(p + "\n" for p in packages)
        source = f"{inventory.source}: env.packages"
    else:
        raise UsageError(
            f"{inventory.source}: cluster.env declares no requirements or packages for {os_name} nodes",
            hint="add env.requirements: FILE or env.packages: [...] (see docs/sync.md)",
        )
    reqs, hashes, warnings = parse_requirements(text, source)
    _check_locations(inventory.source, os_name, override, env.installer, pick)
    return EnvSpec(
        os=os_name,
        source=source,
        requirements_text=text if text.endswith("\n") else text + "\n",
        requirements=reqs,
        hashes=hashes,
        python_wanted=env.python,
        index_url=pick("index_url"),
        extra_index_urls=tuple(pick("extra_index_urls") or ()),
        find_links=tuple(pick("find_links") or ()),
        no_index=bool(pick("no_index")),
        offline=env.offline,
        installer=env.installer,
        path_setting=env.path,
        compile_bytecode=env.compile_bytecode,
        base_dir=str(Path(inventory.source).parent),
        warnings=tuple(warnings),
    )


#: the variables each installer reads each location from (several extra index URLs: joined by a space
#: for both; several find-links: a space for pip, a comma for uv)
_LOCATION_VARIABLES = {
    "pip": {
        "index_url": "PIP_INDEX_URL",
        "extra_index_urls": "PIP_EXTRA_INDEX_URL",
        "find_links": "PIP_FIND_LINKS",
    },
    "uv": {
        "index_url": "UV_INDEX_URL",
        "extra_index_urls": "UV_EXTRA_INDEX_URL",
        "find_links": "UV_FIND_LINKS",
    },
}
_FIND_LINKS_SEPARATOR = {"pip": " ", "uv": ","}


def _check_locations(source: str, os_name: str, override: Any, installer: str, pick: Any) -> None:
    """Every location must survive the trip through an environment variable: one line, no space (pip
    splits lists at spaces), no comma in find_links unless pip installs (uv splits those at commas)."""
    for name in ("index_url", "extra_index_urls", "find_links"):
        value = pick(name)
        values = [value] if isinstance(value, str) else list(value or ())
        own = override is not None and getattr(override, name, None) is not None
        field_name = f"env.{os_name}.{name}" if own else f"env.{name}"
        for item in values:
            shown = mask_url_credentials(item)
            if any(c.isspace() or ord(c) < 32 for c in item):
                raise UsageError(
                    f"{source}: {field_name}: {shown!r} contains a space or a line break, which the "
                    "installer's environment variables cannot carry",
                    hint="percent-encode it in a URL (%20), or use a directory whose path has no space",
                )
            if name == "find_links" and installer != "pip" and _FIND_LINKS_SEPARATOR["uv"] in item:
                raise UsageError(
                    f"{source}: {field_name}: {shown!r} contains a comma, which uv reads as a separator",
                    hint="rename the directory, percent-encode it in a URL (%2C), or set env.installer: pip",
                )


def index_flags(spec: EnvSpec) -> list[str]:
    """The installer options about where packages come from that hold no location (and so no login):
    ``--no-index``. The locations themselves travel in :func:`index_environment`."""
    return ["--no-index"] if spec.no_index else []


def index_environment(spec: EnvSpec, installer: str) -> dict[str, str]:
    """The environment variables giving ``installer`` ("pip" or "uv") the spec's index URL, extra
    index URLs and find-links locations, exactly as it reads them (the only way they reach an
    installer: never its command line)."""
    names = _LOCATION_VARIABLES[installer]
    out: dict[str, str] = {}
    if spec.index_url and not spec.no_index:
        out[names["index_url"]] = spec.index_url
    if spec.extra_index_urls and not spec.no_index:
        out[names["extra_index_urls"]] = " ".join(spec.extra_index_urls)
    if spec.find_links:
        out[names["find_links"]] = _FIND_LINKS_SEPARATOR[installer].join(spec.find_links)
    if installer == "uv" and not spec.no_index and _names_extra_index(spec.requirements_text):
        # uv takes a package from the first index that has it at all ("first-index"); pip from any
        # index, best version first. A lock naming PyTorch's index beside PyPI (`sync --freeze`)
        # must resolve the same with both: numpy==2.4.6 may be on PyPI only.
        out["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    return out


def _names_extra_index(text: str) -> bool:
    return any(line.split()[0].startswith("--extra-index-url") for line in logical_lines(text))


def env_file_text(env: dict[str, str]) -> str:
    """``NAME=VALUE`` lines: how the variables of :func:`index_environment` reach a node, in an
    owner-only file the build script reads and deletes (values never hold a line break)."""
    return "".join(f"{name}={value}\n" for name, value in sorted(env.items()))


#: a lock of thousands of hashed pins is a few hundred kB; anything this large is not one
MAX_REQUIREMENTS_BYTES = 16 << 20


def _read_requirements(path: Path) -> str:
    """A requirements file's text: a regular file (not a FIFO or a device such as /dev/zero) of at
    most MAX_REQUIREMENTS_BYTES, UTF-8."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block the open
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = handle.read(MAX_REQUIREMENTS_BYTES + 1)
    if len(data) > MAX_REQUIREMENTS_BYTES:
        raise ValueError(f"larger than {MAX_REQUIREMENTS_BYTES >> 20} MiB: not a requirements file")
    return data.decode("utf-8")


def env_path(node: Node, spec: EnvSpec | None = None, path_setting: str | None = None) -> str:
    """Where the node's venv lives (the stable path launch uses): ``env.path`` (``{node}`` is
    replaced by the node's name: homes shared over NFS need one venv per node), else
    ``<workdir>/venv``."""
    setting = spec.path_setting if spec is not None else path_setting
    if setting:
        return node_path(setting, node.name)
    return in_workdir(node, "venv")


def python_matches(wanted: str | None, version: str) -> bool:
    """``3.11`` matches 3.11.x; ``3.11.4`` only itself."""
    if not wanted:
        return True
    return version == wanted or version.startswith(wanted + ".")


@dataclass
class Drift:
    """Pinned packages whose installed version differs (someone pip-installed by hand)."""

    wrong: dict[str, tuple[str | None, str]] = field(default_factory=dict)  # name -> (installed, pinned)


def same_version(installed: str, pinned: str) -> bool:
    """pip's ``==`` as far as a lock needs it: ``2.13.0`` matches ``2.13.0+cpu`` (a pin without a local
    label ignores it) and ``1.0`` matches ``1.0.0`` (trailing zeros)."""

    def norm(v: str) -> str:
        return re.sub(r"(\.0+)+$", "", v.strip().lower().lstrip("v"))

    if "+" not in pinned:
        installed = installed.split("+", 1)[0]
    return norm(installed) == norm(pinned)


def drift(spec: EnvSpec, installed: dict[str, str]) -> Drift:
    out = Drift()
    for name, version in spec.pins.items():
        have = installed.get(name)
        if have is None or not same_version(have, version):
            out.wrong[name] = (have, version)
    return out
