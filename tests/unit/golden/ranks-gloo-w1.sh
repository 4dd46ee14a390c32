#!/bin/sh
# Rank script for node w1 (node rank 1), rendered by cluster-bootstrap.
# Cluster lab: 3 node(s), world size 5, backend gloo.
# One process per local rank (global ranks 2-2) with torchrun's
# environment but without torchrun: a rank that cannot reach the master reports it itself instead of
# waiting inside torchrun's rendezvous (used by `bootstrap validate`).
set -eu
cd /srv/train/runs/lab-20261202/w1
export PYTHONUNBUFFERED=1
export GLOO_SOCKET_IFNAME=eth0
export OMP_NUM_THREADS=8
export MY_FLAG='a b'
export WANDB_API_KEY='********'
export CB_RECORD_NONCE=cb-00112233aabb
export MASTER_ADDR=10.0.0.1
export MASTER_PORT=29500
export WORLD_SIZE=5
export LOCAL_WORLD_SIZE=1
export GROUP_RANK=1
export TORCHELASTIC_RUN_ID=lab-20261202
pids=
RANK=2 LOCAL_RANK=0 /opt/venv/bin/python validate_worker.py --backend gloo --timeout 60 --sizes 4096,4194304 &
pids="$pids $!"
rc=0
for pid in $pids; do
  if wait "$pid"; then :; else s=$?; [ "$rc" -ne 0 ] || rc=$s; fi
done
exit "$rc"
