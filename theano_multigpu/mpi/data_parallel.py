"""Data parallelism over the ranks: each rank computes its share of every
batch, the ranks' rows are joined, and the gradients summed.

Under ``mpirun`` (or SLURM's ``srun``) every rank runs the user's unchanged
script and Keras hands every rank the same batch.  ``RankGather`` is the
batch-wise rewrite's gather across ranks: each rank's contexts (or its
host, or its layer-wise graph) compute its share of the rows,
``AllGatherRows`` joins the ranks' rows of the layer outputs the loss
reads, so loss, metrics and state updates are computed on the whole batch,
identically on every rank (and of what batch normalisation's statistics
and the ops where the rows meet read, which every rank then computes over
the whole batch for its rows), and ``AllReduceSum`` sums the ranks' weight
gradients, so the optimizer's updates are identical on every rank too.
"""
from collections import OrderedDict

from theano import gof, tensor
from theano.gradient import DisconnectedType, disconnected_grad

from ..graph.gradients import by_loss, host_gradient, theano_grad
from ..graph.replace import replaced
from ..graph.rows import slice_bounds
from .ops import AllGatherRows, AllReduceSum
from .world import world

__all__ = ['RankGather', 'all_gather_rows', 'sum_over_ranks', 'data_parallel_gradients']


class RankGather(object):
    """The batch-wise gather across MPI ranks (see ``graph.batchwise``):
    rank ``rank`` of ``size`` computes its share of the rows.  ``idle``:
    its share is empty (fewer rows than ranks); kernels refuse empty
    operands, so it computes the first row and contributes none.
    ``call`` and ``serial``: the function every rank runs, its title and
    number; ``checked``: its inputs, which every rank must be handed alike
    (checked at each step by the join of what the loss reads, which runs
    at every step, see AllGatherRows)."""

    def __init__(self, rank, size, idle=False, call='a compiled function', serial=0,
                 checked=()):
        self.rank, self.size, self.idle = rank, size, idle
        self.call, self.serial = call, serial
        self._checked = list(checked)
        self._joins = 0   # the gathers made so far: the next one's index

    def replica_bounds(self, batch_size, replicas):
        if self.idle:
            return [(0, 1)]
        start, stop = slice_bounds(batch_size, self.size)[self.rank]
        return [(start + a, start + b) for a, b in slice_bounds(stop - start, replicas)]

    def join(self, joined_here, batch_size, replicated=True, one_per_rank=False):
        if self.idle:
            joined_here = [rows[:0] for rows in joined_here]
        rows = [stop - start for start, stop in slice_bounds(batch_size, self.size)]
        if one_per_rank:   # (an idle rank sends none)
            rows = [tensor.minimum(count, 1) for count in rows]
        # Batch normalisation's statistics (not replicated) are gathered
        # where the layer trains alone: not at every step.
        checked = []
        if replicated:
            checked, self._checked = self._checked, []
        self._joins += 1
        return all_gather_rows(joined_here, rows, replicated, checked, self.call, self.serial,
                               self._joins - 1)

    def gradients(self, stand_ins, replace, wrt=None):
        return data_parallel_gradients(stand_ins, replace, wrt)


def all_gather_rows(blocks, rows_per_rank, replicated=True, checked=(),
                    call='a compiled function', serial=0, index=0):
    """The whole batch's rows of each of ``blocks`` (this rank's rows),
    from every rank; ``rows_per_rank`` lists the rows each rank holds;
    ``replicated``, ``checked`` (inputs every rank must hold alike),
    ``call``, ``serial`` and ``index``: see AllGatherRows."""
    rank = world()[1]
    names = tuple(v.name or 'input %d' % k for k, v in enumerate(checked))
    gather = AllGatherRows(rank, replicated, names, call, serial, index)
    return gather(tensor.stack(rows_per_rank).astype('int64'), *(list(blocks) + list(checked)),
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


def data_parallel_gradients(stand_ins, replace, wrt=None):
    """{stand-in: gradient of its loss over the whole global batch}.

    ``replace`` rewrites the loss to read the outputs of ``AllGatherRows``
    (the cut).  One backward pass, in two parts: from the loss down to the
    cut, and to what the loss reads of a weight directly (a regulariser),
    the same on every rank; then from the cut, its gradients known
    (``known_grads``), down to the weights.  Through the gathers a rank's
    gradient covers its own rows only: those parts are summed over the
    ranks, and the direct parts added after the sum, not counted once per
    rank.
    """
    parts, gathered = [], []   # (stand-in, through the cut, direct)
    for loss, group in by_loss(stand_ins).items():
        rewritten = replaced([loss], replace)[0]
        cut = [out for node in gof.graph.io_toposort(gof.graph.inputs([rewritten]), [rewritten])
               if isinstance(node.op, AllGatherRows) for out in node.outputs]
        params = [s.tag.multigpu_gradient.param for s in group]
        params = [wrt(p) for p in params] if wrt else params
        floats = [c for c in cut if c.dtype in tensor.continuous_dtypes]
        above = theano_grad(rewritten, params + floats, consider_constant=cut,
                            disconnected_inputs='ignore', return_disconnected='Disconnected')
        through = _from_the_cut(params, [(c, _as_partial(c, g))
                                         for c, g in zip(floats, above[len(params):])
                                         if _connected(g)])
        for stand_in, param, t, d in zip(group, params, through, above):
            if not (_connected(t) or _connected(d)):
                d = tensor.zeros_like(param)
            parts.append((stand_in, host_gradient(t) if _connected(t) else None,
                          host_gradient(d) if _connected(d) else None))
        gathered += cut
    summed = iter(sum_over_ranks([t for _, t, _ in parts if t is not None], after=gathered))
    gradients = {}
    for stand_in, t, d in parts:
        total = next(summed) if t is not None else None
        gradients[stand_in] = tensor.as_tensor_variable(
            d if total is None else total if d is None else total + d)
    return gradients


def _as_partial(gathered, gradient):
    """The loss's own gradient of a gather's output, as that gather's grad
    takes it.  The loss is computed alike on every rank, so this gradient
    is the same on every rank; a gather that is not ``replicated`` sums its
    output's gradient over the ranks (its readers each compute for their
    own rows), so it is given each rank's equal share of it."""
    if gathered.owner.op.replicated:
        return gradient
    return gradient / world()[2]


def _from_the_cut(params, known):
    """The gradients of ``params`` from the cut's outputs, whose gradients
    ``known`` lists ((output, gradient)): Theano's ``known_grads``.  A known
    gradient is the whole gradient of its variable, so an output that
    another gather reads (below it) has its own part entered as the
    gradient of a product with it instead, added to what comes from above."""
    if not known:
        return [None] * len(params)
    below = set(gof.graph.ancestors([i for c, _ in known for i in c.owner.inputs]))
    nested = [(c, g) for c, g in known if c in below]
    terms = [(c * disconnected_grad(g)).sum() for c, g in nested]
    cost = sum(terms[1:], terms[0]) if terms else None
    return theano_grad(cost, params, known_grads=OrderedDict(
                           (c, g) for c, g in known if c not in below),
                       disconnected_inputs='ignore', return_disconnected='Disconnected')


def _connected(gradient):
    return gradient is not None and not isinstance(gradient.type, DisconnectedType)
