"""theano_multigpu: a Keras 1.x backend that trains on several GPUs with Theano.

Importing this package before Keras turns the shim on, as
KERAS_BACKEND=theano_multigpu does.  How the code is laid out (lowest layer
last; each imports only the layers below it, checked by .importlinter):

- ``startup``: turning the shim on; ``python -m theano_multigpu info``;
- ``keras_adapter``: the backend entries Keras calls; the only reader of
  Keras's internals;
- ``mpi``: several processes;
- ``graph``: the graph rewrites, the plan, the placement check and report;
- ``compat``: patches of Theano and Keras;
- ``config``: settings, devices, the mesh of contexts;
- ``errors``, ``importhook``, ``patch_targets``: used by all.
"""
from .startup.turn_on import activate, compat_only_requested

__version__ = '0.1.0'
__all__ = ['activate', '__version__']

if not compat_only_requested():
    activate()
