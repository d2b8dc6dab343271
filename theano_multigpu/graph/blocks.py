"""Updates of weights cut into blocks of rows: the new value of each block,
computed from that block of the weight, its gradient and its optimizer state.

A weight, its gradient and its state (Adam's moments, a momentum) are "cut
leaves": each is split along its first axis at its own bounds, [(start,
stop)] per block, every leaf of a function into the same number of blocks
N.  ``split_updates`` takes Keras's update pairs ``(X, X_new)`` on the host
and builds, for each cut X and block k, X_new's rows X's [start_k, stop_k)
from the variables that stand for block k of the cut leaves
(``block_leaf(leaf, k)``).  One ``Blocks`` serves every cut weight of a
function: each variable is rebuilt once per (block k, bounds) and once
whole, so a value shared by all the updates (Keras's clipnorm norm over
every gradient) is built once.

The rows of a variable are those of the cut leaves it reads along its first
axis (through any op but a value that is a scalar or broadcast along the
first axis, and a reduction over the first axis).  Block k of a variable is
built at the bounds of the update's X (the block being built):

- the rows of the leaves a variable reads must be cut at those bounds: a
  variable whose inputs read cut leaves at different bounds (an Elemwise
  adding a 7-row weight's gradient to a 5-row one's) or at bounds other
  than X's is ``NotBlockable``, naming both leaves and their bounds;
- a cut leaf: ``block_leaf(leaf, k)``;
- a variable that reads no cut leaf: itself where it is a scalar or
  broadcast along the first axis, else its rows ``x[start:stop]`` at X's
  bounds (the same variable may be sliced at each update's bounds);
- a variable that reads a cut leaf and is a scalar or broadcast along the
  first axis (a global gradient norm for ``clipnorm``, MaxNorm's column
  norms): the same for every block, its ``whole`` value (below);
- Elemwise: the op on the blocks of its inputs (an input broadcast along the
  first axis is read whole);
- DimShuffle that keeps the first axis first, and a reduction (CAReduce,
  MaxAndArgmax) over other axes: the op on the block of its input;
- anything else (a dot, reshape, subtensor, join or sort across the rows, an
  op with no rule): ``NotBlockable`` (the caller keeps the weight whole, or
  updates a weight split before whole on the master).

``whole(x)``, the value of x read in full, for x that reads cut leaves,
built once per ``Blocks`` and shared by every update that reads it:
a sum, product, max or min over axes including the first is the same
reduction of the partial reductions of the N blocks of its input, each
block at the bounds of the leaves that input reads along its rows (of the
one row, where its input is broadcast along the first axis; the op on its
whole input, where that input reads cut leaves only through whole values; a
Mean or another reduction with more than its scalar op is refused);
Elemwise, DimShuffle and reductions over other axes are the op on the whole
of their inputs, unless an input is a cut leaf; any other op is
``NotBlockable``.
"""
import functools

from theano import gof, scalar, tensor
from theano.tensor.elemwise import CAReduce, DimShuffle, Elemwise

from .rows import checked_bounds

__all__ = ['NotBlockable', 'split_updates', 'Blocks']

# The key of a variable's whole value, beside its blocks (k, bounds).
WHOLE = 'whole'
# Reductions whose partial results per block combine into the whole one
# with the same scalar op.
COMBINABLE = (scalar.add, scalar.mul, scalar.maximum, scalar.minimum)
# The reductions that are their scalar op folded over the axes and nothing
# more (a Mean is a Sum divided by a count: its partials do not add up).
COMBINED_CLASSES = (CAReduce, tensor.elemwise.Sum, tensor.elemwise.Prod, tensor.MaxAndArgmax)


class NotBlockable(ValueError):
    """An update of a cut weight needs more than its own block of rows: the
    message names the op, the weight and why; ``weight`` is the weight (the
    update's variable), ``op`` the op refused (None for a leaf)."""

    def __init__(self, message, weight=None, op=None):
        super(NotBlockable, self).__init__(message)
        self.weight, self.op = weight, op


def split_updates(updates, cut, block_leaf):
    """``(split, refused)``: ``split``, [(X, k, new value of block k)] for
    each update pair ``(X, X_new)`` whose X is in ``cut``, in the order of
    ``updates``, k over X's blocks; ``refused``, {X: NotBlockable} for the
    cut X whose new value reads more than its block's rows (they are not in
    ``split``).  Pairs of other variables are not returned (the caller
    keeps them).

    ``cut``: {cut leaf: [(start, stop)] of each of its blocks' rows}, every
    leaf in the same number of blocks (a weight, its optimizer state, the
    stand-in of its gradient, each at its own bounds); ``block_leaf(X, k)``:
    the variable that stands for block k of cut leaf X.

    A caller that keeps the refused weights whole takes their leaves (the
    weight, its state, its gradient) out of ``cut`` and splits again: a leaf
    no longer cut is read whole, which refuses nothing more, so the second
    split refuses none."""
    blocks = Blocks(cut, block_leaf)
    split, refused = [], {}
    for variable, new_value in updates:
        if variable in blocks.cut:
            blocks.weight = variable
            bounds = blocks.cut[variable]
            try:
                split += [(variable, k, blocks.block(new_value, k, bounds))
                          for k in range(blocks.count)]
            except NotBlockable as error:
                refused[variable] = error
                split = [item for item in split if item[0] is not variable]
    return split, refused


