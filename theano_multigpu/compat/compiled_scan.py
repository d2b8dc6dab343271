"""Scan's compiled loop (``scan_loop.pyx``): built with Cython 3 at first
use into Theano's compile cache, loaded from there afterwards.  Where it
cannot be built, Scan runs its Python loop, after one warning that says
why.  ``multigpu.scan_loop=python`` chooses the Python loop.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

__all__ = ['SOURCE', 'CYTHON_REQUIREMENT', 'ScanLoopUnavailable', 'compiled_execute',
           'loop_description', 'scan_execute']

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'scan_loop.pyx')
MODULE_NAME = 'scan_loop'
CYTHON_REQUIREMENT = 'cython>=3.0'
# Cython's C++ takes minutes at most; a build that runs longer has hung.
BUILD_TIMEOUT_S = 900

_loaded = {}  # 'execute' and 'directory', or 'why'


class ScanLoopUnavailable(RuntimeError):
    """The compiled loop could not be built or loaded."""


def _compile_flags():
    from theano.gof import cmodule
    return cmodule.GCC_compiler.compile_args() + ['-O2', '-fwrapv', '-fno-strict-aliasing']


def build_directory():
    """Where this source, built by this Cython with these flags, lives in
    Theano's compile cache."""
    import Cython
    import numpy
    import theano
    key = hashlib.sha256()
    with open(SOURCE, 'rb') as source:
        key.update(source.read())
    key.update(('\0'.join([Cython.__version__, numpy.__version__, sys.version]
                          + _compile_flags())).encode())
    return os.path.join(theano.config.compiledir, 'theano_multigpu_scan_loop',
                        key.hexdigest()[:16])


def _cythonize(directory):
    """scan_loop.pyx -> C++ in ``directory``; its path."""
    target = os.path.join(directory, MODULE_NAME + '.cpp')
    try:
        result = subprocess.run(
            [sys.executable, '-m', 'cython', '-3', '--cplus', '-o', target, SOURCE],
            capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as error:
        raise ScanLoopUnavailable('Cython did not run: %s' % error)
    if result.returncode != 0:
        raise ScanLoopUnavailable('Cython failed on %s:\n%s'
                                  % (SOURCE, (result.stderr or result.stdout)[-2000:]))
    return target


def _build(directory):
    """Build the module into ``directory``, which appears whole or not at
    all: built in a directory of its own beside it, then renamed (another
    process building at the same moment wastes its work, nothing more).
    Returns the module, loaded from where it was built: the renamed file is
    the same file to the dynamic loader, which hands back the module loaded
    already, whose path is the old one (Theano's dlimport refused it, and a
    first run fell back to the Python loop)."""
    import numpy
    from theano.gof import cmodule
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    building = tempfile.mkdtemp(prefix='building-', dir=parent)
    try:
        sys.stderr.write('theano_multigpu: building Scan\'s compiled loop (once) into %s\n'
                         % directory)
        generated = _cythonize(building)
        with open(generated) as cpp:
            code = cpp.read()
        os.remove(generated)  # Theano keeps its own copy, mod.cpp
        try:
            module = cmodule.GCC_compiler.compile_str(
                MODULE_NAME, code, location=building, include_dirs=[numpy.get_include()],
                preargs=_compile_flags(), hide_symbols=False)
        except Exception as error:
            raise ScanLoopUnavailable('the C++ compiler failed: %s' % str(error)[-2000:])
        if os.path.isdir(directory):   # a broken one (its library went missing)
            shutil.rmtree(directory, ignore_errors=True)
        try:
            os.rename(building, directory)
        except OSError:
            if not os.path.isdir(directory):   # else another process's build won
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return module


def _load():
    """The compiled module: loaded from the cache, or built there first."""
    try:
        import Cython  # noqa: F401
    except ImportError:
        raise ScanLoopUnavailable('Cython is not installed (pip install "%s")'
                                  % CYTHON_REQUIREMENT)
    import theano
    from theano.gof import cmodule, compilelock
    if not theano.config.cxx:
        raise ScanLoopUnavailable('Theano has no C++ compiler (the cxx flag is empty)')
    directory = build_directory()
    library = os.path.join(directory, MODULE_NAME + '.' + cmodule.get_lib_extension())
    if not os.path.exists(library):
        compilelock.get_lock()   # saves other processes the same build
        try:
            if not os.path.exists(library):
                return _build(directory), directory
        finally:
            compilelock.release_lock()
    try:
        return cmodule.dlimport(library), directory
    except Exception as error:
        raise ScanLoopUnavailable('%s did not load: %s' % (library, error))


def compiled_execute():
    """The compiled ``execute(op, node, args, outs)``, or None (after one
    warning naming the reason) when it cannot be had."""
    if not _loaded:
        try:
            module, directory = _load()
        except Exception as error:  # whatever stops the build, Scan still runs
            why = str(error) if isinstance(error, ScanLoopUnavailable) else (
                '%s: %s' % (type(error).__name__, error))
            warnings.warn(
                "theano_multigpu: Scan runs its Python loop (recurrent layers train, "
                "slower), because its compiled loop is not available: %s" % why,
                RuntimeWarning, stacklevel=3)
            _loaded['why'] = why
        else:
            _loaded.update(execute=module.execute, directory=directory)
    return _loaded.get('execute')


def _chosen_loop():
    import theano
    try:
        return theano.config.multigpu.scan_loop
    except AttributeError:  # the fixes installed after Theano was imported
        return 'compiled'


def loop_description():
    """Which loop Scan runs, and why, for ``info``."""
    if _chosen_loop() == 'python':
        return 'Python (multigpu.scan_loop=python)'
    if compiled_execute() is None:
        return 'Python, the compiled loop is not available: %s' % _loaded['why']
    return 'compiled (Cython, %s)' % _loaded['directory']


def scan_execute(python_execute):
    """``Scan.execute``: the compiled loop, or ``python_execute``."""
    def execute(self, node, args, outs):
        if _chosen_loop() == 'compiled':
            compiled = compiled_execute()
            if compiled is not None:
                return compiled(self, node, args, outs)
        return python_execute(self, node, args, outs)
    execute.python_execute = python_execute
    return execute
