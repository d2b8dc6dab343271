"""Start-up hook of theano_multigpu, run in every Python process.

The installed ``theano_multigpu.pth`` runs when Python starts: it reads two
environment variables and imports this module only when KERAS_BACKEND names
the shim or THEANO_MULTIGPU_COMPAT=1 asks for the compatibility fixes alone.
Any other Python pays for that one line, and imports neither Theano nor Keras.
"""
import os

if os.environ.get('KERAS_BACKEND') == 'theano_multigpu':
    import theano_multigpu  # noqa: F401  (activates the shim)
elif os.environ.get('THEANO_MULTIGPU_COMPAT') == '1':
    import theano_multigpu.compat  # noqa: F401  (installs the fixes alone)
