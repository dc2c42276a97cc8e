"""Machines handed out by a cluster scheduler (``slurm``: a Slurm allocation's nodes, srun argv)."""
