"""theano_multigpu: a Keras 1.x backend that trains on several GPUs with Theano.

Importing this package before Keras turns the shim on, as
KERAS_BACKEND=theano_multigpu does.
"""
from .activation import activate, compat_only_requested

__version__ = '0.1.0'
__all__ = ['activate', '__version__']

if not compat_only_requested():
    activate()
