"""Weights in layer-wise and sharded batch-wise mode: a ``PlacedVariable``
is a host variable until the plan places it, then a handle on where its
value lives: one copy on one context (``place``, kept as ``placed``), or
blocks of rows of its first axis, each a copy on a context of its own
(``place_blocks``, kept as ``blocks``).  ``is_placed`` tells either.

``get_value``/``set_value`` read and write the whole value there (a split
variable's blocks joined along the first axis); the host variable keeps only
a zero-strided placeholder of its shape (no memory; NaN for floats).  Graphs
read the value through ``host_view`` (the copy's host view, or the join of
the blocks' host views), the shim's rewrite and any ``theano.function``
alike (``graph_view``, ``compat.shared_views``).  Pickled, it carries its
whole value.
"""
import collections

import numpy as np
import theano
from theano import gof
from theano.gpuarray.basic_ops import host_from_gpu
from theano.gpuarray.type import gpuarray_shared_constructor
from theano.tensor.sharedvar import TensorSharedVariable

from ..patch_targets import CodeNames
from .rows import checked_bounds
from .transfer import HOST, on_context

__all__ = ['PlacedVariable', 'Block', 'new_variable', 'is_placed', 'holders', 'host_view',
           'placed_replacements', 'read_on', 'split_cut', 'value_holder', 'check_no_placeholder',
           'optimizer_state_owners']

# ``place`` drops the functions ``Variable.eval`` keeps in ``_fn_cache``.
EVAL_CACHE = CodeNames('theano.gof.graph.Variable.eval', ('_fn_cache',),
                       'read: place() drops the functions it keeps there')
EVAL_CACHE.check(gof.graph.Variable.eval)

# One block of a split variable: rows ``start:stop`` of its first axis,
# held by the GPU shared variable ``variable`` on graph context ``context``.
Block = collections.namedtuple('Block', 'context start stop variable')


class PlacedVariable(TensorSharedVariable):
    """A weight in layer-wise or sharded mode (see the module docstring).
    It is placed once, whole or in blocks, never both."""

    placed = None        # the GPU shared variable holding the whole value, once placed
    blocks = None        # [Block] in row order, once placed in blocks

    def get_value(self, borrow=False, return_internal_type=False):
        if self.blocks is not None:
            return np.concatenate([np.asarray(block.variable.get_value(borrow=borrow))
                                   for block in self.blocks], axis=0)
        if self.placed is None:
            return super(PlacedVariable, self).get_value(borrow, return_internal_type)
        return np.asarray(self.placed.get_value(borrow=borrow))

    def set_value(self, value, borrow=False):
        if self.blocks is not None:
            value = np.asarray(value, dtype=self.dtype)
            shape = self.container.storage[0].shape
            if value.shape != shape:
                raise ValueError(
                    'set_value of %s, split into blocks of rows, expects a value of shape %s; '
                    'received shape %s: pass a value of the variable\'s own shape'
                    % (self.name, shape, value.shape))
            for block in self.blocks:
                block.variable.set_value(value[block.start:block.stop], borrow=borrow)
            return
        if self.placed is None:
            return super(PlacedVariable, self).set_value(value, borrow)
        self.placed.set_value(np.asarray(value, dtype=self.dtype), borrow=borrow)

    def place(self, context_name):
        """Move the value to ``context_name`` (a graph name); the host
        variable keeps a zero-strided placeholder of the same shape."""
        value = self._value_to_place('place')
        self.placed = gpuarray_shared_constructor(value, name=self.name, target=context_name)
        self._leave_placeholder(value)

    def place_blocks(self, parts):
        """Split the value along its first axis: ``parts`` is a list of
        ``(context graph name, start row, stop row)``, non-empty and in
        order, that covers rows ``0..n`` of the first axis.  Each part
        becomes a GPU shared variable on its context holding those rows
        (``blocks``); ``placed`` stays None; the host variable keeps a
        zero-strided placeholder of the whole shape."""
        value = self._value_to_place('place_blocks')
        parts = _checked_parts(parts, value.shape[0], self.name)
        self.blocks = [
            Block(context, start, stop,
                  gpuarray_shared_constructor(value[start:stop], target=context,
                                              name='%s[%d:%d]' % (self.name, start, stop)))
            for context, start, stop in parts]
        self._leave_placeholder(value)

    def _value_to_place(self, method):
        if is_placed(self):
            raise ValueError(
                '%s(%s): the variable is placed already (%s); a variable is placed once, '
                'whole or in blocks' % (method, self.name, _where(self)))
        return self.get_value()

    def _leave_placeholder(self, value):
        # NaN for floats: a function compiled before, which reads the
        # placeholder, shows it rather than plausible zeros.
        fill = np.nan if value.dtype.kind == 'f' else 0
        self.container.storage[0] = np.broadcast_to(np.full((), fill, value.dtype), value.shape)
        # ``W.eval()`` (K.eval) keeps the function it compiled, which read
        # the host value: compiled again, it reads where the value lives.
        self.__dict__.pop('_fn_cache', None)

    def graph_view(self):
        """What a Theano function reads for this variable once placed
        (``compat.shared_views``): ``host_view``."""
        return host_view(self) if is_placed(self) else None

    def __reduce__(self):
        """Pickled with its whole value (not the placeholder); unpickled unplaced."""
        return (_unpickle, (self.get_value(), self.name))

    @property
    def nbytes(self):
        """The bytes of the value, summed over the blocks of a split one."""
        if self.blocks is not None:
            holders = [block.variable for block in self.blocks]
        elif self.placed is not None:
            holders = [self.placed]
        else:
            return _bytes(super(PlacedVariable, self).get_value(borrow=True))
        return sum(_bytes(h.get_value(borrow=True, return_internal_type=True)) for h in holders)