class Blocks(object):
    """The rules of the module's docstring over one host graph, each
    variable rebuilt once per (block, bounds) and once whole."""

    def __init__(self, cut, block_leaf):
        self.cut = dict((leaf, _bounds(bounds)) for leaf, bounds in cut.items())
        counts = dict((leaf, len(bounds)) for leaf, bounds in self.cut.items())
        if len(set(counts.values())) > 1:
            raise ValueError('Blocks expects every cut leaf in the same number of blocks; '
                             'received %s blocks per leaf. Cut them all into one number of '
                             'blocks.' % ', '.join('%s: %d' % item for item in counts.items()))
        self.count = counts.popitem()[1] if counts else 0
        self._block_leaf = block_leaf
        # The update errors name.
        self.weight = None
        # (id(variable), (k, bounds) or WHOLE): (variable, result); the
        # variable is kept alive so that its id is not reused.
        self._built = {}
        # id(variable): (variable, whether its graph reads a cut leaf, its rows)
        self._facts = {}

    def block(self, x, k, bounds):
        """Rows ``bounds[k]`` of ``x`` (``x`` itself where it is the same for
        every block); ``bounds``: those of the update's X."""
        return self._built_value(x, (k, _bounds(bounds)))

    def whole(self, x):
        """``x`` read in full, from the blocks of the cut leaves it reads."""
        return self._built_value(x, WHOLE)

    def reads_cut(self, x):
        """Whether ``x``'s graph reads a cut leaf."""
        return self._facts_of(x)[1]

    def rows(self, x):
        """The rows of ``x``: None where it reads no cut leaf along its first
        axis, ('rows', leaf, its bounds), or ('mixed', the variable whose
        inputs read leaves cut at different bounds, leaf, bounds, leaf,
        bounds)."""
        return self._facts_of(x)[2]

    def _facts_of(self, x):
        # Inputs before their readers, on a stack (no recursion).
        stack = [x]
        while stack:
            variable = stack[-1]
            inputs = variable.owner.inputs if variable.owner is not None else []
            unknown = [i for i in inputs if id(i) not in self._facts]
            if id(variable) in self._facts:
                stack.pop()
            elif unknown:
                stack += unknown
            else:
                facts = [self._facts[id(i)] for i in inputs]
                reads = variable in self.cut or any(f[1] for f in facts)
                self._facts[id(variable)] = (variable, reads,
                                             self._rows_from(variable, [f[2] for f in facts]))
                stack.pop()
        return self._facts[id(x)]

    def _rows_from(self, x, input_rows):
        if x in self.cut:
            return ('rows', x, self.cut[x])
        axes = _reduced_axes(x)
        if x.ndim == 0 or x.broadcastable[0] or (axes is not None and 0 in axes):
            return None
        known = [rows for rows in input_rows if rows is not None]
        mixed = [rows for rows in known if rows[0] == 'mixed']
        if mixed:
            return mixed[0]
        other = [rows for rows in known if rows[2] != known[0][2]]
        if other:
            return ('mixed', x) + known[0][1:] + other[0][1:]
        return known[0] if known else None

    def _built_value(self, x, key):
        # Inputs before their readers, on a stack: long chains (a gradient
        # norm summed over hundreds of weights) need no recursion.
        stack = [(x, key)]
        while stack:
            variable, j = stack[-1]
            if (id(variable), j) in self._built:
                stack.pop()
                continue
            needs, build = self._rule(variable, j)
            missing = [need for need in needs if (id(need[0]), need[1]) not in self._built]
            if missing:
                stack += missing
                continue
            built = build([self._built[id(v), i][1] for v, i in needs])
            self._built[id(variable), j] = (variable, built)
            stack.pop()
        return self._built[id(x), key][1]

    def _rule(self, x, key):
        """(what ``x`` at ``key``, (k, bounds) or WHOLE, is built from:
        [(variable, key)], a function of their built values that builds it)."""
        if key is WHOLE:
            return self._whole_rule(x)
        k, bounds = key
        if x.ndim == 0 or x.broadcastable[0]:
            return ([(x, WHOLE)], lambda values: values[0]) if self.reads_cut(x) else _itself(x)
        self._check_rows(x, bounds)
        if x in self.cut:
            return [], lambda _: self._block_leaf(x, k)
        if not self.reads_cut(x):
            start, stop = bounds[k]
            return [], lambda _: x[start:stop]
        op, axes = x.owner.op, _reduced_axes(x)
        if (isinstance(op, Elemwise) or (isinstance(op, DimShuffle) and op.new_order[0] == 0) or
                (axes is not None and 0 not in axes)):
            return [(i, key) for i in x.owner.inputs], lambda values: _applied(x, values)
        raise self._not_blockable(x, 'a row of its value reads other rows (a product, reshape, '
                                  'index, join or sort along the first axis) or it is an op '
                                  'with no rule here')

    def _check_rows(self, x, bounds):
        """Refuses ``x`` where the leaves it reads along its rows are not all
        cut at ``bounds``, those of the update's X."""
        rows = self.rows(x)
        if rows is not None and rows[0] == 'mixed':
            mixing, leaf, leaf_bounds, other, other_bounds = rows[1:]
            raise self._not_blockable(mixing, 'its inputs read the rows of %s, cut at %s, and '
                                      'of %s, cut at %s: a block is the same rows of every '
                                      'operand. Cut them at the same bounds'
                                      % (leaf, list(leaf_bounds), other, list(other_bounds)))
        if rows is not None and rows[2] != bounds:
            raise self._not_blockable(x, 'it reads the rows of %s, cut at %s, into a block of '
                                      'rows cut at %s (those of %s). Cut them at the same bounds'
                                      % (rows[1], list(rows[2]), list(bounds), self.weight))

    def _whole_rule(self, x):
        if not self.reads_cut(x):
            return _itself(x)
        op, axes = x.owner.op, _reduced_axes(x)
        if axes is not None and 0 in axes:
            if type(op) not in COMBINED_CLASSES or _scalar_op(x) not in COMBINABLE:
                raise self._not_blockable(x, 'it reduces the first axis with %s, which has no '
                                          'partial form' % _op_name(x))
            [reduced] = x.owner.inputs
            rows = self.rows(reduced)
            if reduced.broadcastable[0] or rows is None:
                # One row, the same in every block, or rows that read cut
                # leaves only through whole values: reduced once.
                return [(reduced, WHOLE)], lambda values: _applied(x, values)
            if rows[0] == 'mixed':
                self._check_rows(reduced, None)
            # The partials of the blocks at the bounds of the leaves it reads.
            return ([(reduced, (k, rows[2])) for k in range(self.count)],
                    lambda values: functools.reduce(Elemwise(_scalar_op(x)),
                                                    [_applied(x, [v]) for v in values]))
        if isinstance(op, (Elemwise, DimShuffle)) or axes is not None:
            leaves = [i for i in x.owner.inputs if i in self.cut]
            if leaves:
                raise self._not_blockable(x, 'its value needs all rows of %s' % leaves[0])
            return [(i, WHOLE) for i in x.owner.inputs], lambda values: _applied(x, values)
        raise self._not_blockable(x, 'its value is needed whole and it has no rule')

    def _not_blockable(self, x, why):
        read = ', '.join(sorted(str(v) for v in gof.graph.inputs([x]) if v in self.cut))
        return NotBlockable(
            'the update of %s cannot be computed block by block (rows %s): expected '
            'elementwise ops, dimshuffles that keep the first axis first and reductions '
            '(sum, product, max, min); received %s, which reads the cut %s, and %s. '
            'Keep this weight whole.' % (self.weight, list(self.cut.get(self.weight, ())),
                                         _op_name(x), read, why),
            self.weight, x.owner.op if x.owner is not None else None)


