"""The MPI world of this process: its communicator, rank and size.

Importing mpi4py starts MPI, so it is imported here, on first use, and only
under MPI (``theano_multigpu.config.mpi_environment`` tells, from the
environment alone).
"""
import sys
import time
import traceback

from ..errors import RanksApartError

__all__ = ['world', 'wait_for_every_rank']


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


def wait_for_every_rank(call, timeout_s):
    """Return once every rank has reached this point of ``call`` (the Keras
    call they all make); after ``timeout_s`` seconds without them raise
    RanksApartError (uncaught, it ends every rank)."""
    comm, rank, size = world()
    request = comm.Ibarrier()
    deadline = time.monotonic() + timeout_s
    pause = 1e-4
    while not request.Test():
        if time.monotonic() > deadline:
            raise RanksApartError(
                'every MPI rank must make the same Keras calls, but rank %d of %d waited '
                '%g s (multigpu.mpi_timeout) in %s for ranks that did not call it; call '
                'it on every rank, not under a test of the rank (the shim writes the '
                'file once, on rank 0, and returns on every rank once it is complete)'
                % (rank, size, timeout_s, call))
        time.sleep(pause)
        pause = min(2 * pause, 0.01)
