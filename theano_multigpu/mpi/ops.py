"""The two collective ops inside a compiled function under MPI.

- ``AllGatherRows`` joins the ranks' rows of several tensors (one MPI
  Allgatherv); its gradient is this rank's rows.
- ``AllReduceSum`` sums several tensors of one dtype over the ranks, fused
  into one buffer (``transport.FusedSum``); its gradient is the same sum.

``collective_seconds`` counts the seconds spent inside them: what the
benchmark reports as the share of a step spent communicating.
"""
import hashlib
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
    have been handed alike (``checked`` names them).  One MPI Allgatherv
    moves it all as bytes, each rank's part headed by digests: of the
    gather (its function: ``call``, the title errors name, and ``serial``,
    its number among the functions the ranks agreed on; what it gathers;
    the inputs it checks), of its layout (rows per rank, bytes per row) and
    of each checked input.  A rank that runs another function at this
    step, or was handed a batch of another size or other inputs, stops
    every rank with RanksApartError naming it and the input.
    The Allgatherv waits within multigpu.mpi_timeout; once it has, every
    rank is known to run this step, and the step's other collectives wait
    as MPI's blocking ones do.

    The gradient of an output is its rows of this rank: of the output's
    gradient when what reads the output is computed alike on every rank
    (``replicated``, the loss), else of that gradient summed over the ranks
    (a statistic each rank uses for its own rows).
    """
    __props__ = ('rank', 'replicated', 'checked', 'call', 'serial', 'index')

    def __init__(self, rank, replicated=True, checked=(), call='a compiled function', serial=0,
                 index=0):
        self.rank = rank
        self.replicated = replicated
        self.checked = tuple(checked)
        self.call = call
        self.serial = serial
        self.index = index
        # The digest of this gather: of its function (title and number), of
        # its place among the function's gathers (``index``, in the order
        # the rewrite made them: the same on every rank), of what it gathers
        # and of the inputs it checks.  Ranks that run their gathers in
        # other orders stop, rather than swap rows of one layout.
        self.identity = _digest_of_text(repr((call, serial, index, replicated, self.checked)))

    def make_node(self, rows, *blocks_and_checked):
        rows = tensor.as_tensor_variable(rows)
        inputs = [tensor.as_tensor_variable(b) for b in blocks_and_checked]
        blocks = inputs[:len(inputs) - len(self.checked)]
        return gof.Apply(self, [rows] + inputs, [b.type() for b in blocks])

    def perform(self, node, inputs, outputs):
        from mpi4py import MPI
        comm, rank, size = world()
        rows = [int(r) for r in inputs[0]]
        blocks, checked = inputs[1:1 + len(outputs)], inputs[1 + len(outputs):]
        # Bytes one row of each block takes: the same on every rank.
        row_bytes = [int(np.prod(b.shape[1:], dtype=np.int64)) * b.dtype.itemsize
                     for b in blocks]
        header = np.concatenate([self.identity, _digest_of_text(repr((rows, row_bytes))),
                                 digests_of(checked)])
        started = time.perf_counter()
        per_rank = [header.size + r * sum(row_bytes) for r in rows]
        send = np.concatenate([header] + [np.ascontiguousarray(b).view(np.uint8).ravel()
                                          for b in blocks])
        if send.size != per_rank[rank]:
            raise RuntimeError(
                'AllGatherRows expected %d rows on rank %d, but received blocks of '
                '%s rows' % (rows[rank], rank, [b.shape[0] for b in blocks]))
        received = np.empty(sum(per_rank), np.uint8)
        try:
            collective(comm, 'Allgatherv',
                       ([send, MPI.BYTE], [received, (per_rank, None), MPI.BYTE]), self.call)
        except MPI.Exception as error:
            raise RanksApartError(
                'every MPI rank must make the same Keras calls with batches of the same size, '
                'but at this step of %s other ranks sent parts of another size than this rank '
                '(%d of %d, %d rows) expected (MPI: %s): a rank was handed a batch of another '
                'size, or ran another function' % (self.call, rank, size, sum(rows), error))
        # Rank r's part: its header (at the part's start, where a part of
        # another size than expected still puts it), then its rows of
        # block 0, of block 1, ...
        offsets = np.concatenate([[0], np.cumsum(per_rank)])
        self._compare([received[start:start + header.size] for start in offsets[:-1]],
                      sum(rows))
        for k, (block, out) in enumerate(zip(blocks, outputs)):
            pieces = []
            for r in range(size):
                start = offsets[r] + header.size + rows[r] * sum(row_bytes[:k])
                piece = received[start:start + rows[r] * row_bytes[k]]
                pieces.append(piece.view(block.dtype).reshape((rows[r],) + block.shape[1:]))
            out[0] = np.concatenate(pieces, axis=0)
        collective_seconds['allgather'] += time.perf_counter() - started

    def _compare(self, headers, batch_rows):
        """Stop, on every rank alike, at the first rank whose header (the
        gather's digest, its layout's, its inputs') differs from the one
        more than half the ranks hold, else from rank 0's."""
        rows = np.stack(headers).view(np.uint64)
        if (rows == rows[0]).all():
            return
        kinds, counts = np.unique(rows, axis=0, return_counts=True)
        majority = counts.max() * 2 > len(rows)
        agreed = kinds[int(np.argmax(counts))] if majority else rows[0]
        than = 'the other ranks' if majority else 'rank 0'
        for other, theirs in enumerate(rows):
            if np.array_equal(theirs, agreed):
                continue
            if theirs[0] != agreed[0]:
                raise RanksApartError(
                    'every MPI rank must make the same Keras calls, but at this step rank %d '
                    'of %d ran another compiled function than %s (this rank, %d, runs %s, '
                    'its gather %d), or the same function\'s gathers in another order; '
                    'call it on every rank, not under a test of the rank, with the same '
                    'THEANO_FLAGS' % (other, len(rows), than, self.rank, self.call, self.index))
            if theirs[1] != agreed[1]:
                raise RanksApartError(
                    'every MPI rank must be handed the same batch, but rank %d of %d was handed '
                    'a batch of another size than %s in %s (this rank, %d, holds %d rows); '
                    'hand every rank the same data' % (other, len(rows), than, self.call,
                                                       self.rank, batch_rows))
            name = self.checked[int(np.argmax(theirs[2:] != agreed[2:]))]
            raise RanksApartError(
                'every MPI rank must be handed the same batch, but rank %d of %d was handed '
                'another %s than %s in %s (its digest differs); hand every rank the same '
                'data in the same order (the same files, sorted; the same seed; no data '
                'sharded by rank: the shim shares each batch out over the ranks itself), or '
                'set THEANO_FLAGS=multigpu.mpi_check_inputs=False to train each rank on its '
                'share of the rows of its own batch (see the README)'
                % (other, len(rows), name, than, self.call))

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
                g, = AllReduceSum(1)(g, return_list=True)
            grads.append(g[start:start + block.shape[0]])
        return grads + [DisconnectedType()() for _ in self.checked]


def _digest_of_text(text):
    """8 bytes: a digest of ``text``."""
    return np.frombuffer(hashlib.blake2b(text.encode('utf8'), digest_size=8).digest(), np.uint8)


def digests_of(arrays):
    """64-bit XXH3 digests of each array's dtype, shape and bytes (about
    28 GB/s on one core), as bytes."""
    if not arrays:
        return np.empty(0, np.uint8)
    try:
        import xxhash
    except ImportError as error:
        raise ImportError(
            'theano_multigpu under MPI expects xxhash, to check that every rank was '
            'handed the same batch, but importing it failed (%s); install it (pip install '
            'xxhash), or set THEANO_FLAGS=multigpu.mpi_check_inputs=False' % error)
    digests = []
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
