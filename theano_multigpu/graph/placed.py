"""Weights in layer-wise and sharded batch-wise mode: a ``PlacedVariable``
is a host variable until the plan places it, then a handle on its copy on
the planned context.

``get_value``/``set_value`` read and write that copy; the host variable
keeps only a zero-strided placeholder of its shape (no memory; NaN for
floats).  Graphs
read the copy through ``host_view``, the shim's rewrite and any
``theano.function`` alike (``graph_view``, ``compat.shared_views``).
Pickled, it carries its value.
"""
import numpy as np
import theano
from theano import gof
from theano.gpuarray.basic_ops import host_from_gpu
from theano.gpuarray.type import gpuarray_shared_constructor
from theano.tensor.sharedvar import TensorSharedVariable

from ..patch_targets import CodeNames

__all__ = ['PlacedVariable', 'new_variable', 'host_view', 'placed_replacements',
           'value_holder', 'check_no_placeholder', 'optimizer_state_owners']

# ``place`` drops the functions ``Variable.eval`` keeps in ``_fn_cache``.
EVAL_CACHE = CodeNames('theano.gof.graph.Variable.eval', ('_fn_cache',),
                       'read: place() drops the functions it keeps there')
EVAL_CACHE.check(gof.graph.Variable.eval)


class PlacedVariable(TensorSharedVariable):
    """A weight in layer-wise or sharded mode (see the module docstring)."""

    placed = None        # the GPU shared variable holding the value, once placed

    def get_value(self, borrow=False, return_internal_type=False):
        if self.placed is None:
            return super(PlacedVariable, self).get_value(borrow, return_internal_type)
        return np.asarray(self.placed.get_value(borrow=borrow))

    def set_value(self, value, borrow=False):
        if self.placed is None:
            return super(PlacedVariable, self).set_value(value, borrow)
        self.placed.set_value(np.asarray(value, dtype=self.dtype), borrow=borrow)

    def place(self, context_name):
        """Move the value to ``context_name`` (a graph name); the host
        variable keeps a zero-strided placeholder of the same shape."""
        value = self.get_value()
        self.placed = gpuarray_shared_constructor(value, name=self.name, target=context_name)
        # NaN for floats: a function compiled before, which reads the
        # placeholder, shows it rather than plausible zeros.
        fill = np.nan if value.dtype.kind == 'f' else 0
        self.container.storage[0] = np.broadcast_to(np.full((), fill, value.dtype), value.shape)
        # ``W.eval()`` (K.eval) keeps the function it compiled, which read
        # the host value: compiled again, it reads the copy.
        self.__dict__.pop('_fn_cache', None)

    def graph_view(self):
        """What a Theano function reads for this variable: the host view of
        its copy, once placed (``compat.shared_views``)."""
        return host_view(self) if self.placed is not None else None

    def __reduce__(self):
        """Pickled with its value (not the placeholder); unpickled unplaced."""
        return (_unpickle, (self.get_value(), self.name))

    @property
    def nbytes(self):
        value = self.get_value(borrow=True)
        return int(value.size) * value.dtype.itemsize


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


def host_view(variable):
    """The host-typed view of a placed variable's copy, one per variable
    (kept on it: freed with it)."""
    view = variable.__dict__.get('_host_view')
    if view is None:
        view = variable._host_view = host_from_gpu(variable.placed)
    return view


def placed_replacements(variables):
    """{placed variable: its host view} for those of ``variables`` placed."""
    return dict((v, host_view(v)) for v in variables
                if isinstance(v, PlacedVariable) and v.placed is not None)


def value_holder(variable):
    """What holds ``variable``'s value: a placed variable's copy on its
    context (what gradients are taken with respect to and updates write,
    not the placeholder); anything else (an input, a scalar) as it is."""
    if isinstance(variable, PlacedVariable) and variable.placed is not None:
        return variable.placed
    return variable


def check_no_placeholder(roots, rewrite, advice=''):
    """Raise where ``rewrite`` (a name for the message) left a placed
    variable's host handle in the graph of ``roots``: it holds a
    placeholder, and a gradient with respect to the copy would miss that
    path."""
    left = [v for v in gof.graph.inputs(roots)
            if isinstance(v, PlacedVariable) and v.placed is not None]
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
