#!/bin/sh
# Launch script for node head (node rank 0), rendered by cluster-bootstrap.
# Cluster lab: 3 node(s), world size 5, backend gloo.
# Runs torchrun for this node's 2 rank(s) (global ranks 0-1).
# Standalone: copy it to the node and run `sh` on it; bootstrap launch runs the same text.
set -eu
cd "$HOME"/cluster-bootstrap/code
# lines reach the log (and bootstrap) as they are printed: torchrun's --tee copier never flushes
export PYTHONUNBUFFERED=1
# the backend the cluster chose, for training scripts that read it (the shipped example does)
export CLUSTER_BOOTSTRAP_BACKEND=gloo
export GLOO_SOCKET_IFNAME=eth0
export OMP_NUM_THREADS=8
export MY_FLAG='a b'
export WANDB_API_KEY='********'
exec python3 -m torch.distributed.run \
  --tee 3 \
  --nnodes 3 \
  --nproc-per-node 2 \
  --node-rank 0 \
  --master-addr 10.0.0.1 \
  --master-port 29500 \
  examples/train_ddp.py --epochs 3 --note 'it'"'"'s $HOME; `x`'
