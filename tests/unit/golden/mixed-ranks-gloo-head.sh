#!/bin/sh
# Rank script for node head (node rank 0), rendered by cluster-bootstrap.
# Cluster mixed: 3 node(s), world size 4, backend gloo.
# One process per local rank (global ranks 0-0) with torchrun's
# environment but without torchrun: a rank that cannot reach the master reports it itself instead of
# waiting inside torchrun's rendezvous (used by `bootstrap validate`).
set -eu
cd "$HOME"/cluster-bootstrap/runs/validate-mixed-20261202/head
export PYTHONUNBUFFERED=1
export GLOO_SOCKET_IFNAME=eth0
export OMP_NUM_THREADS=16
export MY_FLAG='a b'
export WANDB_API_KEY='********'
export CB_RECORD_NONCE=cb-00112233aabb
export MASTER_ADDR=10.0.0.1
export MASTER_PORT=29500
export WORLD_SIZE=4
export LOCAL_WORLD_SIZE=1
export GROUP_RANK=0
export TORCHELASTIC_RUN_ID=validate-mixed-20261202
pids=
RANK=0 LOCAL_RANK=0 python3 validate_worker.py --backend gloo --timeout 60 --sizes 4096 &
pids="$pids $!"
rc=0
for pid in $pids; do
  if wait "$pid"; then :; else s=$?; [ "$rc" -ne 0 ] || rc=$s; fi
done
exit "$rc"
