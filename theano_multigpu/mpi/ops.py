"""The two collective ops inside a compiled function under MPI.

- ``AllGatherRows`` joins the ranks' rows of several tensors (one MPI
  Allgatherv); its gradient is this rank's rows.
- ``AllReduceSum`` sums several tensors of one dtype over the ranks, fused
  into one buffer (``transport.FusedSum``); its gradient is the same sum.

``collective_seconds`` counts the seconds spent inside them: what the
benchmark reports as the share of a step spent communicating.
"""
import time

import numpy as np
from theano import gof, tensor
from theano.gradient import DisconnectedType

from .transport import fused_sum
from ..errors import RanksApartError
from .world import collective, world

__all__ = ['AllGatherRows', 'AllReduceSum', 'digests_of', 'collective_seconds']

# Seconds spent inside the collectives since the process started, by op.
collective_seconds = {'allgather': 0.0, 'allreduce': 0.0}


class AllGatherRows(gof.Op):
    """Each rank's row blocks of several tensors, joined in rank order.

    Inputs: the rows each rank contributes (an int64 vector, the same on
    every rank), then this rank's blocks, then the inputs every rank must
    have been handed alike (``checked`` names them).  A digest of ``call``
    and of each checked input travels with this rank's blocks: a rank that
    runs another function at this step, or was handed other inputs, stops
    every rank with RanksApartError naming it and the input.  One MPI
    Allgatherv moves it all as bytes.  The gradient of an output is its
    rows of this rank: of the output's gradient when what reads the output
    is computed alike on every rank (``replicated``, the loss), else of
    that gradient summed over the ranks (a statistic each rank uses for
    its own rows).  ``call``: the function every rank runs (for errors).
    """
    __props__ = ('rank', 'replicated', 'checked', 'call')

    def __init__(self, rank, replicated=True, checked=(), call='a compiled function'):
        self.rank = rank
        self.replicated = replicated
        self.checked = tuple(checked)
        self.call = call

    def make_node(self, rows, *blocks_and_checked):
        rows = tensor.as_tensor_variable(rows)
        inputs = [tensor.as_tensor_variable(b) for b in blocks_and_checked]
        blocks = inputs[:len(inputs) - len(self.checked)]
        return gof.Apply(self, [rows] + inputs, [b.type() for b in blocks])

    def perform(self, node, inputs, outputs):
        from mpi4py import MPI
        comm, rank, size = world()
        started = time.perf_counter()
        rows = [int(r) for r in inputs[0]]
        blocks, checked = inputs[1:1 + len(outputs)], inputs[1 + len(outputs):]
        digests = digests_of(self.call, checked)
        # Bytes one row of each block takes: the same on every rank.
        row_bytes = [int(np.prod(b.shape[1:], dtype=np.int64)) * b.dtype.itemsize
                     for b in blocks]
        per_rank = [r * sum(row_bytes) + digests.size for r in rows]
        send = np.concatenate([np.ascontiguousarray(b).view(np.uint8).ravel()
                               for b in blocks] + [digests])
        if send.size != per_rank[rank]:
            raise RuntimeError(
                'AllGatherRows expected %d rows on rank %d, but received blocks of '
                '%s rows' % (rows[rank], rank, [b.shape[0] for b in blocks]))
        received = np.empty(sum(per_rank), np.uint8)
        collective(comm, 'Allgatherv', ([send, MPI.BYTE], [received, (per_rank, None), MPI.BYTE]),
                   self.call)
        # Unpack: rank r's part holds its rows of block 0, then of block 1,
        # ..., then its digests.
        offsets = np.concatenate([[0], np.cumsum(per_rank)])
        self._compare_digests([received[stop - digests.size:stop] for stop in offsets[1:]])
        for k, (block, out) in enumerate(zip(blocks, outputs)):
            pieces = []
            for r in range(size):
                start = offsets[r] + rows[r] * sum(row_bytes[:k])
                piece = received[start:start + rows[r] * row_bytes[k]]
                pieces.append(piece.view(block.dtype).reshape((rows[r],) + block.shape[1:]))
            out[0] = np.concatenate(pieces, axis=0)
        collective_seconds['allgather'] += time.perf_counter() - started

    def _compare_digests(self, per_rank):
        """Stop, on every rank alike, at the first rank that ran another
        function or was handed other inputs than rank 0."""
        ours = per_rank[0].view(np.uint64)
        for other, theirs in enumerate(per_rank):
            theirs = theirs.view(np.uint64) if theirs.size == ours.size * 8 else None
            if theirs is not None and np.array_equal(theirs, ours):
                continue
            if theirs is None or theirs[0] != ours[0]:
                raise RanksApartError(
                    'every MPI rank must make the same Keras calls, but at this step rank %d '
                    'of %d ran another compiled function than rank 0, whose step is %s; call '
                    'it on every rank, not under a test of the rank'
                    % (other, len(per_rank), self.call))
            name = self.checked[int(np.argmax(theirs[1:] != ours[1:]))]
            raise RanksApartError(
                'every MPI rank must be handed the same batch, but rank %d of %d was handed '
                'another %s than rank 0 in %s (its digest differs); hand every rank the same '
                'data in the same order (the same files, sorted; the same seed; no data '
                'sharded by rank: the shim shares each batch out over the ranks itself), or '
                'set THEANO_FLAGS=multigpu.mpi_check_inputs=False to train each rank on its '
                'share of the rows of its own batch (see the README)'
                % (other, len(per_rank), name, self.call))

    def infer_shape(self, node, shapes):
        rows = node.inputs[0]
        return [(rows.sum(),) + tuple(shape[1:]) for shape in shapes[1:1 + len(node.outputs)]]

    def connection_pattern(self, node):
        outputs = len(node.outputs)
        return [[False] * outputs] + [[i == j for j in range(outputs)]
                                      for i in range(len(node.inputs) - 1)]

    def grad(self, inputs, output_grads):
        rows, blocks = inputs[0], inputs[1:1 + len(output_grads)]
        start = rows[:self.rank].sum()
        grads = [DisconnectedType()()]
        for block, g in zip(blocks, output_grads):
            if isinstance(g.type, DisconnectedType):
                grads.append(DisconnectedType()())
                continue
            if not self.replicated:
                g, = AllReduceSum(1, self.call)(g, return_list=True)
            grads.append(g[start:start + block.shape[0]])
        return grads + [DisconnectedType()() for _ in self.checked]


