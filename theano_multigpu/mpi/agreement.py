"""Ranks that agree: the same model, rank 0's weights, rank 0's random
state.
"""
import weakref

import numpy as np

from ..config import mesh as mesh_module
from .world import calls, wait_for_every_rank, world

__all__ = ['agree_and_broadcast', 'share_random_state']


# The weights broadcast before, held weakly: the id of a weight freed with
# its model is reused by the next objects, so ids would mistake a new
# weight for an old one.
_agreed = weakref.WeakSet()
_functions_agreed = 0


def agree_and_broadcast(shared_variables, title):
    """Before a function's first compile: check every rank built the same
    function (the same weights, shapes and dtypes, the same MPI settings),
    then give every rank rank 0's values of the weights not broadcast
    before.  Returns the function's number among those agreed on (the
    same on every rank).

    Raises ValueError on every rank, naming what differs, when they differ,
    and RanksApartError where some ranks do not build it within
    multigpu.mpi_timeout.
    """
    rank = world()[1]
    # Within multigpu.mpi_timeout: a call made on some ranks alone stops here.
    wait_for_every_rank(title)
    comm = calls()
    signature = [title, _settings()] + ['%s %s %s' % (v.name, _shape(v), v.dtype)
                                        for v in shared_variables]
    signatures = comm.allgather(signature)
    for other, theirs in enumerate(signatures):
        if theirs != signatures[0]:
            raise ValueError(
                'every MPI rank must build the same model, but rank %d differs from '
                'rank 0 in %s: %s; run the same script with the same settings on '
                'every rank' % (other, title, _first_difference(signatures[0], theirs)))
    # Rank 0 says which weights are fresh: each rank's memory of those
    # broadcast before is its own.
    fresh = [k for k, v in enumerate(shared_variables) if v not in _agreed]
    indices, values = comm.bcast(
        (fresh, [shared_variables[k].get_value() for k in fresh]) if rank == 0 else None,
        root=0)
    if rank != 0:
        for k, value in zip(indices, values):
            shared_variables[k].set_value(value)
    _agreed.update(shared_variables)
    global _functions_agreed
    _functions_agreed += 1
    return _functions_agreed


def _settings():
    """The settings every rank must share: they decide which collectives
    a step makes and what they carry."""
    import theano
    multigpu = theano.config.multigpu
    timeout = 'inf' if float(multigpu.mpi_timeout) == float('inf') else 'finite'
    # (The mode and the contexts taking part shape each rank's graph, and
    # so the order of its collectives.)
    mesh = mesh_module.current()
    contexts = len(mesh.names)
    # Machines of their own only matter where the ranks share memory.
    per_machine = (int(multigpu.mpi_ranks_per_machine) if multigpu.mpi_shared_memory
                   else 'unused')
    return ('multigpu.mpi_timeout %s, multigpu.mpi_check_inputs %s, '
            'multigpu.mpi_shared_memory %s, multigpu.mpi_ranks_per_machine %s, '
            'multigpu.batchnorm %s, multigpu.mode %s, %d contexts'
            % (timeout, multigpu.mpi_check_inputs, multigpu.mpi_shared_memory,
               per_machine, multigpu.batchnorm, mesh.mode, contexts))


def _shape(shared_variable):
    return tuple(shared_variable.get_value(borrow=True, return_internal_type=True).shape)


def share_random_state():
    """numpy's global generator in rank 0's state on every rank: Keras
    shuffles with it (and seeds its dropout streams from it), so every rank
    shuffles the same way and draws the same masks."""
    comm, rank, size = world()
    np.random.set_state(comm.bcast(np.random.get_state() if rank == 0 else None, root=0))


def _first_difference(ours, theirs):
    for k in range(max(len(ours), len(theirs))):
        a = ours[k] if k < len(ours) else 'nothing'
        b = theirs[k] if k < len(theirs) else 'nothing'
        if a != b:
            what = ('the function', 'the settings')[k] if k < 2 else 'variable %d' % (k - 2)
            return '%s is %r on rank 0 and %r there' % (what, a, b)
    return 'nothing'
