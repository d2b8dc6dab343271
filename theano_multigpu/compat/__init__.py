"""Compatibility patches: Theano 1.0.5 and Keras 1.0.1 to 1.2.2 on Python
3.11 and today's packages (``python_fixes``, ``theano_fixes``,
``keras_fixes``), precompiled headers for Theano's C modules
(``precompiled_headers``), Theano's GPU kernels (``gpu_kernels``), BLAS and zero fills
on OpenCL contexts (``opencl_contexts``), what Theano does while it compiles,
for progress lines (``compile_watch``), a recurrent layer's backward loop
reading its forward loop's products (``scan_reuse``), and
Theano's gpuarray backend with several contexts (``gpuarray_fixes``,
installed once contexts are registered).

Importing this package installs the first eight; it edits no installed
file.  Each fix acts when its module is first imported (see
``theano_multigpu.importhook``), so installing costs almost nothing, and
each checks its target first (``theano_multigpu.patch_targets``).  Plain
Keras-Theano users get the fixes alone with
``THEANO_MULTIGPU_COMPAT=1 KERAS_BACKEND=theano python train.py``.
Graph rewrites of the package are registered through ``optimizers``.

May import: ``theano_multigpu.config`` and the base modules (``errors``,
``importhook``, ``patch_targets``).
"""
from .. import importhook
from ..config import settings
from . import (compile_watch, gpu_kernels, keras_fixes, opencl_contexts, precompiled_headers,
               python_fixes, scan_reuse, theano_fixes)

__all__ = ['install']

_installed = False


def install():
    """Install every fix once; later calls do nothing."""
    global _installed
    if _installed:
        return
    importhook.after_import('theano.configparser', settings.register_settings_of_the_fixes)
    python_fixes.install()
    theano_fixes.install()
    precompiled_headers.install()
    gpu_kernels.install()
    opencl_contexts.install()
    keras_fixes.install()
    compile_watch.install()
    scan_reuse.install()
    _installed = True


install()
