"""What each Theano op does to the batch's rows: the rules
``rows.find_rows_meeting`` applies node by node.

A variable's ``Facts``:

- ``rows``: the axis its values hold the batch's rows on, or None;
- ``count``: for an integer computed from shapes, how it depends on the
  number of rows R: ``('count', d)`` for a scalar proportional to R**d
  (d = 0: independent of R, as ``x.shape[1]``; 1: ``x.shape[0]``, or
  ``prod(x.shape) // x.shape[1]``; None: some other dependence), and
  ``('shape', [d, ...])`` for a vector of such scalars;
- ``random``: it depends on a random draw;
- ``sized``: data made from a number that depends on R (``arange(R)``),
  which a replica would make from its own rows' count.

A rule returns the facts of the node's outputs and what it found: the
whole-batch operands (tensors made for the whole batch, met by the rows
elementwise: each replica takes its rows of them) and Checks (conditions
on shapes, asserted on each replica when only the run can tell); or a
string: why the rows meet there, with the facts of the outputs computed
over the whole batch where their rows stay on an axis (else none).  An op
no rule knows, with the rows among its inputs, is one where the rows
meet: splitting is exact only where it is known to be.
"""
import functools

__all__ = ['Facts', 'Check', 'NONE', 'is_random_draw', 'node_facts']


class Facts(object):
    __slots__ = ('rows', 'count', 'random', 'sized')

    def __init__(self, rows=None, count=None, random=False, sized=False):
        self.rows, self.count, self.random, self.sized = rows, count, random, sized

    @property
    def involved(self):
        """Whether the rows, their count or a random draw reach here."""
        return self.rows is not None or self.random or self.sized or _depends(self.count)


NONE = Facts()


class Check(object):
    """A condition on shapes the split is exact under, which Theano cannot
    decide before the run: each replica asserts it, ``why`` telling what
    it would mean to fail."""
    __slots__ = ('condition', 'why')

    def __init__(self, condition, why):
        self.condition, self.why = condition, why


def _depends(count):
    """Whether a count fact depends on the number of rows (or may)."""
    if count is None:
        return False
    degrees = [count[1]] if count[0] == 'count' else count[1]
    return degrees is None or any(d != 0 for d in degrees)   # None: unknown


def _const(variable):
    """The Python int of a constant scalar, or None."""
    from theano import tensor
    try:
        return int(tensor.get_scalar_constant_value(variable))
    except Exception:   # not constant
        return None


def is_random_draw(node):
    from theano.sandbox.rng_mrg import mrg_uniform_base
    return isinstance(node.op, mrg_uniform_base)


def _degree(facts, variable):
    """The degree in R of an integer scalar (0 for a constant or a number
    that no shape of the rows computes), or None."""
    if facts.count is not None:
        return facts.count[1] if facts.count[0] == 'count' else None
    if facts.rows is not None or facts.random or facts.sized:
        return None
    return 0


def node_facts(node, ins, per_slice, walk):
    """([Facts of each output], [(whole-batch operand, rows axis)]) of
    ``node`` whose inputs have the facts ``ins``, or (the outputs' facts
    over the whole batch, or [], why the rows meet there).  ``per_slice``:
    the rows may meet there per slice, by design (as BatchNormalization's
    statistics do with multigpu.batchnorm=local);
    ``walk(inputs, facts, outputs)`` checks an inner graph (a Scan's) and
    returns (its outputs' facts, whole-batch operands, synced nodes)."""
    if is_random_draw(node):
        # Of the batch's shape (its size counts the rows) or not.
        sized = any(f.involved for f in ins)
        return [Facts(), Facts(random=True, sized=sized)], []
    if any(f.count is not None for f in ins) and not any(f.rows is not None for f in ins):
        counted = _count_rule(node, ins)
        if counted is not None:
            return counted
    if not any(f.rows is not None for f in ins):
        return _unsplit(node, ins, per_slice)
    for kinds, rule in _rules():
        if isinstance(node.op, kinds):
            outs, found = rule(node, ins, per_slice, walk)
            if isinstance(found, str) or per_slice:
                return outs, found
            counted = _counted_operand(node, ins, found)
            return (outs, counted) if counted else (outs, found)
    return [], ('is an op theano_multigpu has no rule for, so it cannot tell whether the '
                'op keeps the batch\'s rows apart')


