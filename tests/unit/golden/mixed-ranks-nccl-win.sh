#!/bin/sh
# Rank script for node win (node rank 2), rendered by cluster-bootstrap.
# Cluster mixed: 3 node(s), world size 4, backend nccl.
# One process per local rank (global ranks 2-3) with torchrun's
# environment but without torchrun: a rank that cannot reach the master reports it itself instead of
# waiting inside torchrun's rendezvous (used by `bootstrap validate`).
set -eu
cd "$HOME"/cluster-bootstrap/runs/validate-mixed-20261202/win
export PYTHONUNBUFFERED=1
export GLOO_SOCKET_IFNAME=eth1
export NCCL_SOCKET_IFNAME==eth1
export OMP_NUM_THREADS=6
export MY_FLAG='a b'
export WANDB_API_KEY='********'
export CB_RECORD_NONCE=cb-00112233aabb
export MASTER_ADDR=10.0.0.1
export MASTER_PORT=29500
export WORLD_SIZE=4
export LOCAL_WORLD_SIZE=2
export GROUP_RANK=2
export TORCHELASTIC_RUN_ID=validate-mixed-20261202
pids=
RANK=2 LOCAL_RANK=0 /home/bob/venv/bin/python validate_worker.py --backend nccl --timeout 60 --sizes 4096 &
pids="$pids $!"
RANK=3 LOCAL_RANK=1 /home/bob/venv/bin/python validate_worker.py --backend nccl --timeout 60 --sizes 4096 &
pids="$pids $!"
rc=0
for pid in $pids; do
  if wait "$pid"; then :; else s=$?; [ "$rc" -ne 0 ] || rc=$s; fi
done
exit "$rc"
