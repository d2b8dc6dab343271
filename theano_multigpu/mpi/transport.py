"""Summing arrays over the ranks: through shared memory between the ranks
of one machine, MPI Allreduce between machines.

Open MPI's own Allreduce between two processes on one machine measured
12 to 19 times the cost of a copy, even with CMA; the shared-memory sum
costs a few copies.
"""
import numpy as np
import theano

from ..graph.rows import slice_bounds
from .world import world

__all__ = ['FusedSum', 'fused_sum']


class FusedSum(object):
    """Sums arrays over the ranks through one buffer per call.

    Ranks on one machine copy their arrays into their slot of an MPI-3
    shared-memory window, each sums its chunk of the slots into slot 0, and
    all read slot 0: MPI's own Allreduce between processes on one machine
    costs several times that.  Between the steps, Win_sync and a barrier
    make one rank's writes visible to the others, as MPI-3 specifies for
    any memory model (a barrier alone is enough on x86, not everywhere).
    Between machines, one rank per machine
    (its leader) sums slot 0 with MPI Allreduce.  With ``shared_memory``
    off every rank is its own leader: MPI Allreduce alone.  With
    ``ranks_per_machine`` N > 0 each block of N consecutive ranks of a
    machine sums as a machine of its own.  Its
    collectives block: a step sums after its gather (``AllGatherRows``),
    which waits within multigpu.mpi_timeout and shows every rank runs it.
    """

    def __init__(self, comm, shared_memory=True, ranks_per_machine=0):
        from mpi4py import MPI
        if shared_memory:
            self.node = comm.Split_type(MPI.COMM_TYPE_SHARED)
            if ranks_per_machine > 0:
                # Blocks of consecutive ranks within one machine, each summed as
                # a machine of its own (multigpu.mpi_ranks_per_machine).
                self.node = self.node.Split(self.node.Get_rank() // ranks_per_machine,
                                            comm.Get_rank())
        else:
            self.node = MPI.COMM_SELF
        leaders = comm.Split(0 if self.node.Get_rank() == 0 else MPI.UNDEFINED, comm.Get_rank())
        # Every rank knows how many machines there are: each rank of a
        # machine passes the same barriers whatever its role.
        self.machines = comm.allreduce(int(self.node.Get_rank() == 0), op=MPI.SUM)
        # Only this machine's leader, and only with other machines, joins an Allreduce.
        self.leaders = leaders if leaders != MPI.COMM_NULL and self.machines > 1 else None
        self.window, self.slot_bytes = None, 0

    def sum(self, arrays):
        """Each of ``arrays`` (one dtype) summed over the ranks: new arrays,
        the same on every rank."""
        from mpi4py import MPI
        dtype = arrays[0].dtype
        count = sum(a.size for a in arrays)
        node_rank, node_size = self.node.Get_rank(), self.node.Get_size()
        slots = [self._slot(q, count, dtype) for q in range(node_size)]
        offsets = np.cumsum([0] + [a.size for a in arrays])
        for a, start, stop in zip(arrays, offsets[:-1], offsets[1:]):
            slots[node_rank][start:stop] = a.ravel()
        self._synchronise()
        lo, hi = slice_bounds(count, node_size)[node_rank]
        total = slots[0][lo:hi]
        for slot in slots[1:]:
            np.add(total, slot[lo:hi], out=total)
        if self.machines > 1:
            # Every rank of the machine: the leader's Allreduce reads slot 0
            # once every chunk is summed into it, and the others read slot 0
            # (after the next barrier) once the Allreduce wrote it.
            self._synchronise()
            if self.leaders is not None:
                self.leaders.Allreduce(MPI.IN_PLACE, slots[0], op=MPI.SUM)
        self._synchronise()
        sums = [slots[0][start:stop].reshape(a.shape).copy()
                for a, start, stop in zip(arrays, offsets[:-1], offsets[1:])]
        # Slot 0 is rewritten by the next call: not before every rank read it.
        self._synchronise()
        return sums

    def _synchronise(self):
        """What each rank of the machine wrote into the window before is
        seen by every rank after, as MPI-3 specifies for shared memory
        (inside the window's passive-target epoch): Win_sync, a barrier,
        Win_sync."""
        self.window.Sync()
        self.node.Barrier()
        self.window.Sync()

    def _slot(self, q, count, dtype):
        """Rank ``q``'s slot (on this machine) as ``count`` items of ``dtype``."""
        nbytes = count * np.dtype(dtype).itemsize
        if nbytes > self.slot_bytes:
            self._allocate(max(nbytes, 2 * self.slot_bytes))
        buffer = self.window.Shared_query(0)[0]
        return np.ndarray((count,), dtype, buffer=buffer, offset=q * self.slot_bytes)

    def _allocate(self, nbytes):
        """A window of one slot per rank on this machine, allocated by its
        rank 0 (every rank of the machine calls this in the same call)."""
        from mpi4py import MPI
        if self.window is not None:
            self.window.Unlock_all()
            self.window.Free()
        slot_bytes = -(-nbytes // 64) * 64
        size = slot_bytes * self.node.Get_size() if self.node.Get_rank() == 0 else 0
        try:
            self.window = MPI.Win.Allocate_shared(size, 1, comm=self.node)
        except MPI.Exception as error:
            raise MemoryError(
                'theano_multigpu expected to allocate %d bytes of shared memory for '
                'summing gradients over the ranks on this machine, but MPI refused '
                '(%s); make /dev/shm larger, or set THEANO_FLAGS=multigpu.mpi_shared_'
                'memory=False to sum with MPI Allreduce alone' % (size, error))
        # One passive-target epoch for the window's life: Win_sync needs one.
        self.window.Lock_all(MPI.MODE_NOCHECK)
        self.slot_bytes = slot_bytes


_fused_sum = None


def fused_sum():
    """This process's FusedSum (multigpu.mpi_shared_memory and
    multigpu.mpi_ranks_per_machine pick how)."""
    global _fused_sum
    if _fused_sum is None:
        multigpu = theano.config.multigpu
        _fused_sum = FusedSum(world()[0], multigpu.mpi_shared_memory,
                              int(multigpu.mpi_ranks_per_machine))
    return _fused_sum