def _counted_operand(node, ins, whole):
    """Why ``node`` would differ on a replica through an operand made from
    the rows' count (a replica counts its own rows), or None.  Operands
    each replica takes its rows of (``whole``), and the shapes a reshape
    or an allocation judges itself, are fine."""
    from theano import tensor
    from theano.compile.ops import SpecifyShape
    from theano.tensor.opt import Assert
    sliced = set(id(item[0]) for item in whole if not isinstance(item, Check))
    shapes_judged = isinstance(node.op, (tensor.Reshape, tensor.Alloc, SpecifyShape, Assert))
    for k, (variable, facts) in enumerate(zip(node.inputs, ins)):
        if facts.rows is not None or id(variable) in sliced or (shapes_judged and k > 0):
            continue
        if _depends(facts.count):
            return 'uses K.shape(x)[0], the number of rows, as a number'
        if facts.sized:
            return ('meets the rows with a tensor made from the whole batch\'s shape (a '
                    'count, range or draw of it) other than row by row')
    return None


def _data(node, ins, rows):
    random = any(f.random for f in ins)
    return [Facts(rows=rows, random=random) for _ in node.outputs], []


# -- integers computed from shapes -------------------------------------------

def _count_rule(node, ins):
    """Facts of an op over shape integers, or None when it is not one."""
    from theano import scalar, tensor
    from theano.tensor import elemwise, subtensor
    from theano.tensor.opt import MakeVector
    op, out = node.op, node.outputs[0]
    if isinstance(op, MakeVector):
        return [Facts(count=('shape', [_degree(f, v) for f, v in zip(ins, node.inputs)]))], []
    if isinstance(op, tensor.Join) and out.ndim == 1:
        pieces = [_shape_degrees(f, v) for f, v in zip(ins[1:], node.inputs[1:])]
        joined = None if None in pieces else sum(pieces, [])
        return [Facts(count=('shape', joined))], []
    if isinstance(op, subtensor.Subtensor) and ins[0].count and ins[0].count[0] == 'shape':
        degrees = ins[0].count[1]
        entries = subtensor.get_idx_list(node.inputs, op.idx_list)
        if degrees is not None and len(entries) == 1:
            entry = entries[0]
            if isinstance(entry, slice):
                bounds = [None if e is None else _const(e)
                          for e in (entry.start, entry.stop, entry.step)]
                if all(b is not None or e is None for b, e in
                       zip(bounds, (entry.start, entry.stop, entry.step))):
                    return [Facts(count=('shape', degrees[slice(*bounds)]))], []
            elif _const(entry) is not None:
                return [Facts(count=('count', degrees[_const(entry)]))], []
        return [Facts(count=('count', None) if out.ndim == 0 else ('shape', None))], []
    if isinstance(op, elemwise.DimShuffle) and ins[0].count[0] == 'count':
        return [Facts(count=ins[0].count)], []
    if isinstance(op, elemwise.Elemwise) and not any(f.sized or f.random for f in ins):
        # Arithmetic on counts, in integers or floats (T.mean divides by
        # a float cast of the shape).
        if out.ndim == 0:
            degrees = [_degree(f, v) for f, v in zip(ins, node.inputs)]
            return [Facts(count=('count', _combine(op.scalar_op, degrees, scalar)))], []
        if len(ins) == 1 and ins[0].count[0] == 'shape':
            return [Facts(count=ins[0].count)], []
    if out.dtype.startswith('int') or out.dtype.startswith('uint'):
        degrees = [_degree(f, v) for f, v in zip(ins, node.inputs)]
        if isinstance(op, (tensor.ScalarFromTensor, tensor.TensorFromScalar)):
            return [Facts(count=('count', degrees[0]))], []
        shape_degrees = ins[0].count[1] if ins[0].count and ins[0].count[0] == 'shape' else None
        if isinstance(op, elemwise.CAReduce) and shape_degrees is not None and out.ndim == 0:
            if None in shape_degrees:
                degree = None
            elif isinstance(op.scalar_op, scalar.Mul):
                degree = sum(shape_degrees)
            elif isinstance(op.scalar_op, (scalar.Maximum, scalar.Minimum, scalar.Add)) \
                    and len(set(shape_degrees)) == 1:
                degree = shape_degrees[0]
            else:
                degree = None
            return [Facts(count=('count', degree))], []
    return None


