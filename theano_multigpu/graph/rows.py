"""The batch's rows: how they are shared among replicas and ranks, and where
in a graph they meet.

Splitting a batch over replicas is exact only where each row of an output
depends on its own row of the input.  ``find_rows_meeting`` walks the part
of a graph each replica computes, from the batch inputs to the frontier,
and tracks for each variable on which axis the batch's rows lie.  Ops that
make rows meet there (a reduction, cumulative op, sort, join or index along
the rows; a product contracting them or pairing them; ``K.shape(x)[0]``
used as a number) raise RowsMeetError, naming the op and its layer, before
anything is compiled.  A tensor made for the whole batch without reading its
rows (a random draw of the batch's shape, a constant of a fixed batch size)
that meets the rows elementwise is returned: each replica takes its rows of
it, so it is the tensor one context would use.
"""
from ..errors import RowsMeetError

__all__ = ['slice_bounds', 'find_rows_meeting']


def slice_bounds(batch_size, parts):
    """[(start, stop)] of each of ``parts`` shares of ``batch_size`` rows:
    contiguous, in order, differing by at most one row; some are empty when
    there are fewer rows than parts.  Symbolic when ``batch_size`` is."""
    return [((i * batch_size) // parts, ((i + 1) * batch_size) // parts)
            for i in range(parts)]


# A variable's facts: ``rows`` (the axis its values hold the batch's rows
# on, or None), ``meta`` (it is computed from the shape of such a value:
# ROW_COUNT when it is the number of rows), ``random`` (it depends on a
# random draw).
ROW_COUNT = 'row count'


class _Facts(object):
    __slots__ = ('rows', 'meta', 'random')

    def __init__(self, rows=None, meta=None, random=False):
        self.rows, self.meta, self.random = rows, meta, random


_NONE = _Facts()


def _const(variable):
    """The Python value of a constant scalar, or None."""
    from theano import tensor
    try:
        return int(tensor.get_scalar_constant_value(variable))
    except Exception:   # not constant
        return None


def find_rows_meeting(batch_inputs, frontier, describe, sync_batchnorm=True):
    """Check the graph from ``batch_inputs`` (rows on axis 0) to
    ``frontier``; returns (whole, synced):

    - ``whole``: [(variable, rows axis)], tensors made for the whole batch
      that the rows meet elementwise (see the module docstring);
    - ``synced``: the batch normalisation nodes (Theano's
      AbstractBatchNormTrain) whose statistics span the rows: with
      ``sync_batchnorm`` they must be the whole batch's; otherwise each
      replica's rows are its batch, by choice (multigpu.batchnorm=local).

    ``describe(node)`` -> (layer name or None, whether rows may meet there
    per slice, as BatchNormalization's statistics do by design).
    Raises RowsMeetError at the first op that makes rows meet.
    """
    from theano import gof
    from theano.tensor.nnet.bn import AbstractBatchNormTrain
    facts = dict((id(v), _Facts(rows=0)) for v in batch_inputs)
    whole, synced = [], []

    def of(variable):
        return facts.get(id(variable), _NONE)

    for node in gof.graph.io_toposort(gof.graph.inputs(frontier), frontier):
        ins = [of(v) for v in node.inputs]
        if not any(f.rows is not None or f.meta or f.random for f in ins) \
                and not _is_random_draw(node):
            continue
        layer, per_slice = describe(node)
        if isinstance(node.op, AbstractBatchNormTrain) and ins[0].rows in node.op.axes:
            # The output keeps the rows; mean and 1/std span them.
            if sync_batchnorm:
                synced.append(node)
            facts[id(node.outputs[0])] = _Facts(rows=ins[0].rows)
            continue
        outs, found = _node_facts(node, ins, per_slice)
        if isinstance(found, str):
            raise RowsMeetError(_message(node, layer, found))
        whole += found
        for variable, fact in zip(node.outputs, outs):
            facts[id(variable)] = fact
    return whole, synced


def _message(node, layer, why):
    where = 'in layer %r' % layer if layer else 'outside any layer'
    return ('batch-wise mode splits each batch\'s rows over the contexts, so the ops '
            'before the loss must keep each row apart, but %s %s %s: on one device it '
            'sees the whole batch, on several contexts each would see only its '
            'rows, and the numbers would differ. Compute it in the loss, run on one '
            'context (THEANO_FLAGS multigpu.contexts=dev0) or layer-wise '
            '(multigpu.mode=layer).' % (node.op, where, why))


def _is_random_draw(node):
    from theano.sandbox.rng_mrg import mrg_uniform_base
    return isinstance(node.op, mrg_uniform_base)


def _node_facts(node, ins, per_slice):
    """([facts of each output], whole-batch operands found or a reason the
    rows meet)."""
    from theano import tensor
    from theano.compile.ops import Shape, Shape_i
    from theano.ifelse import IfElse
    from theano.tensor import elemwise, extra_ops, subtensor
    from theano.tensor.sort import ArgSortOp, SortOp
    from theano.tensor.nnet.abstract_conv import BaseAbstractConv
    from theano.tensor.opt import MakeVector
    op = node.op
    random = any(f.random for f in ins) or _is_random_draw(node)
    split = [(i, f.rows) for i, f in enumerate(ins) if f.rows is not None]
    meta = next((f.meta for f in ins if f.meta), None)

    def data(rows):
        return [_Facts(rows=rows, random=random)] * len(node.outputs), []

    if _is_random_draw(node):
        return [_Facts(), _Facts(random=True)], []
    if isinstance(op, Shape_i):
        rows = ins[0].rows
        return [_Facts(meta=ROW_COUNT if rows == op.i else 'shape')], []
    if isinstance(op, Shape):
        return [_Facts(meta=('shape', ins[0].rows))], []
    floats = node.outputs[0].dtype.startswith('float')
    row_count_in = any(f.meta == ROW_COUNT for f in ins)
    if isinstance(op, subtensor.Subtensor) and isinstance(ins[0].meta, tuple):
        # shape(x)[k]: the row count when k is x's rows axis
        index = _const(node.inputs[1]) if len(node.inputs) > 1 else None
        return [_Facts(meta=ROW_COUNT if index == ins[0].meta[1] else 'shape')], []
    if isinstance(op, elemwise.Elemwise) and row_count_in and floats and not per_slice:
        return [], 'uses K.shape(x)[0], the number of rows, as a number'
    if not split:
        if isinstance(op, MakeVector):
            meta = ('shape', next((k for k, f in enumerate(ins) if f.meta == ROW_COUNT), None))
        elif isinstance(op, (tensor.ScalarFromTensor, tensor.TensorFromScalar)) or (
                isinstance(op, elemwise.Elemwise) and not floats):
            meta = ROW_COUNT if row_count_in else (meta and 'shape')
        else:   # e.g. an Alloc of a shape that counts rows: each replica its own
            meta = meta and 'shaped'
        return [_Facts(random=random, meta=meta)] * len(node.outputs), []
    rows = split[0][1]

    if isinstance(op, elemwise.Elemwise):
        if any(r != rows for _, r in split):
            return [], 'pairs rows held on different axes'
        whole = [(v, rows) for v, f in zip(node.inputs, ins)
                 if f.rows is None and v.ndim == node.outputs[0].ndim
                 and not v.broadcastable[rows] and (f.random or not f.meta)]
        return data(rows)[0], whole
    if isinstance(op, elemwise.DimShuffle):
        order = list(op.new_order)
        return data(order.index(rows) if rows in order else None)
    if isinstance(op, (elemwise.CAReduce, tensor.MaxAndArgmax)):
        axes = range(node.inputs[0].ndim) if op.axis is None else op.axis
        if rows in axes:
            if per_slice:
                return data(None)
            return [], 'reduces over the batch\'s rows (axis %d)' % rows
        return data(rows - sum(1 for a in axes if a < rows))
    if isinstance(op, tensor.Dot):
        (a, b) = ins
        if a.rows is not None and b.rows is not None:
            return [], 'multiplies rows with rows (a product over the batch)'
        if a.rows == 1 or b.rows == 0:
            return [], 'contracts the batch\'s rows (a sum over the batch)'
        return data(a.rows if a.rows is not None else node.inputs[0].ndim - 1 + b.rows - 1)
    if isinstance(op, (SortOp, ArgSortOp)):
        axis = _const(node.inputs[1])
        if axis is None or axis % node.inputs[0].ndim == rows:
            return [], 'sorts along the batch\'s rows'
        return data(rows)
    if isinstance(op, extra_ops.CumOp):
        if op.axis is None or op.axis % node.inputs[0].ndim == rows:
            return [], 'accumulates along the batch\'s rows'
        return data(rows)
    if isinstance(op, tensor.Join):
        axis = _const(node.inputs[0])
        if axis is None or axis % node.outputs[0].ndim == rows:
            return [], 'joins tensors along the batch\'s rows'
        whole = [(v, rows) for v, f in zip(node.inputs[1:], ins[1:])
                 if f.rows is None and not v.broadcastable[rows] and (f.random or not f.meta)]
        return data(rows)[0], whole
    if isinstance(op, subtensor.Subtensor):
        if split[0][0] != 0:
            return data(rows)
        removed = 0
        for axis, entry in enumerate(op.idx_list):
            full = isinstance(entry, slice) and entry == slice(None, None, None)
            if axis == rows:
                if not full:
                    return [], 'indexes along the batch\'s rows'
                break
            removed += 0 if isinstance(entry, slice) else 1
        return data(rows - removed)
    if isinstance(op, (subtensor.AdvancedSubtensor1, subtensor.AdvancedSubtensor)):
        if ins[0].rows == 0:
            return [], 'indexes along the batch\'s rows'
        return data(ins[0].rows if ins[0].rows is not None else split[0][1])
    if isinstance(op, BaseAbstractConv):
        if ins[0].rows != 0 or (len(ins) > 1 and ins[1].rows is not None):
            return [], 'convolves over the batch\'s rows'
        return data(0)
    if isinstance(op, IfElse):
        return data(rows)
    # Any other op (softmax, pooling, reshape, scan, ...): its outputs hold
    # the rows where its first split input does.
    return data(rows)
