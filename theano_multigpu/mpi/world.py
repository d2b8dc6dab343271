"""The MPI world of this process: its communicator, rank and size; waits
for every rank within multigpu.mpi_timeout.

The compiled steps' collectives run on MPI_COMM_WORLD; what the ranks
agree on outside the steps (a function's first compile, saves) runs on a
communicator of its own (``calls``), so a rank that makes such a call
alone waits for it there and never meets another rank's step.

Importing mpi4py starts MPI, so it is imported here, on first use, and only
under MPI (``theano_multigpu.config.mpi_environment`` tells, from the
environment alone).
"""
import contextlib
import sys
import threading
import time
import traceback

from ..errors import RanksApartError

__all__ = ['world', 'calls', 'complete', 'collective', 'wait_for_every_rank',
           'configured_timeout', 'timeout_seconds', 'without_limit']


_world = None
_calls = None


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
        global _calls
        _calls = comm.Dup()
    return _world


def calls():
    """The communicator of the calls every rank makes outside the compiled
    steps (a copy of MPI_COMM_WORLD)."""
    world()
    return _calls


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


# A rank waiting in a collective polls it, without a pause for this long
# (MPI's blocking calls poll too), then every millisecond.
SPIN_SECONDS = 0.1


_without_limit = threading.local()


def configured_timeout():
    """multigpu.mpi_timeout in seconds (``inf``: no limit; the ranks agree
    on whether it is, see agreement.py)."""
    import theano
    return float(theano.config.multigpu.mpi_timeout)


def timeout_seconds():
    """How long a rank waits here: multigpu.mpi_timeout, ``inf`` inside
    ``without_limit``."""
    if getattr(_without_limit, 'depth', 0):
        return float('inf')
    return configured_timeout()


@contextlib.contextmanager
def without_limit():
    """Collectives inside wait without a time limit: where another rank may
    still be compiling what it needs to join them."""
    _without_limit.depth = getattr(_without_limit, 'depth', 0) + 1
    try:
        yield
    finally:
        _without_limit.depth -= 1


def complete(request, call, timeout_s=None, why=''):
    """Wait for the non-blocking collective ``request`` that every rank
    starts in ``call`` (the Keras call or function they all make).  After
    ``timeout_s`` seconds (default multigpu.mpi_timeout; ``inf``: no limit)
    raise RanksApartError, which, uncaught, ends every rank; ``why`` adds
    what else keeps ranks apart there."""
    if request.Test():
        return
    timeout_s = timeout_seconds() if timeout_s is None else timeout_s
    if timeout_s == float('inf'):
        request.Wait()
        return
    started = time.monotonic()
    while not request.Test():
        waited = time.monotonic() - started
        if waited > timeout_s:
            comm, rank, size = world()
            raise RanksApartError(
                'every MPI rank must make the same Keras calls, but rank %d of %d waited '
                '%g s (multigpu.mpi_timeout) in %s for ranks that did not call it%s; call '
                'it on every rank, not under a test of the rank (where ranks take longer '
                'than that to reach it, loading data, computing or writing, raise '
                'multigpu.mpi_timeout)' % (rank, size, timeout_s, call, why))
        if waited > SPIN_SECONDS:
            time.sleep(0.001)


def collective(comm, name, args, call):
    """MPI collective ``name`` (e.g. 'Allgatherv') of ``comm`` on ``args``,
    made by every rank in ``call``: its non-blocking form, waited for
    within ``timeout_seconds()``; the blocking form where
    multigpu.mpi_timeout is ``inf`` (the form depends on the setting alone,
    the same on every rank: the two forms never match each other)."""
    if configured_timeout() == float('inf'):
        getattr(comm, name)(*args)
    else:
        complete(getattr(comm, 'I' + name.lower())(*args), call)


def wait_for_every_rank(call, timeout_s=None, why=''):
    """Return once every rank has reached this point of ``call`` (on the
    ``calls`` communicator); see ``complete`` for the time limit."""
    complete(calls().Ibarrier(), call, timeout_s, why)