def _shape_degrees(facts, variable):
    """The degrees of a shape vector's entries, or None when unknown."""
    if facts.count is not None:
        return facts.count[1] if facts.count[0] == 'shape' else None
    if facts.involved:
        return None
    try:
        from theano import tensor
        return [0] * tensor.get_vector_length(variable)
    except Exception:   # of unknown length
        return None


def _combine(scalar_op, degrees, scalar):
    """The degree of an integer scalar op's result."""
    if None in degrees:
        return None
    if isinstance(scalar_op, scalar.Mul):
        return sum(degrees)
    if isinstance(scalar_op, scalar.IntDiv) and len(degrees) == 2:
        # prod(x.shape) // x.shape[0] counts no rows; x.shape[0] // 2 is no
        # multiple of them.
        return 0 if degrees[0] == degrees[1] else None
    if isinstance(scalar_op, scalar.TrueDiv) and len(degrees) == 2:
        return degrees[0] - degrees[1]
    if isinstance(scalar_op, (scalar.Add, scalar.Sub, scalar.Maximum, scalar.Minimum,
                              scalar.Neg, scalar.Identity, scalar.Cast)):
        return degrees[0] if len(set(degrees)) == 1 else None
    return None


def _unsplit(node, ins, per_slice):
    """Facts of an op no rows reach: shapes, counts, draws, allocations."""
    from theano import tensor
    from theano.compile.ops import Shape, Shape_i
    random = any(f.random for f in ins)
    if isinstance(node.op, (Shape, Shape_i)) and not any(f.sized or f.count for f in ins):
        # The shape of data no rows reach (a draw of a fixed shape, as
        # Embedding's word dropout makes) does not count them.
        return [Facts(count=('shape', [0] * node.inputs[0].ndim) if isinstance(node.op, Shape)
                      else ('count', 0))], []
    if isinstance(node.op, (tensor.Alloc, tensor.AllocEmpty)):
        shape = ins[1:] if isinstance(node.op, tensor.Alloc) else ins
        shape_vars = node.inputs[1:] if isinstance(node.op, tensor.Alloc) else node.inputs
        degrees = [_degree(f, v) for f, v in zip(shape, shape_vars)]
        value_free = isinstance(node.op, tensor.AllocEmpty) or not ins[0].involved
        if degrees.count(1) == 1 and set(degrees) <= {0, 1} and value_free:
            # Zeros (or a constant) of the rows' count: each replica's own.
            return [Facts(rows=degrees.index(1))], []
        if any(d != 0 for d in degrees):
            return [Facts(sized=True, random=random)], []
        return [Facts(random=random, sized=any(f.sized for f in ins))], []
    sized = any(_depends(f.count) or f.sized for f in ins)
    # (Random: e.g. the inner steps of MRG's normal, of the batch's shape
    # when ``sized``: one draw for the whole batch, each replica its rows.)
    return [Facts(random=random, sized=sized) for _ in node.outputs], []


# -- ops the rows reach --------------------------------------------------------

def _split(ins):
    return [f.rows for f in ins if f.rows is not None]


def _whole_operands(node, ins, rows, operands, ndim=None):
    """Operands made for the whole batch (not from the rows: a random draw,
    a constant, ``arange`` of the rows' count) that meet the rows
    elementwise: each replica reads its rows of them."""
    ndim = node.outputs[0].ndim if ndim is None else ndim
    return [(v, rows) for v, f in operands
            if f.rows is None and v.ndim == ndim and not v.broadcastable[rows]
            and not f.count]


def _shape_rule(node, ins, per_slice, walk):
    from theano.compile.ops import Shape
    rows = ins[0].rows
    if isinstance(node.op, Shape):
        return [Facts(count=('shape', [1 if k == rows else 0
                                       for k in range(node.inputs[0].ndim)]))], []
    return [Facts(count=('count', 1 if rows == node.op.i else 0))], []


def _elemwise_rule(node, ins, per_slice, walk):
    rows = _split(ins)
    if len(set(rows)) > 1:
        return [], 'pairs rows held on different axes'
    outs, _ = _data(node, ins, rows[0])
    return outs, _whole_operands(node, ins, rows[0], zip(node.inputs, ins))


