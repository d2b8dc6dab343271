"""Several processes (MPI): which rank this is, and the two collective ops.

Under ``mpirun`` (or SLURM's ``srun``) every rank runs the user's unchanged
script and Keras hands every rank the same batch.  Each rank computes the
model on its share of the rows (``rank_bounds``), and in the compiled
function

- ``AllGatherRows`` joins the ranks' rows of the layer outputs the loss
  reads, so loss, metrics and state updates are computed on the whole
  batch, identically on every rank;
- ``AllReduceSum`` sums the ranks' weight gradients, all fused into one
  buffer (``FusedSum``: shared memory between the ranks on one machine,
  MPI Allreduce between machines), so the optimizer's updates are
  identical on every rank.

mpi4py is imported only here, and only under MPI (``launcher`` tells,
from the environment alone).
"""
import sys
import time
import traceback

import numpy as np
import theano
from theano import gof, tensor
from theano.gradient import DisconnectedType

__all__ = ['world', 'rank_bounds', 'AllGatherRows',
           'AllReduceSum', 'FusedSum', 'fused_sum', 'all_gather_rows', 'sum_over_ranks',
           'data_parallel_gradients',
           'agree_and_broadcast', 'share_random_state', 'collective_seconds']

# Seconds spent inside the collectives since the process started, by op:
# what the benchmark reports as the share of a step spent communicating.
collective_seconds = {'allgather': 0.0, 'allreduce': 0.0}


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


def rank_bounds(batch_size, rank, size):
    """(start, stop) of rank ``rank``'s rows: contiguous shares differing
    by at most one row (symbolic when ``batch_size`` is)."""
    return (rank * batch_size) // size, ((rank + 1) * batch_size) // size


class AllGatherRows(gof.Op):
    """Each rank's row blocks of several tensors, joined in rank order.

    Inputs: the rows each rank contributes (an int64 vector, the same on
    every rank), then this rank's blocks.  One MPI Allgatherv moves all the
    blocks as bytes.  The gradient of an output is its rows of this rank.
    """
    __props__ = ('rank',)

    def __init__(self, rank):
        self.rank = rank

    def make_node(self, rows, *blocks):
        rows = tensor.as_tensor_variable(rows)
        blocks = [tensor.as_tensor_variable(b) for b in blocks]
        return gof.Apply(self, [rows] + blocks, [b.type() for b in blocks])

    def perform(self, node, inputs, outputs):
        from mpi4py import MPI
        comm, rank, size = world()
        rows, blocks = [int(r) for r in inputs[0]], inputs[1:]
        started = time.perf_counter()
        # Bytes one row of each block takes: the same on every rank.
        row_bytes = [int(np.prod(b.shape[1:], dtype=np.int64)) * b.dtype.itemsize
                     for b in blocks]
        per_rank = [r * sum(row_bytes) for r in rows]
        send = np.concatenate([np.ascontiguousarray(b).view(np.uint8).ravel()
                               for b in blocks]) if blocks else np.empty(0, np.uint8)
        if send.size != per_rank[rank]:
            raise RuntimeError(
                'AllGatherRows expected %d rows on rank %d, but received blocks of '
                '%s rows' % (rows[rank], rank, [b.shape[0] for b in blocks]))
        received = np.empty(sum(per_rank), np.uint8)
        comm.Allgatherv([send, MPI.BYTE], [received, (per_rank, None), MPI.BYTE])
        # Unpack: rank r's part holds its rows of block 0, then of block 1, ...
        offsets = np.concatenate([[0], np.cumsum(per_rank)])
        for k, (block, out) in enumerate(zip(blocks, outputs)):
            pieces = []
            for r in range(size):
                start = offsets[r] + rows[r] * sum(row_bytes[:k])
                piece = received[start:start + rows[r] * row_bytes[k]]
                pieces.append(piece.view(block.dtype).reshape((rows[r],) + block.shape[1:]))
            out[0] = np.concatenate(pieces, axis=0)
        collective_seconds['allgather'] += time.perf_counter() - started

    def infer_shape(self, node, shapes):
        rows = node.inputs[0]
        return [(rows.sum(),) + tuple(shape[1:]) for shape in shapes[1:]]

    def connection_pattern(self, node):
        return [[False] * len(node.outputs)] + [
            [i == j for j in range(len(node.outputs))] for i in range(len(node.outputs))]

    def grad(self, inputs, output_grads):
        rows, blocks = inputs[0], inputs[1:]
        start = rows[:self.rank].sum()
        grads = [DisconnectedType()()]
        for block, g in zip(blocks, output_grads):
            if isinstance(g.type, DisconnectedType):
                grads.append(DisconnectedType()())
            else:
                grads.append(g[start:start + block.shape[0]])
        return grads