def _bytes(value):
    return int(value.size) * value.dtype.itemsize


def _where(variable):
    if variable.blocks is not None:
        return 'in blocks %s' % ', '.join('%s rows %d:%d' % (b.context, b.start, b.stop)
                                          for b in variable.blocks)
    return 'whole on %s' % variable.placed.type.context_name


def _checked_parts(parts, rows, name):
    """``parts`` as (context, start, stop) triples of whole rows; ValueError
    unless they are non-empty and in order, covering rows 0..``rows``."""
    expected = ('place_blocks(%s) expects a list of (context, start row, stop row), each '
                'non-empty, the first starting at row 0, each starting where the one before '
                'stopped and the last stopping at row %d (the first axis); received %r'
                % (name, rows, parts))
    try:
        triples = [(context, start, stop) for context, start, stop in parts]
    except (TypeError, ValueError):
        raise ValueError(expected + ': not a list of triples of a name and two rows')
    try:
        bounds = checked_bounds([(start, stop) for _, start, stop in triples], rows)
    except ValueError as error:
        raise ValueError('%s: %s' % (expected, error))
    return [(context,) + pair for (context, _, _), pair in zip(triples, bounds)]


def new_variable(value, dtype, name):
    """A PlacedVariable for arrays; scalars (learning rates, counters) stay
    plain host variables, which every context reads at no cost."""
    value = np.asarray(value, dtype=dtype)
    variable = theano.shared(value=value, name=name, strict=False, target='cpu')
    if value.ndim >= 1:
        variable.__class__ = PlacedVariable
    return variable


def _unpickle(value, name):
    return new_variable(value, value.dtype, name)


def is_placed(variable):
    """Whether ``variable`` is a PlacedVariable whose value lives on the
    contexts, whole or in blocks."""
    return isinstance(variable, PlacedVariable) and (
        variable.placed is not None or variable.blocks is not None)


def holders(variable):
    """The GPU shared variables that hold a placed variable's value: its
    copy, or its blocks' in row order; [] for one not placed."""
    if isinstance(variable, PlacedVariable) and variable.blocks is not None:
        return [block.variable for block in variable.blocks]
    return [variable.placed] if is_placed(variable) else []


