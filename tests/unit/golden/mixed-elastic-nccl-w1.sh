#!/bin/sh
# Launch script for node w1 (elastic), rendered by cluster-bootstrap.
# Cluster mixed: 3 node(s), world size 4, backend nccl.
# Runs torchrun for this node's 1 rank(s); global ranks are assigned at each rendezvous.
# Each rank's output goes to its own file (ranks/ beside this script) and rank_capture.py, which must
# be beside it too (bootstrap launch uploads it; render --out writes it), forwards complete lines only,
# as [default<rank>]:line: two ranks' lines are never glued together (torchrun --tee glues them).
# Standalone: copy both files to the node and run `sh` on this one; bootstrap launch runs the same text.
set -eu
cb_dir=$(cd "$(dirname "$0")" && pwd)
cd /srv/train/code
# the training script, where torchrun will look for it: one line saying so, not every rank's traceback
if [ ! -e examples/train_ddp.py ]; then
  printf 'cluster-bootstrap: training script %s not found in %s on this node (launch uploads it from where bootstrap runs, when it is there; cluster.code syncs a project)\n' examples/train_ddp.py "$(pwd)" >&2
  exit 2
fi
# lines reach the rank's file (and bootstrap) as they are printed
export PYTHONUNBUFFERED=1
# the backend the cluster chose, for training scripts that read it (the shipped example does)
export CLUSTER_BOOTSTRAP_BACKEND=nccl
# this run: its id, and its own directory on this node for checkpoints and outputs (out/ beside this
# script; code sync never touches it, and `bootstrap fetch --run ID` looks there first)
export CB_RUN_ID=mixed-20261202
export CB_RUN_DIR="$cb_dir/out"
mkdir -p -- "$CB_RUN_DIR"
# each rendezvous assigns the global ranks: every line is tagged with the rank the process really has
export CB_RANK_LABEL=global
export GLOO_SOCKET_IFNAME=eth0
export NCCL_SOCKET_IFNAME==eth0
export OMP_NUM_THREADS=8
export MY_FLAG='a b'
export WANDB_API_KEY='********'
exec /opt/venv/bin/python "$cb_dir/rank_capture.py" mux "$cb_dir/ranks" \
  /opt/venv/bin/python -m torch.distributed.run \
  --no-python \
  --nnodes 2:3 \
  --nproc-per-node 1 \
  --rdzv-backend c10d \
  --rdzv-endpoint 10.0.0.1:29500 \
  --rdzv-id mixed-20261202 \
  --local-addr 10.0.0.2 \
  --max-restarts 3 \
  /opt/venv/bin/python "$cb_dir/rank_capture.py" worker "$cb_dir/ranks" \
  /opt/venv/bin/python examples/train_ddp.py --epochs 3 --note 'it'"'"'s $HOME; `x`'