class AllReduceSum(gof.Op):
    """Several tensors of one dtype, each summed over the ranks, fused into
    one buffer (``FusedSum``).  The first ``pieces`` inputs are summed;
    further inputs are read by no one: they order the collective after the
    ops computing them, so every rank calls the collectives in one order."""
    __props__ = ('pieces',)

    def __init__(self, pieces):
        self.pieces = pieces

    def make_node(self, *inputs):
        inputs = [tensor.as_tensor_variable(i) for i in inputs]
        dtypes = set(i.dtype for i in inputs[:self.pieces])
        if len(dtypes) != 1:
            raise TypeError('AllReduceSum expects tensors of one dtype, but received %s'
                            % sorted(dtypes))
        return gof.Apply(self, inputs, [i.type() for i in inputs[:self.pieces]])

    def perform(self, node, inputs, outputs):
        started = time.perf_counter()
        for out, total in zip(outputs, fused_sum().sum(inputs[:self.pieces])):
            out[0] = total
        collective_seconds['allreduce'] += time.perf_counter() - started

    def infer_shape(self, node, shapes):
        return shapes[:self.pieces]

    def connection_pattern(self, node):
        return [[i == j for j in range(self.pieces)] for i in range(len(node.inputs))]

    def grad(self, inputs, output_grads):
        return (AllReduceSum(self.pieces)(*output_grads, return_list=True)
                + [DisconnectedType()()] * (len(inputs) - self.pieces))


class FusedSum(object):
    """Sums arrays over the ranks through one buffer per call.

    Ranks on one machine copy their arrays into their slot of an MPI-3
    shared-memory window, each sums its chunk of the slots into slot 0, and
    all read slot 0: MPI's own Allreduce between processes on one machine
    costs several times that.  Between machines, one rank per machine
    (its leader) sums slot 0 with MPI Allreduce.  With ``shared_memory``
    off every rank is its own leader: MPI Allreduce alone.
    """

    def __init__(self, comm, shared_memory=True):
        from mpi4py import MPI
        self.node = comm.Split_type(MPI.COMM_TYPE_SHARED) if shared_memory else MPI.COMM_SELF
        leaders = comm.Split(0 if self.node.Get_rank() == 0 else MPI.UNDEFINED, comm.Get_rank())
        # Only this machine's leader, and only with other machines, joins an Allreduce.
        self.leaders = leaders if leaders != MPI.COMM_NULL and leaders.Get_size() > 1 else None
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
        self.node.Barrier()
        lo, hi = rank_bounds(count, node_rank, node_size)
        total = slots[0][lo:hi]
        for slot in slots[1:]:
            np.add(total, slot[lo:hi], out=total)
        if self.leaders is not None:
            self.node.Barrier()
            self.leaders.Allreduce(MPI.IN_PLACE, slots[0], op=MPI.SUM)
        self.node.Barrier()
        sums = [slots[0][start:stop].reshape(a.shape).copy()
                for a, start, stop in zip(arrays, offsets[:-1], offsets[1:])]
        # Slot 0 is rewritten by the next call: not before every rank read it.
        self.node.Barrier()
        return sums

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
        self.slot_bytes = slot_bytes


_fused_sum = None


def fused_sum():
    """This process's FusedSum (multigpu.mpi_shared_memory picks how)."""
    global _fused_sum
    if _fused_sum is None:
        _fused_sum = FusedSum(world()[0], theano.config.multigpu.mpi_shared_memory)
    return _fused_sum


