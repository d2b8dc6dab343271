"""Theano 1.0.5 on Python 3.11 and numpy 1.23: BLAS flags, ifelse, scan,
and a compile cache that survives the process."""
import hashlib
import os
import subprocess
import sys

from .. import importhook

__all__ = ['install', 'default_blas_ldflags']


def _linkable(library, cxx):
    """True when ``cxx`` finds ``lib<library>.so`` to link ``-l<library>``
    (the runtime library alone, without its -dev package, is not enough)."""
    try:
        found = subprocess.run([cxx, '-print-file-name=lib%s.so' % library],
                               capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return False
    return os.path.isabs(found) and os.path.exists(found)


def default_blas_ldflags(cxx='g++'):
    """``-lopenblas`` when ``cxx`` can link OpenBLAS, else '' (Theano then
    calls BLAS through numpy's C API, slower but working)."""
    return '-lopenblas' if cxx and _linkable('openblas', cxx) else ''


def _set_blas_ldflags(configparser):
    """numpy 1.23's distutils lost ``blas_opt_info``, which Theano reads to
    find BLAS when blas.ldflags is unset; give it the flag instead.  A
    blas.ldflags from THEANO_FLAGS or .theanorc, even an empty one, wins."""
    try:
        configparser.fetch_val_for_key('blas.ldflags')
        return
    except KeyError:
        pass
    try:
        cxx = configparser.fetch_val_for_key('cxx')
    except KeyError:
        cxx = 'g++'
    configparser.THEANO_FLAGS_DICT['blas.ldflags'] = default_blas_ldflags(cxx)


def _import_ifelse(theano):
    """Keras calls ``theano.ifelse.ifelse``; ``import theano`` no longer
    imports that submodule."""
    import theano.ifelse  # noqa: F401


def _stable_cop_cache_version(op):
    """COp's C cache version, without Python's randomised str hash."""
    codes = '\0'.join(op.func_codes).encode('utf8')
    version = (int(hashlib.sha256(codes).hexdigest()[:15], 16),)
    if hasattr(op, 'params_type'):
        version += (op.params_type.c_code_cache_version(),)
    return version


def _fix_cop_cache_version(op_module):
    """Theano keys the compile cache of COp ops (DimShuffle, GpuDot22, ...)
    on ``hash(source code)``, which Python 3 randomises per process: every
    run compiled them again.  Key them on a digest of the code instead."""
    op_module.COp.c_code_cache_version = _stable_cop_cache_version


def install():
    importhook.after_import('theano.configparser', _set_blas_ldflags)
    importhook.after_import('theano', _import_ifelse)
    importhook.after_import('theano.gof.op', _fix_cop_cache_version)
    # Scan's pre-generated Cython C file does not compile on Python 3.11
    # (longintrepr.h, PyCode_New).  With this module unimportable, Scan
    # runs its inner loop in Python (Scan.execute), as Theano does without
    # a C compiler.
    sys.modules.setdefault('theano.scan_module.scan_perform_ext', None)
