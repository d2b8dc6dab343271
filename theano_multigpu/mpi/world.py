"""The MPI world of this process: its communicator, rank and size.

Importing mpi4py starts MPI, so it is imported here, on first use, and only
under MPI (``theano_multigpu.config.mpi_environment`` tells, from the
environment alone).
"""
import sys
import traceback

__all__ = ['world']


_world = None


def world():
    """(communicator, rank, size) of MPI_COMM_WORLD; imports mpi4py (which
    starts MPI) and makes an uncaught exception abort every rank."""
    global _world
    if _world is None:
        try:
            from mpi4py import MPI
        except ImportError as error:
            raise ImportError(
                'theano_multigpu under MPI expects mpi4py, but importing it failed '
                '(%s); install it in this Python (pip install mpi4py) with an MPI '
                'library (e.g. Debian openmpi-bin)' % error)
        comm = MPI.COMM_WORLD
        _world = (comm, comm.Get_rank(), comm.Get_size())
        _abort_on_uncaught_exception(comm)
    return _world


def _abort_on_uncaught_exception(comm):
    """A rank that dies of an exception takes the others with it: print the
    traceback (marked with the rank), then MPI_Abort, so no rank waits
    forever in a collective for it."""
    previous = sys.excepthook

    def excepthook(kind, value, trace):
        if issubclass(kind, KeyboardInterrupt):
            previous(kind, value, trace)
        else:
            text = ''.join(traceback.format_exception(kind, value, trace))
            sys.stderr.write('theano_multigpu: rank %d of %d failed:\n%s'
                             % (comm.Get_rank(), comm.Get_size(), text))
        sys.stderr.flush()
        sys.stdout.flush()
        comm.Abort(1)
    sys.excepthook = excepthook
