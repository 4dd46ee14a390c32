"""Slurm as a scheduler back-end of the launch (docs/slurm.md): the job's files (``job``), the queue as
the login host answers it (``queue``) and a run submitted, followed and stopped (``run``)."""
