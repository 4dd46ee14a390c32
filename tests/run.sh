#!/usr/bin/env bash
# Set up and run the whole test suite on a Debian machine, as root (README command 2; .ci/run).
# Installs what the tests need: sshd, chrony, nftables, iproute2, sudo, a venv with the project.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(openssh-server openssh-client chrony nftables iproute2 sudo util-linux procps python3-venv libfaketime iptables ufw firewalld)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's postinst may start the system sshd/chronyd where systemd runs; the tests never use them.

venv=${BOOTSTRAP_TEST_VENV:-.venv-test}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# torch: the CPU build (an unpinned torch pulls a multi-GB CUDA build)
"$venv/bin/pip" install -q -e '.[test]' 'torch==2.13.0'

"$venv/bin/ruff" check orchestrator tests benchmarks
"$venv/bin/ruff" format --check orchestrator tests benchmarks
"$venv/bin/mypy"

# The tests wait on sshd, chrony, torch and subprocesses more than they compute: more workers than
# cores (pytest-xdist), each test file on one worker, in collection order (tests/e2e, the longest,
# first). tests/conftest.py keeps workers apart (its own namespace clusters, its own
# ~root/cluster-bootstrap). Tests marked `alone` (a speed comparison, which other tests' load would
# decide) come after, by themselves. BOOTSTRAP_TEST_WORKERS=0: one serial run of everything, as before (e.g. with a
# -m of your own).
workers=${BOOTSTRAP_TEST_WORKERS:-4}
pytest=("$venv/bin/python" -m pytest -p no:cacheprovider)
set +e
if [ "$workers" = 0 ]; then
    "${pytest[@]}" --durations=15 "$@"
    rc=$?
    alone_rc=5
else
    "${pytest[@]}" --durations=15 -n "$workers" --dist loadfile --no-loadscope-reorder -m "not alone" "$@"
    rc=$?
    "${pytest[@]}" --durations=5 -m alone "$@"
    alone_rc=$?
fi
set -e
if [ "$rc" -eq 5 ] && [ "$alone_rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
[ "$rc" -eq 5 ] && rc=0
[ "$alone_rc" -eq 5 ] && alone_rc=0
[ "$rc" -ne 0 ] && exit "$rc"
exit "$alone_rc"