def _same_rows_rule(node, ins, per_slice, walk):
    """Ops that keep each value where it is, or handle each row alone."""
    from theano.tensor.nnet import nnet
    from theano.tensor.nnet.bn import AbstractBatchNormInference
    rows = ins[0].rows
    if rows is None or any(f.rows is not None for f in ins[1:]) and not isinstance(
            node.op, (AbstractBatchNormInference,)):
        return [], 'mixes the batch\'s rows with a tensor of other rows'
    if isinstance(node.op, (nnet.Softmax, nnet.SoftmaxWithBias, nnet.LogSoftmax)) and rows != 0:
        return [], 'normalises along the batch\'s rows'
    return _data(node, ins, rows)


def _alloc_rule(node, ins, per_slice, walk):
    """alloc(x, *shape): x broadcast to ``shape`` (T.repeat, K.rnn's
    initial states): its rows stay rows when no other entry of the shape
    counts them."""
    from theano import tensor
    shape_at = 1 if isinstance(node.op, tensor.Alloc) else 0
    rows = ins[0].rows
    if rows is None or any(f.rows is not None for f in ins[shape_at:]):
        return [], 'allocates a tensor shaped by the batch\'s values'
    rows += node.outputs[0].ndim - node.inputs[0].ndim
    degrees = [_degree(f, v) for f, v in zip(ins[shape_at:], node.inputs[shape_at:])]
    if any(d != 0 for k, d in enumerate(degrees) if k != rows):
        return [], 'allocates the batch\'s rows across other axes'
    return _data(node, ins, rows)


def _dimshuffle_rule(node, ins, per_slice, walk):
    order = list(node.op.new_order)
    rows = ins[0].rows
    return _data(node, ins, order.index(rows) if rows in order else None)


def _reduce_rule(node, ins, per_slice, walk):
    rows = ins[0].rows
    axis = node.op.axis
    axes = range(node.inputs[0].ndim) if axis is None else axis
    if rows in axes:
        if per_slice:
            return _data(node, ins, None)
        return [], 'reduces over the batch\'s rows (axis %d)' % rows
    return _data(node, ins, rows - sum(1 for a in axes if a < rows))


def _dot_rule(node, ins, per_slice, walk):
    a, b = ins
    last = node.inputs[0].ndim - 1   # a's contracted axis; b's is 0
    # Where an operand's rows stay in the product (over the whole batch, too).
    kept = _data(node, ins, a.rows if a.rows not in (None, last) else
                 last + b.rows - 1 if b.rows not in (None, 0) else None)[0]
    if a.rows is not None and b.rows is not None:
        return kept, 'multiplies rows with rows (a product over the batch)'
    if a.rows == last or b.rows == 0:
        return kept, 'contracts the batch\'s rows (a sum over the batch)'
    return kept, []


def _batched_dot_rule(node, ins, per_slice, walk):
    """a[i] . b[i] for each i of axis 0: exact when the rows are that axis
    of both, or an axis of a that the product keeps."""
    a, b = ins
    if [a.rows, b.rows] == [0, 0]:
        return _data(node, ins, 0)
    if b.rows is None and a.rows not in (None, 0, node.inputs[0].ndim - 1):
        return _data(node, ins, a.rows)
    return [], 'pairs the batch\'s rows with a tensor of other rows'


def _sort_rule(node, ins, per_slice, walk):
    axis = _const(node.inputs[1])
    if axis is None or axis % node.inputs[0].ndim == ins[0].rows:
        # (Sorted over the whole batch, the rows stay on their axis.)
        return _data(node, ins, ins[0].rows if axis is not None else None)[0], \
            'sorts along the batch\'s rows'
    return _data(node, ins, ins[0].rows)


def _cumulative_rule(node, ins, per_slice, walk):
    if node.op.axis is None or node.op.axis % node.inputs[0].ndim == ins[0].rows:
        return _data(node, ins, ins[0].rows if node.op.axis is not None else None)[0], \
            'accumulates along the batch\'s rows'
    return _data(node, ins, ins[0].rows)


def _repeat_rule(node, ins, per_slice, walk):
    rows, axis = ins[0].rows, node.op.axis
    if rows is None or ins[1].rows is not None or axis is None or (
            axis == rows and node.inputs[1].ndim != 0):
        return [], 'repeats the batch\'s rows by their position'
    return _data(node, ins, rows)


