"""Start-up hook of theano_multigpu, run in every Python process.

The installed ``theano_multigpu.pth`` imports this module when Python starts.
It must stay cheap: unless KERAS_BACKEND names the shim (or
THEANO_MULTIGPU_COMPAT=1 asks for the compatibility fixes alone) it reads two
environment variables and returns, importing neither Theano nor Keras.
"""
import os

if os.environ.get('KERAS_BACKEND') == 'theano_multigpu':
    import theano_multigpu  # noqa: F401  (activates the shim)
elif os.environ.get('THEANO_MULTIGPU_COMPAT') == '1':
    import theano_multigpu.compat  # noqa: F401  (installs the fixes alone)
