"""Updates of weights cut into blocks of rows: the new value of each block,
computed from that block of the weight, its gradient and its optimizer state.

A weight, its gradient and its state (Adam's moments, a momentum) are "cut":
each is split along its first axis at the same ``bounds``, [(start, stop)]
per block.  ``split_updates`` takes Keras's update pairs ``(X, X_new)`` on
the host and builds, for each cut X and block k, X_new's rows
[start_k, stop_k) from the variables that stand for block k of the cut
leaves (``block_leaf(X, k)``).  It follows these rules, each variable
rebuilt once per block:

- a cut leaf: ``block_leaf(leaf, k)``;
- a variable that reads no cut leaf: itself where it is a scalar or
  broadcast along the first axis, else its rows ``x[start:stop]``;
- a variable that reads a cut leaf and is a scalar or broadcast along the
  first axis (a global gradient norm for ``clipnorm``, MaxNorm's column
  norms): the same for every block, its ``whole`` value (below);
- Elemwise: the op on the blocks of its inputs (an input broadcast along the
  first axis is read whole);
- DimShuffle that keeps the first axis first, and a reduction (CAReduce,
  MaxAndArgmax) over other axes: the op on the block of its input;
- anything else (a dot, reshape, subtensor, join or sort across the rows, an
  op with no rule): ``NotBlockable``, and the weight stays whole.

``whole(x)``, the value of x read in full, for x that reads cut leaves:
a sum, product, max or min over axes including the first is the same
reduction of the blocks' partial reductions (of the one row, where its
input is broadcast along the first axis; a Mean or another reduction with
more than its scalar op is refused); Elemwise, DimShuffle and
reductions over other axes are the op on the whole of their inputs, unless
an input is a cut leaf; any other op is ``NotBlockable``.
"""
import functools

from theano import gof, scalar, tensor
from theano.tensor.elemwise import CAReduce, DimShuffle, Elemwise

__all__ = ['NotBlockable', 'split_updates', 'Blocks']

# The key of a variable's whole value, beside its blocks 0, 1, ...
WHOLE = 'whole'
# Reductions whose partial results per block combine into the whole one
# with the same scalar op.
COMBINABLE = (scalar.add, scalar.mul, scalar.maximum, scalar.minimum)
# The reductions that are their scalar op folded over the axes and nothing
# more (a Mean is a Sum divided by a count: its partials do not add up).
COMBINED_CLASSES = (CAReduce, tensor.elemwise.Sum, tensor.elemwise.Prod, tensor.MaxAndArgmax)


class NotBlockable(ValueError):
    """An update of a cut weight needs more than its own block of rows: the
    message names the op, the weight and why; the weight stays whole."""


def split_updates(updates, cut, bounds, block_leaf):
    """[(X, k, new value of block k)] for each update pair ``(X, X_new)``
    whose X is in ``cut``, in the order of ``updates``, k over ``bounds``.
    Pairs of other variables are not returned (the caller keeps them).

    ``cut``: the cut leaves, all cut at ``bounds`` along their first axis (a
    weight, its optimizer state, the stand-in of its gradient); ``bounds``:
    [(start, stop)] of each block's rows; ``block_leaf(X, k)``: the variable
    that stands for block k of cut leaf X.  Raises NotBlockable where a new
    value reads more than its block's rows."""
    blocks = Blocks(cut, bounds, block_leaf)
    split = []
    for variable, new_value in updates:
        if variable in blocks.cut:
            blocks.weight = variable
            split += [(variable, k, blocks.block(new_value, k)) for k in range(len(bounds))]
    return split


class Blocks(object):
    """The rules of the module's docstring over one host graph, each
    variable rebuilt once per block and once whole."""

    def __init__(self, cut, bounds, block_leaf):
        self.cut = set(cut)
        self.bounds = list(bounds)
        self._block_leaf = block_leaf
        # The update errors name.
        self.weight = None
        # (id(variable), block k or WHOLE): (variable, result); the variable
        # is kept alive so that its id is not reused.
        self._built = {}
        # id(variable): (variable, whether its graph reads a cut leaf)
        self._reads_cut = {}

    def block(self, x, k):
        """Rows [start_k, stop_k) of ``x`` (``x`` itself where it is the
        same for every block)."""
        return self._built_value(x, k)

    def whole(self, x):
        """``x`` read in full, from the blocks of the cut leaves it reads."""
        return self._built_value(x, WHOLE)

    def reads_cut(self, x):
        """Whether ``x``'s graph reads a cut leaf."""
        stack = [x]
        while stack:
            variable = stack[-1]
            inputs = variable.owner.inputs if variable.owner is not None else []
            unknown = [i for i in inputs if id(i) not in self._reads_cut]
            if id(variable) in self._reads_cut:
                stack.pop()
            elif unknown:
                stack += unknown
            else:
                reads = variable in self.cut or any(self._reads_cut[id(i)][1] for i in inputs)
                self._reads_cut[id(variable)] = (variable, reads)
                stack.pop()
        return self._reads_cut[id(x)][1]

    def _built_value(self, x, k):
        # Inputs before their readers, on a stack: long chains (a gradient
        # norm summed over hundreds of weights) need no recursion.
        stack = [(x, k)]
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
        return self._built[id(x), k][1]

    def _rule(self, x, k):
        """(what ``x`` in block k, or WHOLE, is built from: [(variable, k or
        WHOLE)], a function of their built values that builds it)."""
        if k is WHOLE:
            return self._whole_rule(x)
        if x in self.cut:
            return [], lambda _: self._block_leaf(x, k)
        if x.ndim == 0 or x.broadcastable[0]:
            return ([(x, WHOLE)], lambda values: values[0]) if self.reads_cut(x) else _itself(x)
        if not self.reads_cut(x):
            start, stop = self.bounds[k]
            return [], lambda _: x[start:stop]
        op, axes = x.owner.op, _reduced_axes(x)
        if (isinstance(op, Elemwise) or (isinstance(op, DimShuffle) and op.new_order[0] == 0) or
                (axes is not None and 0 not in axes)):
            return [(i, k) for i in x.owner.inputs], lambda values: _applied(x, values)
        raise self._not_blockable(x, 'a row of its value reads other rows (a product, reshape, '
                                  'index, join or sort along the first axis) or it is an op '
                                  'with no rule here')

    def _whole_rule(self, x):
        if not self.reads_cut(x):
            return _itself(x)
        op, axes = x.owner.op, _reduced_axes(x)
        if axes is not None and 0 in axes:
            if type(op) not in COMBINED_CLASSES or _scalar_op(x) not in COMBINABLE:
                raise self._not_blockable(x, 'it reduces the first axis with %s, which has no '
                                          'partial form' % _op_name(x))
            [reduced] = x.owner.inputs
            if reduced.broadcastable[0]:   # one row, the same in every block: once
                return [(reduced, WHOLE)], lambda values: _applied(x, values)
            return ([(reduced, k) for k in range(len(self.bounds))],
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
            'Keep this weight whole.' % (self.weight, self.bounds, _op_name(x), read, why))


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
