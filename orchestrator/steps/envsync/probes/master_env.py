# Runs under the master's Python (any 3.8+, standard library only): prints one JSON line describing
# its training environment, for `bootstrap sync --from-master` and `bootstrap sync --freeze`:
# torch (version, CUDA/ROCm build read from torch/version.py without importing torch), the roots
# present (torch, torchvision, torchaudio, numpy) and every installed package those need,
# with its version. "portable" lists the packages reached through requirements that hold on every
# platform (no sys_platform / platform_system / platform_machine / os_name marker): what a node of
# another OS gets pinned too (CUDA runtime wheels, triton: Linux only).
import json
import re
import sys

try:
    from importlib import metadata
except ImportError:  # Python < 3.8
    metadata = None

ROOTS = ("torch", "torchvision", "torchaudio", "numpy")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_PLATFORM = re.compile(r"\b(sys_platform|platform_system|platform_machine|os_name|platform_release)\b")
_EXTRA = re.compile(r"\bextra\s*==")


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed():
    """canonical name -> distribution; the first one on sys.path wins (as import does)."""
    out = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and canonical(name) not in out:
            out[canonical(name)] = dist
    return out


def edges(dist):
    """(requirement's canonical name, whether it holds on every platform) for each requirement
    that is not an extra's."""
    out = []
    for line in dist.requires or []:
        requirement, _, marker = line.partition(";")
        if _EXTRA.search(marker):
            continue
        match = _NAME.match(requirement)
        if match:
            out.append((canonical(match.group(1)), not _PLATFORM.search(marker)))
    return out


def closure(dists, roots, portable_only):
    seen = []
    todo = [r for r in roots if r in dists]
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.append(name)
        for child, everywhere in edges(dists[name]):
            if child in dists and child not in seen and (everywhere or not portable_only):
                todo.append(child)
    return sorted(seen)


def torch_build(dist):
    """torch.version's cuda/hip, read from torch/version.py (importing torch costs seconds)."""
    info = {"cuda": None, "hip": None}
    try:
        path = dist.locate_file("torch/version.py")
        scope = {}
        with open(str(path)) as fh:
            exec(compile(fh.read(), str(path), "exec"), scope)
        info["cuda"] = scope.get("cuda")
        info["hip"] = scope.get("hip")
    except Exception as exc:  # an unusual layout: the local version label still tells CPU/CUDA
        info["error"] = str(exc)
    return info


def main():
    out = {
        "python": "%d.%d.%d" % sys.version_info[:3],
        "executable": sys.executable,
        "platform": sys.platform,
        "packages": {},
        "roots": [],
        "all": [],
        "portable": [],
        "torch": None,
    }
    if metadata is None:
        out["error"] = "Python %s has no importlib.metadata (3.8+ needed)" % out["python"]
        sys.stdout.write(json.dumps(out) + "\n")
        return
    dists = installed()
    out["roots"] = [r for r in ROOTS if r in dists]
    out["all"] = closure(dists, out["roots"], False)
    out["portable"] = closure(dists, out["roots"], True)
    for name in out["all"]:
        out["packages"][name] = dists[name].version
    if "torch" in dists:
        out["torch"] = dict(torch_build(dists["torch"]), version=dists["torch"].version)
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":  # python -c runs it as __main__; tests import the helpers
    main()
