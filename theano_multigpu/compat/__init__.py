"""Fixes that let Theano 1.0.5 and Keras 1.0.1 to 1.2.2 run on Python 3.11.

Importing this package installs them all; it edits no installed file.  Each
fix acts when its module is first imported (see ``theano_multigpu.importhook``),
so installing costs almost nothing.  Plain Keras-Theano users get the fixes
alone with ``THEANO_MULTIGPU_COMPAT=1 KERAS_BACKEND=theano python train.py``.
"""
from . import keras_fixes, python_fixes, theano_fixes

__all__ = ['install']

_installed = False


def install():
    """Install every fix once; later calls do nothing."""
    global _installed
    if _installed:
        return
    python_fixes.install()
    theano_fixes.install()
    keras_fixes.install()
    _installed = True


install()