def digests_of(call, arrays):
    """64-bit XXH3 digests, as bytes: of ``call``, then of each array's
    dtype, shape and bytes (about 30 GB/s)."""
    try:
        import xxhash
    except ImportError as error:
        raise ImportError(
            'theano_multigpu under MPI expects xxhash, to check that every rank was '
            'handed the same batch, but importing it failed (%s); install it (pip install '
            'xxhash), or set THEANO_FLAGS=multigpu.mpi_check_inputs=False' % error)
    digests = [xxhash.xxh3_64_intdigest(call.encode('utf8'))]
    for a in arrays:
        a = np.ascontiguousarray(a)
        header = ('%s %s' % (a.dtype.str, a.shape)).encode('ascii')
        digests.append(xxhash.xxh3_64_intdigest(a, xxhash.xxh3_64_intdigest(header)))
    return np.array(digests, np.uint64).view(np.uint8)


class AllReduceSum(gof.Op):
    """Several tensors of one dtype, each summed over the ranks, fused into
    one buffer (``FusedSum``).  The first ``pieces`` inputs are summed;
    further inputs are read by no one: they order the collective after the
    ops computing them, so every rank calls the collectives in one order."""
    __props__ = ('pieces', 'call')

    def __init__(self, pieces, call='a compiled function'):
        self.pieces = pieces
        self.call = call

    def make_node(self, *inputs):
        inputs = [tensor.as_tensor_variable(i) for i in inputs]
        dtypes = set(i.dtype for i in inputs[:self.pieces])
        if len(dtypes) != 1:
            raise TypeError('AllReduceSum expects tensors of one dtype, but received %s'
                            % sorted(dtypes))
        return gof.Apply(self, inputs, [i.type() for i in inputs[:self.pieces]])

    def perform(self, node, inputs, outputs):
        started = time.perf_counter()
        for out, total in zip(outputs, fused_sum().sum(inputs[:self.pieces], self.call)):
            out[0] = total
        collective_seconds['allreduce'] += time.perf_counter() - started

    def infer_shape(self, node, shapes):
        return shapes[:self.pieces]

    def connection_pattern(self, node):
        return [[i == j for j in range(self.pieces)] for i in range(len(node.inputs))]

    def grad(self, inputs, output_grads):
        return (AllReduceSum(self.pieces, self.call)(*output_grads, return_list=True)
                + [DisconnectedType()()] * (len(inputs) - self.pieces))
