"""Whether MPI started this process, and how many ranks: read from the
variables that MPI launchers (mpirun, srun) set in every rank.

Nothing is imported: importing mpi4py would start MPI.
"""
import os

__all__ = ['world_size', 'launched_by_mpi']

# Environment variables that launchers set in every rank: the world size.
_SIZE_VARIABLES = ('OMPI_COMM_WORLD_SIZE',   # Open MPI's mpirun
                   'PMI_SIZE',               # MPICH's hydra, Intel MPI, srun --mpi=pmi2
                   'PMIX_SIZE',              # srun --mpi=pmix
                   'MV2_COMM_WORLD_SIZE')    # MVAPICH2


def world_size():
    """The number of ranks the launcher started (1 outside MPI)."""
    for name in _SIZE_VARIABLES:
        value = os.environ.get(name, '')
        if value.isdigit():
            return int(value)
    return 1


def launched_by_mpi():
    """True when this process is one of two or more MPI ranks."""
    return world_size() > 1
