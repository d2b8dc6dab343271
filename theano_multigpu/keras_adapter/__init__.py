"""The Keras adapter: the backend entries the shim takes over, on top of
every other layer.

The shim's backend is Keras's own Theano backend with these entries
replaced, in ``keras.backend`` and in ``keras.backend.theano_backend`` (whose
functions call each other through module globals: ``K.zeros`` reaches
``variable`` there).  This package is the one place that knows Keras:

- this module: the entries Keras calls, and ``install``;
- ``functions``: compiling one ``K.function`` in each mode;
- ``calls``: the wrappers between Keras and a compiled Function (a batch
  split over fewer contexts, compiling layer-wise at the first call, the
  report, MPI's first steps), and the rows a call is handed;
- ``keras_graph``: what Keras's graphs say (which layer made a tensor), read
  from Keras's internals, for the graph machinery below;
- ``rank_zero``: under MPI, rank 0 alone prints and writes files.

May import: every layer below (``mpi``, ``graph``, ``compat``, ``config``
and the base modules), and Keras.
"""
import sys

import numpy as np

from ..config import mesh as mesh_module
from ..config.mpi_environment import launched_by_mpi
from ..patch_targets import Attributes, replace
from . import calls, functions, keras_graph   # none imports the graph layer at import

__all__ = ['TAKEN_OVER', 'install', 'stock']

# (K.eval needs no entry: any Theano function reads a layer-wise weight's
# copy, see compat.shared_views.)
TAKEN_OVER = ('variable', 'function', 'gradients', 'get_value', 'set_value',
              'batch_get_value', 'batch_set_value')
# Keras 1.0.1 lacks batch_get_value and batch_set_value.
THEANO_BACKEND = Attributes('keras.backend.theano_backend', TAKEN_OVER[:5],
                            "its entries are replaced by the shim's", optional=TAKEN_OVER[5:])
KERAS_BACKEND = Attributes('keras.backend', TAKEN_OVER[:5],
                           "its entries are replaced by the shim's", optional=TAKEN_OVER[5:])

# Keras's own implementations, captured before they are replaced.
stock = {}


def variable(value, dtype=None, name=None):
    """A shared variable, placed on the master context when contexts are set
    (by Theano itself when the master is its default context); in layer-wise
    mode, on the context the plan gives its layer, and in sharded batch-wise
    mode on its owner (placed when a function first reads it)."""
    from keras.backend import floatx
    dtype = dtype or floatx()   # Keras 1.0.1's default is float64, 1.2's floatx
    mesh = mesh_module.current()
    if (mesh.mode == 'layer' or mesh.sharded) and not hasattr(value, 'tocoo'):
        from ..graph import placed
        new = placed.new_variable(value, dtype, name)
        return keras_graph.mark_as_weight(new, new.get_value(borrow=True).shape)
    target = mesh.graph_name(mesh.master)
    if target is None or hasattr(value, 'tocoo'):
        return stock['variable'](value, dtype=dtype, name=name)
    import theano
    value = np.asarray(value, dtype=dtype)
    shared = theano.shared(value=value, name=name, strict=False, target=target)
    return keras_graph.mark_as_weight(shared, value.shape)


def function(inputs, outputs, updates=[], **kwargs):
    """One Theano function; in batch-wise and layer-wise mode, spread over
    the contexts, and under MPI over the ranks too.  ``outputs`` is a list,
    or one tensor (then a call returns one array, as stock's does)."""
    title = functions.function_title(sys._getframe(1))
    if isinstance(outputs, (list, tuple)):
        return functions.compile_function(stock['function'], inputs, outputs, updates,
                                          kwargs, title)
    return calls.SingleOutput(functions.compile_function(
        stock['function'], inputs, [outputs], updates, kwargs, title))


def gradients(loss, variables):
    """Gradients of ``loss`` with respect to ``variables`` (a list, or one
    tensor: then one gradient, as stock's); in batch-wise and layer-wise
    mode and under MPI, stand-ins that ``function`` replaces by the
    gradients of the rewritten loss."""
    if mesh_module.current().mode in ('batch', 'layer') or launched_by_mpi():
        from ..graph.gradients import gradient_stand_ins
        if isinstance(variables, (list, tuple)):
            return gradient_stand_ins(loss, variables)
        return gradient_stand_ins(loss, [variables])[0]
    return stock['gradients'](loss, variables)


def get_value(x):
    return stock['get_value'](x)


def set_value(x, value):
    return stock['set_value'](x, value)


def batch_get_value(xs):
    return [get_value(x) for x in xs]


def batch_set_value(tuples):
    for x, value in tuples:
        set_value(x, value)


def install(keras_backend):
    """Replace the taken-over entries of Keras's Theano backend."""
    theano_backend = THEANO_BACKEND.check(sys.modules['keras.backend.theano_backend'])
    own = sys.modules[__name__]
    for name in TAKEN_OVER:
        if not hasattr(theano_backend, name):
            continue   # e.g. batch_get_value, which Keras 1.0.1 lacks
        stock.setdefault(name, getattr(theano_backend, name))
        for module, expectation in ((keras_backend, KERAS_BACKEND),
                                    (theano_backend, THEANO_BACKEND)):
            replace(expectation, module, name, getattr(own, name))