def _bounds(bounds):
    """``bounds`` as a tuple of (start, stop) pairs (a key); ValueError
    unless they are blocks of rows in order from row 0, none empty, none
    missing (whether the last stops at the leaf's last row is the caller's
    to keep: a symbolic leaf does not know its rows)."""
    try:
        return checked_bounds(bounds)
    except ValueError as error:
        raise ValueError('Blocks expects each cut leaf\'s bounds as [(start, stop)] of blocks '
                         'of its rows, the first from row 0, each from where the one before '
                         'stopped, none empty; received %r: %s' % (list(bounds), error))


def _itself(x):
    return [], lambda _: x


def _reduced_axes(x):
    """The axes a reduction (CAReduce, or MaxAndArgmax's max) that computes
    ``x`` reduces, all of them for None; None where ``x`` is not one."""
    op = x.owner.op if x.owner is not None else None
    if isinstance(op, CAReduce) or (isinstance(op, tensor.MaxAndArgmax) and x.index == 0):
        return tuple(range(x.owner.inputs[0].ndim)) if op.axis is None else tuple(op.axis)
    return None


def _op_name(x):
    """The op that computes ``x`` and its class, as errors name it."""
    op = x.owner.op if x.owner is not None else None
    return '%s (%s)' % (op, type(op).__name__) if op is not None else 'the leaf %s' % x


def _scalar_op(x):
    """The scalar op of the reduction that computes ``x``."""
    op = x.owner.op
    return scalar.maximum if isinstance(op, tensor.MaxAndArgmax) else op.scalar_op


def _applied(x, inputs):
    """``x``'s op applied to ``inputs``: the output in ``x``'s place."""
    return x.owner.op.make_node(*inputs).outputs[x.index]