def split_cut(variables, stand_ins):
    """{leaf: [(start, stop)] of its blocks} (``blocks.split_updates``'s
    cut) of those of ``variables`` split into blocks, and of those of the
    gradient stand-ins ``stand_ins`` whose weight is one of them."""
    cut = dict((v, [(block.start, block.stop) for block in v.blocks]) for v in variables
               if isinstance(v, PlacedVariable) and v.blocks is not None)
    gradients = dict((s, cut[s.tag.multigpu_gradient.param]) for s in stand_ins
                     if s.tag.multigpu_gradient.param in cut)
    cut.update(gradients)
    return cut


def host_view(variable):
    """The host-typed view of a placed variable's value, one per variable
    (kept on it: freed with it): its copy's host view, or the join along
    the first axis of its blocks' host views."""
    view = variable.__dict__.get('_host_view')
    if view is None:
        if variable.blocks is not None:
            view = theano.tensor.concatenate(
                [host_from_gpu(block.variable) for block in variable.blocks], axis=0)
        else:
            view = host_from_gpu(variable.placed)
        variable._host_view = view
    return view


def placed_replacements(variables, context=HOST):
    """{placed variable: what a graph on graph context ``context`` reads}
    for those of ``variables`` placed: a copy's host view (computed with
    where the copy lives), or a split variable's value gathered on
    ``context`` (``read_on``; None is Theano's default context)."""
    return dict((v, read_on(v, context) if v.blocks is not None else host_view(v))
                for v in variables if is_placed(v))


def read_on(variable, context):
    """A placed variable's whole value, host-typed, computed with on graph
    context ``context`` (None: Theano's default context; HOST: the host
    view, which Theano computes with where its first block lives): its copy
    moved there, or its blocks moved there and joined along the first axis
    (a block already there is read in place)."""
    if context == HOST:
        return host_view(variable)
    if variable.blocks is None:
        return on_context(host_view(variable), context)
    return theano.tensor.concatenate(
        [on_context(host_from_gpu(h), context) for h in holders(variable)], axis=0)


def value_holder(variable):
    """What holds ``variable``'s value: a placed variable's copy on its
    context (what gradients are taken with respect to and updates write,
    not the placeholder); anything else (an input, a scalar) as it is.

    A variable split into blocks has no one holder: each block holds its
    rows, and a caller takes gradients of and writes updates to the blocks
    (``variable.blocks``); asked for one holder, it raises ValueError."""
    if isinstance(variable, PlacedVariable) and variable.blocks is not None:
        raise ValueError(
            'value_holder(%s): the variable is split into blocks (%s) and its blocks hold '
            'the value, not one variable; take gradients of and update each of its '
            '.blocks[k].variable instead' % (variable.name, _where(variable)))
    if is_placed(variable):
        return variable.placed
    return variable


def check_no_placeholder(roots, rewrite, advice=''):
    """Raise where ``rewrite`` (a name for the message) left a placed
    variable's host handle in the graph of ``roots``: it holds a
    placeholder, and a gradient with respect to where its value lives
    would miss that path."""
    left = [v for v in gof.graph.inputs(roots) if is_placed(v)]
    if left:
        raise RuntimeError(
            '%s left the host handles of %s in the graph, where they hold no values; '
            'please report this with the model%s'
            % (rewrite, ', '.join(str(v) for v in left[:5]), advice))


def optimizer_state_owners(updates, weights):
    """{id(state): (state, weight)}: the optimizer state each of
    ``weights``' update reads (an accumulator read by one weight's update
    alone belongs to it); ``updates`` is a list of pairs."""
    weight_ids = set(id(w) for w in weights)
    readers = {}
    for variable, new_value in updates:
        if id(variable) not in weight_ids:
            continue
        for read in gof.graph.inputs([new_value]):
            if isinstance(read, PlacedVariable) and read is not variable:
                readers.setdefault(id(read), (read, []))[1].append(variable)
    return dict((key, (state, ws[0])) for key, (state, ws) in readers.items()
                if len(ws) == 1)
