"""Theano 1.0.5 on Python 3.11 and numpy 1.23: BLAS flags, ifelse, scan,
and a compile cache that survives the process."""
import hashlib
import inspect
import os
import re
import subprocess
import sys
import textwrap

from .. import importhook
from ..config.mpi_environment import launched_by_mpi
from ..config.settings import CONFIGPARSER
from ..patch_targets import Parameters, SourceDigest, refused, replace, wrap
from . import compiled_scan, scan_buffers

__all__ = ['install', 'default_blas_ldflags']

COP_CACHE_VERSION = SourceDigest(
    'theano.gof.op.COp.c_code_cache_version', '3272ae56d63cc420',
    'replaced: a cache key without Python\'s randomised hash')
SCAN_EXECUTE = SourceDigest(
    'theano.scan_module.scan_op.Scan.execute', '9319690aa23416f2',
    'its source is edited for OpenCL contexts and compiled again')
CMODULE_KEY = SourceDigest(
    'theano.gof.cc.CLinker.cmodule_key_', 'f09f558daa891203',
    'its source is edited: an op without parameters no longer unversions the cache key')
ROUND_C_CODE = SourceDigest(
    'theano.scalar.basic.RoundHalfToEven.c_code', 'ebc60583a06f7edc',
    "wrapped: floorf, which OpenCL C lacks, becomes floor")
ROUND_CACHE_VERSION = Parameters(
    'theano.scalar.basic.RoundHalfToEven.c_code_cache_version', ('self',),
    'wrapped: the portable C code gets a cache key of its own')
COMPILE_LOCK = Parameters(
    'theano.gof.compilelock.lock', ('tmp_dir', 'timeout', 'min_wait', 'max_wait', 'verbosity'),
    'wrapped: a process waiting for the compile lock looks again within 0.2 s')
CACHE_KEY_FILE = SourceDigest(
    'theano.gof.cmodule.KeyData.save_pkl', 'b48ab07cf05dc144',
    'replaced: key.pkl is written beside itself, then renamed into place')
REDUCTION_KERNEL = SourceDigest(
    'theano.gpuarray.elemwise.GpuCAReduceCPY.generate_kernel', '0d6d7408c969505f',
    'replaced: a smaller work-group on CPU OpenCL devices')
REDUCTION_CACHE_VERSION = Parameters(
    'theano.gpuarray.elemwise.GpuCAReduceCPY.c_code_cache_version_apply', ('self', 'node'),
    'wrapped: the work-group size joins the cache key')


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
    CONFIGPARSER.check(configparser)
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


# How long a process waiting for Theano's compile lock sleeps before it
# looks again: a random time in this range, in seconds.
COMPILE_LOCK_POLL = (0.05, 0.2)


def _poll_compile_lock_often(compilelock):
    """Processes that share a compile cache (MPI ranks, a script beside a
    test) take turns compiling its modules, each under Theano's lock for
    the second or so one module takes.  A process that finds the lock taken
    slept compile.wait seconds (5, and at least 1) to twice that before it
    looked again, so the lock stood free most of the time they waited, one
    core compiling at most.  A waiter looks again within COMPILE_LOCK_POLL
    unless its caller asks for other waits."""
    def polled_often(lock):
        def lock_polled_often(tmp_dir, timeout=compilelock.notset, min_wait=None,
                              max_wait=None, verbosity=1):
            if min_wait is None and max_wait is None:
                min_wait, max_wait = COMPILE_LOCK_POLL
            return lock(tmp_dir, timeout=timeout, min_wait=min_wait, max_wait=max_wait,
                        verbosity=verbosity)
        return lock_polled_often
    wrap(COMPILE_LOCK, compilelock, 'lock', polled_often)