def _diagonal_rule(node, ins, per_slice, walk):
    """conv3d2d's diagonal views of x along axes i0 and i1 (constants), and
    their gradient, which adds ``amt`` into them (Keras 1.0's
    Convolution3D): rows stay apart when neither axis is theirs."""
    rows = ins[0].rows
    axes = [_const(v) for v in node.inputs[1:3]]
    if None in axes or rows in [a % node.inputs[0].ndim for a in axes]:
        return [], 'takes diagonals across the batch\'s rows'
    if any(f.rows != rows for f in ins[3:]):
        return [], 'mixes the batch\'s rows with a tensor of other rows'
    return _data(node, ins, rows)


def _join_rule(node, ins, per_slice, walk):
    axis = _const(node.inputs[0])
    rows = _split(ins[1:])
    if axis is None or axis % node.outputs[0].ndim in rows:
        return [], 'joins tensors along the batch\'s rows'
    if len(set(rows)) > 1:
        return [], 'pairs rows held on different axes'
    outs, _ = _data(node, ins, rows[0])
    return outs, _whole_operands(node, ins, rows[0], zip(node.inputs[1:], ins[1:]))


def _split_op_rule(node, ins, per_slice, walk):
    rows = ins[0].rows
    axis = _const(node.inputs[1])
    if rows is None or axis is None or axis % node.inputs[0].ndim == rows:
        return [], 'splits the batch\'s rows'
    return _data(node, ins, rows)


def _rows_after_index(idx_list, rows):
    """The rows' axis after indexing with ``idx_list``, or None when the
    index takes some of the rows."""
    removed = 0
    for axis, entry in enumerate(idx_list):
        if axis == rows:
            return rows - removed if entry == slice(None, None, None) else None
        removed += 0 if isinstance(entry, slice) else 1
    return rows - removed


def _subtensor_rule(node, ins, per_slice, walk):
    if ins[0].rows is None:   # the rows reach only an index
        return [], 'indexes a tensor with the batch\'s values'
    rows = _rows_after_index(node.op.idx_list, ins[0].rows)
    if rows is None:
        return [], 'indexes along the batch\'s rows'
    return _data(node, ins, rows)


def _inc_subtensor_rule(node, ins, per_slice, walk):
    """x[index] = y (or +=): each replica writes its rows of y into its rows
    of x, where the index keeps x's rows whole."""
    x, y = ins[0], ins[1]
    if x.rows is None or any(f.rows is not None for f in ins[2:]):
        return [], 'writes the batch\'s rows into a tensor of other rows'
    rows = _rows_after_index(node.op.idx_list, x.rows)
    if rows is None:
        return [], 'indexes along the batch\'s rows'
    indexed = node.inputs[0].ndim - sum(1 for e in node.op.idx_list if not isinstance(e, slice))
    expected = rows - (indexed - node.inputs[1].ndim)   # y broadcasts from the right
    if y.rows is not None and y.rows != expected:
        return [], 'pairs rows held on different axes'
    whole = []
    if y.rows is None and expected >= 0:
        whole = _whole_operands(node, ins, expected, [(node.inputs[1], y)],
                                ndim=node.inputs[1].ndim)
    outs, _ = _data(node, ins, x.rows)
    return outs, whole


def _take_rule(node, ins, per_slice, walk):
    """AdvancedSubtensor1: x[indices] along axis 0 (K.gather, Embedding)."""
    x, indices = ins[0], ins[1]
    if x.rows == 0:
        return [], 'indexes along the batch\'s rows'
    if x.rows is not None and indices.rows is not None:
        return [], 'pairs rows held on different axes'
    if indices.rows is not None:
        return _data(node, ins, indices.rows)
    return _data(node, ins, x.rows)


def _conv_rule(node, ins, per_slice, walk):
    from theano.tensor.nnet.abstract_conv import (AbstractConv2d_gradInputs,
                                                  AbstractConv3d_gradInputs)
    data = 1 if isinstance(node.op, (AbstractConv2d_gradInputs,
                                     AbstractConv3d_gradInputs)) else 0
    filters = 1 - data
    if ins[data].rows != 0 or ins[filters].rows is not None \
            or any(f.rows is not None for f in ins[2:]):
        return [], 'convolves over the batch\'s rows'
    return _data(node, ins, 0)


def _pool_rule(node, ins, per_slice, walk):
    rows = ins[0].rows
    if rows is None or rows >= node.inputs[0].ndim - node.op.ndim \
            or any(f.rows is not None for f in ins[1:]):
        return [], 'pools over the batch\'s rows'
    return _data(node, ins, rows)


