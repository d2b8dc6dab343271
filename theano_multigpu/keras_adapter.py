"""The Keras adapter: the backend entries the shim takes over.

The shim's backend is Keras's own Theano backend with these entries
replaced, in ``keras.backend`` and in ``keras.backend.theano_backend`` (whose
functions call each other through module globals: ``K.zeros`` reaches
``variable`` there).  This module is the one place that knows Keras.
"""
import sys

import numpy as np

from . import mesh as mesh_module

__all__ = ['TAKEN_OVER', 'install', 'stock']

TAKEN_OVER = ('variable', 'function', 'gradients', 'get_value', 'set_value',
              'batch_get_value', 'batch_set_value')

# Keras's own implementations, captured before they are replaced.
stock = {}


def variable(value, dtype=None, name=None):
    """A shared variable, placed on the master context when contexts are set."""
    target = mesh_module.current().master
    if target is None or hasattr(value, 'tocoo'):
        return stock['variable'](value, dtype=dtype, name=name)
    import theano
    from keras.backend import floatx
    value = np.asarray(value, dtype=dtype or floatx())
    shared = theano.shared(value=value, name=name, strict=False, target=target)
    shared._keras_shape = value.shape
    shared._uses_learning_phase = False
    return shared


def function(inputs, outputs, updates=[], **kwargs):
    """One Theano function; in batch-wise mode, spread over the contexts."""
    mesh = mesh_module.current()
    if mesh.mode == 'batch':
        from . import batchwise
        updates = _unique_updates(updates)
        outputs, updates = batchwise.rewrite(list(inputs), list(outputs), updates, mesh)
    return stock['function'](inputs, outputs, updates=updates, **kwargs)


def _unique_updates(updates):
    """Keras's Function keeps the first update of each variable; so do we."""
    seen, unique = set(), []
    for variable, new_value in updates:
        if id(variable) not in seen:
            seen.add(id(variable))
            unique.append((variable, new_value))
    return unique


def gradients(loss, variables):
    """Gradients; in batch-wise mode, stand-ins that ``function`` replaces by
    the gradients of the batch-wise loss."""
    if mesh_module.current().mode == 'batch':
        from . import batchwise
        return batchwise.gradient_stand_ins(loss, variables)
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
    theano_backend = sys.modules['keras.backend.theano_backend']
    own = sys.modules[__name__]
    for name in TAKEN_OVER:
        stock.setdefault(name, getattr(theano_backend, name))
        for module in (keras_backend, theano_backend):
            setattr(module, name, getattr(own, name))
