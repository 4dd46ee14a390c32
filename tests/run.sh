#!/usr/bin/env bash
# Set up and run the whole test suite on a Debian machine, as root (README command 2; .ci/run).
# Installs what the tests need: sshd, chrony, nftables, iproute2, sudo, a venv with the project.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(openssh-server openssh-client chrony nftables iproute2 sudo util-linux procps python3-venv libfaketime iptables ufw firewalld chromium chromium-driver
    slurmctld slurmd slurm-client munge)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    # The tests run their own sshd, chronyd, slurmd and firewall rules inside network namespaces; they
    # never use this machine's services. So what these packages would start here (firewalld: a host
    # firewall; sshd, slurmd, munge) is neither started (policy-rc.d: 101, "not allowed") nor enabled
    # for the next boot. chrony alone stays enabled: on Debian it replaces systemd-timesyncd, and this
    # machine keeps a time service (from its next boot).
    policy=/usr/sbin/policy-rc.d
    own_policy=
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && own_policy=1
        trap 'rm -f "$policy"' EXIT
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [ -n "$own_policy" ]; then
        rm -f "$policy"
        trap - EXIT
    fi
    for p in "${missing[@]}"; do
        [ "$p" = chrony ] && continue
        units=$(dpkg -L "$p" 2>/dev/null | grep -E '^(/usr)?/lib/systemd/system/[^/@]+\.(service|socket|timer)$' || true)
        for unit in $units; do
            deb-systemd-helper disable "${unit##*/}" >/dev/null 2>&1 || true
        done
    done
fi

venv=${BOOTSTRAP_TEST_VENV:-.venv-test}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# torch 2.13.0: the CPU build where pip finds one on this machine's disk (CI's wheel directory); from
# PyPI alone Linux gets the CUDA build (several GB): set PIP_EXTRA_INDEX_URL to PyTorch's /whl/cpu there
"$venv/bin/pip" install -q -e '.[test]' 'torch==2.13.0'

# While mypy checks on one core, one collection on the other writes the bytecode of the package and
# of the test modules as pytest rewrites their asserts. Without it every pytest-xdist worker rewrote
# every test module again at its start (about 5 s of CPU each) wherever PYTHONDONTWRITEBYTECODE is
# set, as in many CI images (a worker reads such bytecode; it only never writes it).
env -u PYTHONDONTWRITEBYTECODE "$venv/bin/python" -m pytest -p no:cacheprovider --collect-only -q \
    >/dev/null 2>&1 &
warm=$!
"$venv/bin/ruff" check orchestrator tests benchmarks
"$venv/bin/ruff" format --check orchestrator tests benchmarks
"$venv/bin/mypy"
wait "$warm" || true  # a collection error is the test run's to report, below

# The run is CPU-bound (docs/testing.md): pytest-xdist workers, each test file on one worker, in
# collection order (tests/e2e, the longest, first; files that mostly wait spread among them:
# tests/conftest.py). tests/conftest.py keeps workers apart (their own namespace clusters, their own
# ~root/cluster-bootstrap). BOOTSTRAP_TEST_WORKERS=0: one serial run of everything.
workers=${BOOTSTRAP_TEST_WORKERS:-4}
pytest=("$venv/bin/python" -m pytest -p no:cacheprovider --durations=15)
set +e
if [ "$workers" = 0 ]; then
    "${pytest[@]}" "$@"
else
    "${pytest[@]}" -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
fi
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$rc"