def _reshape_rule(node, ins, per_slice, walk):
    """Exact when each row keeps a block of its own: the input, seen as
    (P, rows, S) around its rows' axis, becomes (P, -1 or a multiple of the
    rows' count, sizes that do not depend on it), with the same P (as
    Flatten, Reshape, TimeDistributed, T.tile and LocallyConnected write
    it).  Each replica's block is then the whole batch's block of its rows."""
    rows = ins[0].rows
    degrees = ins[1].count[1] if ins[1].count and ins[1].count[0] == 'shape' else None
    if degrees is None and not ins[1].involved:
        degrees = [0] * node.outputs[0].ndim   # a constant or per-row shape
    entries = _shape_entries(node.inputs[1], node.outputs[0].ndim)
    why = 'reshapes the batch\'s rows across other axes'
    if ins[1].rows is not None or degrees is None or None in degrees:
        return [], why
    counting = [k for k, d in enumerate(degrees) if d == 1]
    if len(counting) > 1 or any(d not in (0, 1) for d in degrees):
        return [], why
    new_rows = counting[0] if counting else (entries.index(-1) if -1 in entries else None)
    if new_rows is None:
        return [], why
    if -1 in entries[:new_rows]:
        return [], why
    outs, _ = _data(node, ins, new_rows)
    before_in = _static_product(node.inputs[0], rows)
    before_out = entries[:new_rows]
    if before_in is not None and None not in before_out:
        if _product(before_out) != before_in:
            return [], why
        return outs, []
    # Theano cannot tell P before the run: each replica checks it.
    from theano import tensor
    same = tensor.eq(tensor.prod(node.inputs[0].shape[:rows]),
                     tensor.prod(node.inputs[1][:new_rows]))
    return outs, [Check(same, why)]


def _product(values):
    result = 1
    for value in values:
        result *= value
    return result


def _shape_entries(shape, ndim):
    """The constant entries of a shape vector (None where not constant)."""
    from theano import tensor
    from theano.tensor.opt import MakeVector
    if shape.owner is not None and isinstance(shape.owner.op, MakeVector):
        return [_const(v) for v in shape.owner.inputs]
    try:
        return [int(v) for v in tensor.get_scalar_constant_value(shape, elemwise=False)]
    except Exception:   # not a constant vector
        pass
    data = getattr(shape, 'data', None)
    return [int(v) for v in data] if data is not None else [None] * ndim


def _static_product(variable, axes):
    """The product of ``variable``'s first ``axes`` sizes where Theano's
    shape inference finds them constant, else None."""
    if axes == 0 or all(variable.broadcastable[:axes]):
        return 1
    from theano import gof
    from theano.tensor.opt import ShapeFeature
    graph = gof.FunctionGraph(gof.graph.inputs([variable]), [variable],
                              features=[ShapeFeature()], clone=True)
    sizes = [_const(s) for s in graph.shape_feature.shape_of[graph.outputs[0]][:axes]]
    return None if None in sizes else _product(sizes)


def _ifelse_rule(node, ins, per_slice, walk):
    if ins[0].rows is not None:
        return [], 'chooses by a value of the batch\'s rows'
    n = node.op.n_outs
    outs = []
    for then, other in zip(ins[1:1 + n], ins[1 + n:]):
        if then.rows is not None and other.rows is not None and then.rows != other.rows \
                or (then.rows is None) != (other.rows is None):
            return [], 'chooses between tensors with and without the batch\'s rows'
        outs.append(Facts(rows=then.rows, random=then.random or other.random,
                          sized=then.sized or other.sized))
    return outs, []


