"""Turning the shim on: Keras 1.x sees its Theano backend, with the shim's
entries in it, and every layer is wired in through import hooks.

Keras 1.x accepts only KERAS_BACKEND=theano or tensorflow.  While
``keras.backend`` executes, KERAS_BACKEND reads 'theano'; right after, it is
'theano_multigpu' again (child processes start on the shim too) and the
shim's entries replace Keras's (``keras_adapter.install``).
"""
import os
import sys

from .. import importhook
from ..config import settings
from ..config.mpi_environment import launched_by_mpi

__all__ = ['activate', 'compat_only_requested', 'BACKEND_NAME']

BACKEND_NAME = 'theano_multigpu'

_active = False


def compat_only_requested():
    """THEANO_MULTIGPU_COMPAT=1 without KERAS_BACKEND=theano_multigpu."""
    return (os.environ.get('THEANO_MULTIGPU_COMPAT') == '1'
            and os.environ.get('KERAS_BACKEND') != BACKEND_NAME)


def _present_as_theano(module):
    os.environ['KERAS_BACKEND'] = 'theano'


def _install_adapter(keras_backend):
    os.environ['KERAS_BACKEND'] = BACKEND_NAME
    from .. import keras_adapter
    keras_adapter.install(keras_backend)
    if launched_by_mpi():
        _join_ranks()


def _join_ranks():
    """Under MPI: every rank shuffles as rank 0 does, and only rank 0
    prints progress and writes files."""
    from ..keras_adapter import rank_zero
    from ..mpi import agreement, world
    agreement.share_random_state()
    rank_zero.install(world.world()[1])


def _register_contexts(gpuarray):
    from ..config import devices, mesh
    current = mesh.current()
    devices.register_missing_names(gpuarray, list(current.devices.items()))
    if current.master is not None:
        current.default_is_master = devices.set_default_context(current.master)
        from ..compat import gpuarray_fixes
        gpuarray_fixes.install(several_contexts=len(current.names) > 1)


def _check_not_too_late():
    """Theano reads its flags at import and Keras picks its backend at
    import: both must come after the shim."""
    for name in ('keras', 'theano'):
        if name in sys.modules:
            raise RuntimeError(
                'theano_multigpu must be imported before Keras and Theano, but '
                '%r is already imported; put `import theano_multigpu` before '
                '`import %s`, or leave the script alone and run it with '
                'KERAS_BACKEND=theano_multigpu in the environment (or '
                '`python -m theano_multigpu run script.py`)' % (name, name))


def activate():
    """Make the next ``import keras`` use the shim; idempotent.

    Raises RuntimeError when Keras or Theano is already imported.
    """
    global _active
    if _active:
        return
    _check_not_too_late()
    os.environ['KERAS_BACKEND'] = BACKEND_NAME
    from .. import compat   # importing it installs the Python 3.11 fixes
    compat.install()
    importhook.after_import('theano.configparser', settings.on_theano_configparser)
    importhook.after_import('theano.gpuarray', _register_contexts)
    importhook.before_import('keras.backend', _present_as_theano)
    importhook.after_import('keras.backend', _install_adapter)
    _active = True
