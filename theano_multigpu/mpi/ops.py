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
from .world import world

__all__ = ['AllGatherRows', 'AllReduceSum', 'collective_seconds']

# Seconds spent inside the collectives since the process started, by op.
collective_seconds = {'allgather': 0.0, 'allreduce': 0.0}


class AllGatherRows(gof.Op):
    """Each rank's row blocks of several tensors, joined in rank order.

    Inputs: the rows each rank contributes (an int64 vector, the same on
    every rank), then this rank's blocks.  One MPI Allgatherv moves all the
    blocks as bytes.  The gradient of an output is its rows of this rank:
    of the output's gradient when what reads the output is computed alike
    on every rank (``replicated``, the loss), else of that gradient summed
    over the ranks (a statistic each rank uses for its own rows).
    """
    __props__ = ('rank', 'replicated')

    def __init__(self, rank, replicated=True):
        self.rank = rank
        self.replicated = replicated

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
                continue
            if not self.replicated:
                g, = AllReduceSum(1)(g, return_list=True)
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