def _scan_rule(node, ins, per_slice, walk):
    """A loop over axis 0 of its sequences (K.rnn: time-major): exact when
    the rows are not that axis and its step function keeps rows apart."""
    from theano.scan_module.scan_utils import scan_args
    args = scan_args(node.inputs, node.outputs, node.op.inputs, node.op.outputs, node.op.info)
    facts = dict((id(v), f) for v, f in zip(node.inputs, ins))

    def of(variable):
        return facts.get(id(variable), NONE)
    if args.outer_in_mit_mot or _degree(of(args.n_steps), args.n_steps) != 0:
        return [], 'loops over the batch\'s rows'
    inner = []
    for outer, inners in zip(args.outer_in_seqs + args.outer_in_mit_sot + args.outer_in_sit_sot,
                             [[v] for v in args.inner_in_seqs] + args.inner_in_mit_sot
                             + [[v] for v in args.inner_in_sit_sot]):
        f = of(outer)
        if f.rows == 0:
            return [], 'loops over the batch\'s rows'
        for v in inners:
            inner.append((v, Facts(rows=None if f.rows is None else f.rows - 1,
                                   random=f.random, sized=f.sized)))
    for outer, v in zip(args.outer_in_shared + args.outer_in_non_seqs,
                        args.inner_in_shared + args.inner_in_non_seqs):
        inner.append((v, of(outer)))
    inner_outs = (args.inner_out_mit_sot + args.inner_out_sit_sot + args.inner_out_nit_sot
                  + args.inner_out_shared)
    found = walk([v for v, _ in inner], [f for _, f in inner], inner_outs)
    if isinstance(found, str):
        return [], found
    out_facts, whole, synced = found
    if whole or synced:
        return [], ('reads, inside its loop, a tensor made for the whole batch, the '
                    'whole batch\'s statistics, or a shape only the run can check')
    recurrent = args.inner_in_mit_sot + [[v] for v in args.inner_in_sit_sot]
    carried = dict((id(v), f) for v, f in inner)
    for taps, out in zip(recurrent, out_facts):
        if any(carried[id(v)].rows != out.rows for v in taps):
            return [], 'carries the batch\'s rows from step to step on another axis'
    looped = len(args.inner_out_mit_sot + args.inner_out_sit_sot + args.inner_out_nit_sot)
    outs = [Facts(rows=None if f.rows is None else f.rows + 1, random=f.random, sized=f.sized)
            for f in out_facts[:looped]]
    outs += [Facts(rows=f.rows, random=f.random, sized=f.sized) for f in out_facts[looped:]]
    return outs, []


@functools.lru_cache(maxsize=None)
def _rules():
    """The rules, built at first use (Theano's modules load late)."""
    from theano import gradient, tensor
    from theano.compile import ops
    from theano.gpuarray import basic_ops as gpu_ops
    from theano.ifelse import IfElse
    from theano.scan_module.scan_op import Scan
    from theano.tensor import blas, elemwise, extra_ops, subtensor
    from theano.tensor.nnet import abstract_conv, bn, conv3d2d, nnet
    from theano.tensor.opt import Assert
    from theano.tensor.signal.pool import Pool
    from theano.tensor.sort import ArgSortOp, SortOp

    from .transfer import ToContext
    return [
        ((ops.Shape, ops.Shape_i), _shape_rule),
        (elemwise.Elemwise, _elemwise_rule),
        (elemwise.DimShuffle, _dimshuffle_rule),
        ((elemwise.CAReduce, tensor.MaxAndArgmax, tensor.Argmax), _reduce_rule),
        (tensor.Dot, _dot_rule),
        (blas.BatchedDot, _batched_dot_rule),
        ((SortOp, ArgSortOp), _sort_rule),
        (extra_ops.CumOp, _cumulative_rule),
        (extra_ops.RepeatOp, _repeat_rule),
        (tensor.Join, _join_rule),
        (tensor.Split, _split_op_rule),
        (subtensor.Subtensor, _subtensor_rule),
        (subtensor.IncSubtensor, _inc_subtensor_rule),
        (subtensor.AdvancedSubtensor1, _take_rule),
        ((conv3d2d.DiagonalSubtensor, conv3d2d.IncDiagonalSubtensor), _diagonal_rule),
        ((abstract_conv.AbstractConv2d, abstract_conv.AbstractConv3d,
          abstract_conv.AbstractConv2d_gradInputs, abstract_conv.AbstractConv3d_gradInputs),
         _conv_rule),
        (Pool, _pool_rule),
        (tensor.Reshape, _reshape_rule),
        (tensor.Alloc, _alloc_rule),
        (IfElse, _ifelse_rule),
        (Scan, _scan_rule),
        ((ops.ViewOp, ops.DeepCopyOp, ops.Rebroadcast, ops.SpecifyShape,
          gradient.UndefinedGrad, gradient.DisconnectedGrad, Assert,
          nnet.Softmax, nnet.SoftmaxWithBias, nnet.LogSoftmax,
          bn.AbstractBatchNormInference, gpu_ops.GpuFromHost, gpu_ops.HostFromGpu,
          gpu_ops.GpuToGpu, ToContext), _same_rows_rule),
    ]