def all_gather_rows(blocks, rows_per_rank):
    """The whole batch's rows of each of ``blocks`` (this rank's rows),
    from every rank; ``rows_per_rank`` lists the rows each rank holds."""
    rank = world()[1]
    return AllGatherRows(rank)(tensor.stack(rows_per_rank).astype('int64'), *blocks,
                               return_list=True)


def sum_over_ranks(tensors, after=()):
    """Each of ``tensors`` summed over the ranks: one fused AllReduceSum
    per dtype."""
    by_dtype = {}
    for k, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(k)
    summed = [None] * len(tensors)
    for dtype in sorted(by_dtype):
        group = by_dtype[dtype]
        sums = AllReduceSum(len(group))(*([tensors[k] for k in group] + list(after)),
                                        return_list=True)
        for k, total in zip(group, sums):
            summed[k] = total
    return summed


def data_parallel_gradients(stand_ins, replace):
    """{stand-in: gradient of its loss over the whole global batch}.

    ``replace`` rewrites the loss to read the outputs of ``AllGatherRows``.
    Backward through them, a rank's gradient covers its own rows only:
    those parts are summed over the ranks.  What the loss reads of a weight
    directly (a regulariser) is the same on every rank and is added after
    the sum, not counted once per rank.
    """
    by_loss = {}
    for stand_in in stand_ins:
        by_loss.setdefault(stand_in.tag.multigpu_gradient.loss, []).append(stand_in)
    through, direct, order, gathered = [], [], [], []
    for loss, group in by_loss.items():
        rewritten = theano.clone(loss, replace=replace, strict=False)
        # theano.clone copies the replacements' graphs too: find the copies.
        cut = [out for node in gof.graph.io_toposort(gof.graph.inputs([rewritten]), [rewritten])
               if isinstance(node.op, AllGatherRows) for out in node.outputs]
        params = [s.tag.multigpu_gradient.param for s in group]
        total = theano.grad(rewritten, params, disconnected_inputs='ignore')
        own = theano.grad(rewritten, params, consider_constant=cut,
                          disconnected_inputs='ignore')
        for stand_in, t, d in zip(group, total, own):
            t, d = _on_host(t), _on_host(d)
            through.append(t - d)
            direct.append(d)
            order.append(stand_in)
        gathered += cut
    summed = sum_over_ranks(through, after=gathered)
    return dict((s, tensor.as_tensor_variable(g + d))
                for s, g, d in zip(order, summed, direct))


def _on_host(gradient):
    from theano.gpuarray.basic_ops import host_from_gpu
    from theano.gpuarray.type import GpuArrayType
    if isinstance(gradient.type, GpuArrayType):
        return host_from_gpu(gradient)
    return tensor.as_tensor_variable(gradient)


_agreed = set()


def agree_and_broadcast(shared_variables, title):
    """Before a function's first compile: check every rank built the same
    function (the same weights, shapes and dtypes), then give every rank
    rank 0's values of the weights not broadcast before.

    Raises ValueError on every rank, naming what differs, when they differ.
    """
    comm, rank, size = world()
    signature = [title] + ['%s %s %s' % (v.name, _shape(v), v.dtype) for v in shared_variables]
    signatures = comm.allgather(signature)
    for other, theirs in enumerate(signatures):
        if theirs != signatures[0]:
            raise ValueError(
                'every MPI rank must build the same model, but rank %d differs from '
                'rank 0 in %s: %s; run the same script with the same settings on '
                'every rank' % (other, title, _first_difference(signatures[0], theirs)))
    fresh = [v for v in shared_variables if id(v) not in _agreed]
    values = comm.bcast([v.get_value() for v in fresh] if rank == 0 else None, root=0)
    if rank != 0:
        for variable, value in zip(fresh, values):
            variable.set_value(value)
    _agreed.update(id(v) for v in fresh)


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
            what = 'the function' if k == 0 else 'variable %d' % (k - 1)
            return '%s is %r on rank 0 and %r there' % (what, a, b)
    return 'nothing'