def _write_cache_keys_whole(cmodule):
    """A module's ``key.pkl`` in Theano's compile cache is replaced whole or
    not at all.  Theano wrote it in place, and a process refreshing the
    cache reads it without the compile lock: one that read a file half
    written took the module for broken and deleted it, under the processes
    that had just compiled or loaded it (FileNotFoundError on that
    ``key.pkl`` when they next added a key; aesara-devs/aesara#858)."""
    import pickle

    def save_pkl(self):
        partial = '%s.%d.partial' % (self.key_pkl, os.getpid())
        try:
            with open(partial, 'wb') as f:
                pickle.dump(self, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(partial, self.key_pkl)
        except pickle.PicklingError:
            # (Theano's warning; the key file written before stays as it was.)
            cmodule._logger.warning('Cache leak due to unpickle-able key data %s', self.keys)
            raise
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    save_pkl.__doc__ = cmodule.KeyData.save_pkl.__doc__
    replace(CACHE_KEY_FILE, cmodule.KeyData, 'save_pkl', save_pkl)


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
    replace(COP_CACHE_VERSION, op_module.COp, 'c_code_cache_version', _stable_cop_cache_version)


def _edited_function(function, edits, helpers, expectation, module_globals):
    """``function`` (``expectation``'s target, as its patch checked it) with
    ``edits`` made to its source, compiled again with ``module_globals`` (its
    module's) and ``helpers`` ({name: value}) as enclosing names: nothing is
    added to Theano's module.  Each edit is (pattern, replacement, matches),
    made by ``re.subn`` with DOTALL; PatchTargetError when a pattern does not
    match ``matches`` times."""
    lines, first_line = inspect.getsourcelines(function)
    source = textwrap.dedent(''.join(lines))
    for pattern, replacement, expected in edits:
        source, found = re.subn(pattern, replacement, source, flags=re.DOTALL)
        if found != expected:
            raise refused(expectation.target, expectation.why,
                          'the pattern %r %d times' % (pattern, expected),
                          'found it %d times' % found)
    names = sorted(helpers)
    enclosed = 'def _with_helpers(%s):\n%s    return %s\n' % (
        ', '.join(names), textwrap.indent(source, '    '), function.__name__)
    # Line numbers as in the file (the enclosing def takes the line before).
    code = compile('\n' * (first_line - 2) + enclosed, inspect.getsourcefile(function), 'exec')
    namespace = {}
    exec(code, module_globals, namespace)
    return namespace['_with_helpers'](*[helpers[name] for name in names])


# Edits of Theano 1.0.5's Scan.execute (checked by SCAN_EXECUTE first):
# (pattern, replacement, matches).  The names they call are _SCAN_HELPERS'.
_SCAN_EDITS = [
    # pygpu's gpudata raises "This is for CUDA arrays." on OpenCL.
    (r'\b(\w+)\.gpudata\b', r'_theano_multigpu_device_address(\1)', 5),
    # An ndarray's ``data`` is a memoryview, and ``==`` compared the
    # contents of two outputs, element by element, twice per output and
    # step; compare where the data starts, as for GpuArrays.
    (r'\b(var|new_var)\.data\b', r'_theano_multigpu_host_address(\1)', 5),
    # The ring-buffer reordering copies between overlapping halves when the
    # buffer length is odd.
    (r'( *)pdx = pos\[idx\]\n.*?del tmp\n.*?del tmp\n',
     r'\1_theano_multigpu_rotate_left(outs[idx][0], pos[idx], '
     r'node.outputs[idx].type)\n', 1),
    # Each step's output buffer is written whole by the loop: no fill (on
    # OpenCL a fill builds a kernel at every call).
    (r'outs\[j\]\[0\] = node\.outputs\[j\]\.type\.value_zeros\(shape\)',
     r'outs[j][0] = _theano_multigpu_unfilled(node.outputs[j].type, shape)', 1),
]
_SCAN_HELPERS = {'_theano_multigpu_device_address': scan_buffers.device_address,
                 '_theano_multigpu_host_address': scan_buffers.host_address,
                 '_theano_multigpu_rotate_left': scan_buffers.rotate_left,
                 '_theano_multigpu_unfilled': scan_buffers.unfilled}


def _edited_scan_execute(execute, scan_op_globals):
    """``execute`` (Theano 1.0.5's Scan.execute) with _SCAN_EDITS made."""
    return _edited_function(execute, _SCAN_EDITS, _SCAN_HELPERS, SCAN_EXECUTE, scan_op_globals)


def _fix_scan_on_opencl(scan_op_module):
    """Scan's Python loop failed on OpenCL contexts, so every recurrent
    layer did; recompile ``Scan.execute`` with the edits in _SCAN_EDITS
    (CPU numbers are unchanged: copies only).  Scan then runs the compiled
    loop (``compiled_scan``), and this one where that cannot be built."""
    def edited(execute):
        return compiled_scan.scan_execute(_edited_scan_execute(execute, vars(scan_op_module)))
    wrap(SCAN_EXECUTE, scan_op_module.Scan, 'execute', edited)


# Edit of Theano 1.0.5's CLinker.cmodule_key_ (checked by CMODULE_KEY first):
# (pattern, replacement, matches).  The rule: _version_ops_without_props.
_CMODULE_KEY_EDITS = [
    (r'version\.append\(node\.op\.__props__\)',
     'version.append(node.op.__props__ or _theano_multigpu_empty_props_version(node))', 1),
]


def _empty_props_version(node):
    """The version part of an op without parameters: present, and naming
    the kinds of the contexts its node runs on (a GPU op's C code can
    differ between CUDA and OpenCL, e.g. expf and exp, while nothing else
    in its key does)."""
    kinds = set()
    for variable in node.inputs + node.outputs:
        kind = getattr(getattr(variable.type, 'context', None), 'kind', None)
        if kind is not None:
            kinds.add(kind.decode() if isinstance(kind, bytes) else str(kind))
    return ('__props__',) + tuple(sorted(kinds))


def _version_ops_without_props(cc_module):
    """The version of a C module's cache key holds, per node, the op's
    ``__props__`` (the names of what its equality compares), and Theano
    takes any empty part of the version for a missing one: the key is then
    unversioned, Theano writes no key.pkl, no other process finds the
    module, and each compiles it again.  But ``__props__ == ()`` is
    declared, not missing: the op has no parameters, and its type alone
    tells it apart (Shape, Alloc, ScalarFromTensor, Dot22, Softmax,
    SoftmaxWithBias, SoftmaxGrad, ...).  So an empty ``__props__`` enters
    the version as a part that is present, naming the kinds of the node's
    contexts (``_empty_props_version``; a non-empty one as before: the
    keys of modules already versioned stay the same), and whether a key is
    versioned rests on the ops' and types' c_code_cache_version alone.
    Every caller (cmodule_key, cmodule_key_variables, gpuarray's
    optimizer, Scan's hash) looks cmodule_key_ up on a CLinker, so setting
    the class's attribute reaches them all."""
    wrap(CMODULE_KEY, cc_module.CLinker, 'cmodule_key_', lambda cmodule_key_: _edited_function(
        cmodule_key_, _CMODULE_KEY_EDITS,
        {'_theano_multigpu_empty_props_version': _empty_props_version}, CMODULE_KEY,
        vars(cc_module)))


def _fix_round_on_opencl(scalar_module):
    """RoundHalfToEven's C code calls ``floorf``, which OpenCL C lacks: the
    GPU kernel failed to build and Theano crashed compiling any OpenCL
    function with ``K.round`` (Keras's binary accuracy).  Call the overloaded
    ``floor`` (exact for float too, so the same numbers on the CPU)."""
    def portable(c_code):
        def portable_c_code(self, node, name, inputs, outputs, sub):
            return c_code(self, node, name, inputs, outputs, sub).replace('floorf(', 'floor(')
        return portable_c_code

    round_op = scalar_module.RoundHalfToEven
    wrap(ROUND_C_CODE, round_op, 'c_code', portable)
    wrap(ROUND_CACHE_VERSION, round_op, 'c_code_cache_version',
         lambda cache_version: lambda self: cache_version(self) + ('floor',))


# Work-group size of the OpenCL reduction kernels on CPU devices (pocl).
CPU_REDUCTION_LOCAL_SIZE = 16


def _is_cpu_opencl(context):
    """pocl's CPU devices: 'pthread-...', 'cpu-...' or 'basic-...'."""
    name = context.devname.lower()
    return context.kind == b'opencl' and name.startswith(('pthread', 'cpu', 'basic'))


def reduction_local_size(context, theano_local_size):
    """The work-group size of a sum's kernel on ``context``."""
    if _is_cpu_opencl(context):
        return min(theano_local_size, CPU_REDUCTION_LOCAL_SIZE)
    return theano_local_size


def _fix_reduction_on_cpu_opencl(gpuarray_elemwise):
    """GpuCAReduceCPY (sums on OpenCL contexts) launched every kernel with
    the device's largest work-group, 4096 on pocl, whatever the rows to sum:
    on a CPU each work-group is a loop with a barrier per halving, so
    summing a 32x256 gradient over its rows took 40 ms.  On CPU devices
    the work-group is 16 (the same sum: 0.3 ms); elsewhere it is Theano's.
    The compile cache is keyed on it."""
    from pygpu.reduction import ReductionKernel
    from theano import scalar
    op = gpuarray_elemwise.GpuCAReduceCPY
    reduce_exprs = ((scalar.basic.Add, 'a + b'), (scalar.basic.Mul, 'a * b'))

    def generate_sized_kernel(self, node, odtype, redux):
        """Theano's generate_kernel, with the work-group capped before the
        kernel is first built (each build is an OpenCL compile)."""
        reduce_expr = next((e for c, e in reduce_exprs if isinstance(self.scalar_op, c)), None)
        if reduce_expr is None:
            raise NotImplementedError()
        kernel = ReductionKernel(node.inputs[0].type.context, odtype, self.scalar_op.identity,
                                 reduce_expr, redux,
                                 arguments=[gpuarray_elemwise.make_argument(node.inputs[0], 'a')])
        kernel.init_local_size = reduction_local_size(kernel.context, kernel.init_local_size)
        return kernel

    def sized(cache_version):
        def sized_cache_version(self, node):
            kernel = self.get_kernel_cache(node)
            size = kernel.init_local_size if kernel is not None else 0
            return cache_version(self, node) + ('local_size', size)
        return sized_cache_version

    replace(REDUCTION_KERNEL, op, 'generate_kernel', generate_sized_kernel)
    wrap(REDUCTION_CACHE_VERSION, op, 'c_code_cache_version_apply', sized)


class _Mpi4pyHidden(object):
    """theano.tensor.io imports mpi4py, which starts MPI, whenever Theano
    is imported; outside mpirun nothing needs it, so Theano does not see it
    there (sys.modules' None makes that one import fail), while
    theano.tensor.io executes."""

    def __init__(self):
        self.hidden = False

    def hide(self, io_module):
        if not launched_by_mpi() and 'mpi4py' not in sys.modules:
            sys.modules['mpi4py'] = None
            self.hidden = True

    def show(self, io_module):
        if self.hidden:
            del sys.modules['mpi4py']
            self.hidden = False


def install():
    from . import shared_views
    importhook.after_import('theano.compile.function', shared_views.install)
    importhook.after_import('theano.scan_module.scan', shared_views.install_scan)
    if 'theano.tensor.io' not in sys.modules:
        hidden = _Mpi4pyHidden()
        importhook.before_import('theano.tensor.io', hidden.hide)
        importhook.after_import('theano.tensor.io', hidden.show)
    importhook.after_import('theano.gpuarray.elemwise', _fix_reduction_on_cpu_opencl)
    importhook.after_import('theano.configparser', _set_blas_ldflags)
    importhook.after_import('theano', _import_ifelse)
    importhook.after_import('theano.gof.op', _fix_cop_cache_version)
    importhook.after_import('theano.gof.cc', _version_ops_without_props)
    importhook.after_import('theano.gof.compilelock', _poll_compile_lock_often)
    importhook.after_import('theano.gof.cmodule', _write_cache_keys_whole)
    importhook.after_import('theano.scan_module.scan_op', _fix_scan_on_opencl)
    importhook.after_import('theano.scalar.basic', _fix_round_on_opencl)
    # Scan's pre-generated Cython C file does not compile on Python 3.11
    # (longintrepr.h, PyCode_New).  With this module unimportable, Scan
    # calls Scan.execute, which runs the project's compiled loop.
    sys.modules.setdefault('theano.scan_module.scan_perform_ext', None)
