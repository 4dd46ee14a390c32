"""`bootstrap bench`: what each rank of an unequal cluster really does, and what to do about it.

- :mod:`.shares`: each rank's integer share of a global batch (equal, measured, fixed) and the
  ``cb_shares.json`` a launch ships;
- ``cb_shares.py``: the node-side helper (standard library + torch) the training script loads: the
  sampler giving each rank its share, the loss scale that keeps DDP's gradient the global mean, the
  step timer and the ``CB_METRIC`` lines;
- :mod:`.probe`: a fixed forward/backward workload timed on every rank with the real launch
  environment (``probe_worker.py`` on the nodes);
- :mod:`.scaling`: the training script on 1, 2, ... N nodes with equal and measured shares, and the
  HTML report (:mod:`.report`);
- :mod:`.engine`: the command's work on a session, returning a report with ``public_dict()``.
"""
