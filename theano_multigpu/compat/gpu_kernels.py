"""Theano's GPU kernels: one that fails to build is a Python exception that
says why, never a crash; and the kernels of Theano 1.0.5 that OpenCL C
refused or that computed other numbers than the CPU.

When a kernel failed to build, Theano's GpuElemwise freed its NULL handle in
the C struct's cleanup, and the process died (a segmentation fault in
``cthunk_factory``).  Its handle now starts NULL and is freed only when set,
and a C thunk of a GPU op that fails to instantiate raises KernelBuildError:
the op, its context and device, and the first lines of the compiler's log
(the kernel's source is built once more through pygpu, which returns the
log that Theano's C glue drops).

Theano's scalar maximum and minimum return ``nan("")`` for unordered
operands; OpenCL C has no ``nan(const char *)``, so every kernel with
``K.maximum`` or ``K.minimum`` (Keras's siamese example) failed to build.
``NAN`` is the same value in C, CUDA and OpenCL.

The gradient of average pooling (GpuAveragePoolGrad, used without cuDNN)
read the output gradient of the first image and the first depth slice for
every 3-D window, and of the first image for every window in sum mode; and
it counted the padding in the window's size where the forward pass does
not (``average_exc_pad``, Keras's AveragePooling with border_mode='same').
Its kernels now read each window's own gradient and size it as the
forward pass does.

GpuPool and GpuMaxPoolRop compute their output's shape as Pool.out_shape
does (floor division, never fewer than 0 windows: Theano's macro computed
it in size_t, so a window larger than the input wrapped to 2**64 - 1 and
the allocation failed), and launch no kernel for an empty output.

The nodes of one compiled C module on one context share its GPU kernels.
Theano compiles a module per op and signature and builds its kernels for
every node that uses it: pocl compiles each kernel's source again (about
60 ms), so a function with N replicas built each kernel N times per node.
A module now keeps the kernels (a GpuKernel's handle, a GpuElemwise) it
built on each context, counted by the nodes using them and freed with the
last: one module's code is one source, so its nodes build the same kernels.
"""
import hashlib

from ..errors import KernelBuildError
from ..patch_targets import CodeNames, Parameters, SourceDigest, refused, replace, wrap

__all__ = ['install', 'kernel_build_log', 'corrected_average_pool_grad']

ELEMWISE_HANDLE = SourceDigest(
    'theano.gpuarray.elemwise.GpuElemwise.c_support_code_struct', 'd7add6f9e392de79',
    'replaced: the kernel handle starts NULL')
ELEMWISE_CLEANUP = SourceDigest(
    'theano.gpuarray.elemwise.GpuElemwise.c_cleanup_code_struct', 'e1acf1f54201d245',
    'replaced: the handle is freed only when the kernel was built')
ELEMWISE_INIT = SourceDigest(
    'theano.gpuarray.elemwise.GpuElemwise.c_init_code_struct', '6fbc120ee152d69d',
    'wrapped: kernels for strided operands are built when first called')
ELEMWISE_CACHE_VERSION = Parameters(
    'theano.gpuarray.elemwise.GpuElemwise.c_code_cache_version_apply', ('self', 'node'),
    'wrapped: the fixed C code gets a cache key of its own')
MAKE_C_THUNK = Parameters(
    'theano.gof.op.Op.make_c_thunk', ('self', 'node', 'storage_map', 'compute_map',
                                      'no_recycling'),
    'wrapped: a GPU kernel that fails to build raises KernelBuildError')
MAXIMUM_C_CODE = SourceDigest(
    'theano.scalar.basic.Maximum.c_code', 'c270bd301da8e418',
    'wrapped: nan(""), which OpenCL C lacks, becomes NAN')
MINIMUM_C_CODE = SourceDigest(
    'theano.scalar.basic.Minimum.c_code', '4845bce58c76f844',
    'wrapped: nan(""), which OpenCL C lacks, becomes NAN')
MAXIMUM_CACHE_VERSION = Parameters(
    'theano.scalar.basic.Maximum.c_code_cache_version', ('self',),
    'wrapped: the portable C code gets a cache key of its own')
MINIMUM_CACHE_VERSION = Parameters(
    'theano.scalar.basic.Minimum.c_code_cache_version', ('self',),
    'wrapped: the portable C code gets a cache key of its own')

AVERAGE_POOL_GRAD_INIT = SourceDigest(
    'theano.gpuarray.pool.GpuAveragePoolGrad.__init__', '7c7f47552d45a1d4',
    'wrapped: its kernels (c_code/pool_ave_grad.c) are corrected after loading')
AVERAGE_POOL_GRAD_CACHE_VERSION = Parameters(
    'theano.gpuarray.pool.GpuAveragePoolGrad.c_code_cache_version_apply', ('self', 'node'),
    'wrapped: the corrected kernels get a cache key of their own')

POOL_INIT = SourceDigest(
    'theano.gpuarray.pool.GpuPool.__init__', 'a5c71db71bdaa86a',
    'wrapped: its output shape (c_code/pool.c) is computed as Pool.out_shape does')
POOL_CACHE_VERSION = Parameters(
    'theano.gpuarray.pool.GpuPool.c_code_cache_version_apply', ('self', 'node'),
    'wrapped: the corrected code gets a cache key of its own')
POOL_ROP_INIT = SourceDigest(
    'theano.gpuarray.pool.GpuMaxPoolRop.__init__', '52ca661e1f562b4c',
    'wrapped: its output shape (c_code/pool_max_rop.c) is computed as Pool.out_shape does')
POOL_ROP_CACHE_VERSION = Parameters(
    'theano.gpuarray.pool.GpuMaxPoolRop.c_code_cache_version_apply', ('self', 'node'),
    'wrapped: the corrected code gets a cache key of its own')
# What the patched __init__s correct: the C code sections COp loaded.
CODE_SECTIONS = CodeNames(
    'theano.gof.op.COp.load_c_code', ('code_sections',),
    'read: the loaded C code sections are corrected in place')

KERNEL_VARS = SourceDigest(
    'theano.gpuarray.basic_ops.GpuKernelBase._generate_kernel_vars', 'db5e694459f70bda',
    "replaced: the struct also keeps the module's kernels per context")
KERNEL_INIT = SourceDigest(
    'theano.gpuarray.basic_ops.GpuKernelBase._generate_kernel_init', '59afe1c5ca864028',
    "replaced: a node takes the module's kernel for its context, built once")
KERNEL_CLEANUP = SourceDigest(
    'theano.gpuarray.basic_ops.GpuKernelBase._generate_kernel_cleanup', 'd76935cd50ce941a',
    "replaced: the last node using a kernel frees it")
KERNEL_VERSION = Parameters(
    'theano.gpuarray.basic_ops.GpuKernelBase.kernel_version', ('self', 'node'),
    'wrapped: the shared kernels get a cache key of their own')
SHARED_PER_CONTEXT = 'kernels shared per context'

# Theano's private helpers that build a failed kernel again, for its log.
ELEMWISE_OP_STRING = Parameters(
    'theano.gpuarray.elemwise.GpuElemwise._generate_op_string', ('self', 'node'),
    "read: the expression of the op's kernel")
ELEMWISE_NAMES = Parameters(
    'theano.gpuarray.elemwise.GpuElemwise._get_vnames', ('self', 'node'),
    "read: the names of the kernel's operands")
KERNELS_OF_OP = Parameters(
    'theano.gpuarray.basic_ops.GpuKernelBase.gpu_kernels', ('self', 'node', 'name'),
    "read: the op's kernels, as Kernel objects")
KERNEL_FIELDS = CodeNames(
    'theano.gpuarray.basic_ops.Kernel.__init__', ('code', 'params', 'name', 'flags'),
    "read: a kernel's source, argument types, name and flags")

# Lines of the compiler's log an error shows.
LOG_LINES = 12
# What Theano's C glue says when a kernel did not build (its own words,
# misspelling included) where the kernel's source cannot be built again.
KERNEL_INIT_FAILURES = ('GpuKernel_init error', 'Could not initialize elemwise support',
                        'Could not intialize inplace add support')


def _portable_c_code(c_code):
    def portable_c_code(self, node, name, inputs, outputs, sub):
        return c_code(self, node, name, inputs, outputs, sub).replace('nan("")', 'NAN')
    return portable_c_code


def _nan_cache_version(cache_version):
    return lambda self: cache_version(self) + ('NAN',)


def _fix_nan_in_maximum_and_minimum(scalar_module):
    for op_class, c_code, cache_version in (
            (scalar_module.Maximum, MAXIMUM_C_CODE, MAXIMUM_CACHE_VERSION),
            (scalar_module.Minimum, MINIMUM_C_CODE, MINIMUM_CACHE_VERSION)):
        wrap(c_code, op_class, 'c_code', _portable_c_code)
        wrap(cache_version, op_class, 'c_code_cache_version', _nan_cache_version)


def _handle_cache_version(cache_version):
    def c_code_cache_version_apply(self, node):
        version = cache_version(self, node)
        return (version + ('handle NULL', 'strided kernels when called', SHARED_PER_CONTEXT)
                if version else version)
    return c_code_cache_version_apply


def _shared_per_context(prefix, handle, retain, free):
    """C++ for an op's struct: the handles of type ``handle`` that the nodes
    of this module build, one per context, shared by the nodes.  The
    registry lives in a function's static, so the module holds one.
    ``PREFIX_find(ctx)`` returns the context's handle (counting one more
    user) or NULL; ``PREFIX_keep(ctx, h)`` shares a handle just built
    (``retain`` takes the registry's reference); ``PREFIX_release(h)`` counts
    a user less, ``free``s the handle with the last, and returns 0 for a
    handle that was never shared, which its node frees itself."""
    return """
struct %(p)s_entry { %(p)s_entry *next; gpucontext *ctx; %(h)s handle; size_t users; };
static %(p)s_entry *&%(p)s_entries() { static %(p)s_entry *head = NULL; return head; }
static %(h)s %(p)s_find(gpucontext *ctx) {
  for (%(p)s_entry *e = %(p)s_entries(); e != NULL; e = e->next)
    if (e->ctx == ctx) { e->users++; return e->handle; }
  return NULL;
}
static void %(p)s_keep(gpucontext *ctx, %(h)s handle) {
  %(p)s_entry *e = (%(p)s_entry *)malloc(sizeof(%(p)s_entry));
  if (e == NULL) return;
  %(retain)s
  e->ctx = ctx; e->handle = handle; e->users = 1; e->next = %(p)s_entries();
  %(p)s_entries() = e;
}
static int %(p)s_release(%(h)s handle) {
  for (%(p)s_entry **at = &%(p)s_entries(); *at != NULL; at = &(*at)->next) {
    if ((*at)->handle != handle) continue;
    %(p)s_entry *e = *at;
    if (--e->users == 0) { *at = e->next; %(free)s(e->handle); free(e); }
    return 1;
  }
  return 0;
}
""" % dict(p=prefix, h=handle, retain=retain, free=free)


ELEMWISE_SHARED = _shared_per_context('tmg_ge', 'GpuElemwise *', '', 'GpuElemwise_free')


def _fix_elemwise_handle(gpuarray_elemwise):
    elemwise = gpuarray_elemwise.GpuElemwise
    ELEMWISE_OP_STRING.check(elemwise._generate_op_string)
    ELEMWISE_NAMES.check(elemwise._get_vnames)
    replace(ELEMWISE_HANDLE, elemwise, 'c_support_code_struct',
            lambda self, node, name: ELEMWISE_SHARED + '\nGpuElemwise *ge = NULL;\n')
    replace(ELEMWISE_CLEANUP, elemwise, 'c_cleanup_code_struct',
            lambda self, node, name: '\nif (ge != NULL) {'
                                     ' if (!tmg_ge_release(ge)) GpuElemwise_free(ge);'
                                     ' ge = NULL; }\n')
    wrap(ELEMWISE_CACHE_VERSION, elemwise, 'c_code_cache_version_apply', _handle_cache_version)
    _build_strided_elemwise_kernels_when_called(elemwise)


def _check_kernel_sources(basic_ops):
    """What kernel_build_log reads of Theano's ops and kernels."""
    KERNELS_OF_OP.check(basic_ops.GpuKernelBase.gpu_kernels)
    KERNEL_FIELDS.check(basic_ops.Kernel.__init__)


def _share_kernels_per_context(basic_ops):
    """GpuKernelBase's kernels: a node takes its context's kernel from the
    module's registry (a reference of its own to the handle), and the first
    node on a context builds it.  Sharing a handle is safe because
    libgpuarray keeps a kernel's arguments in the handle and every call of
    Theano's C code sets them all right before it launches, holding the
    GIL; the argument buffer a node allocates is the one GpuKernel_clear
    frees."""
    base = basic_ops.GpuKernelBase
    for expectation in (KERNEL_VARS, KERNEL_INIT, KERNEL_CLEANUP, KERNEL_VERSION):
        expectation.check(expectation.subject(base, expectation.target.rsplit('.', 1)[1]))

    def kernel_vars(self, k):
        return (_shared_per_context('tmg_' + k.objvar, 'gpukernel *', 'gpukernel_retain(handle);',
                                    'gpukernel_release')
                + 'GpuKernel %s;' % k.objvar)

    def kernel_init(self, k, fail, ctx):
        return """{
  int err;
  int types[%(numargs)u] = {%(types)s};
  gpukernel *shared = tmg_%(ovar)s_find(%(ctx)s->ctx);
  if (shared != NULL) {
    %(ovar)s.k = shared;
    gpukernel_retain(shared);
    %(ovar)s.args = (void **)calloc(%(numargs)u, sizeof(void *));
    if (%(ovar)s.args == NULL) {
      PyErr_NoMemory();
      %(fail)s
    }
  } else {
    if ((err = GpuKernel_init(&%(ovar)s, %(ctx)s->ctx, 1,
                              &%(cname)s, NULL, "%(kname)s", %(numargs)u,
                              types, %(flags)s, NULL)) != GA_NO_ERROR) {
      PyErr_Format(PyExc_RuntimeError, "GpuKernel_init error %%d: %%s",
                   err, gpucontext_error(%(ctx)s->ctx, err));
      %(fail)s
    }
    tmg_%(ovar)s_keep(%(ctx)s->ctx, %(ovar)s.k);
  }
}""" % dict(numargs=len(k.params), types=k._get_c_types(), ovar=k.objvar, kname=k.name,
            cname=k.codevar, flags=k._get_c_flags(), fail=fail, ctx=ctx)

    def kernel_cleanup(self, k):
        return ('if (%(ovar)s.k != NULL) tmg_%(ovar)s_release(%(ovar)s.k);\n'
                'GpuKernel_clear(&%(ovar)s);' % dict(ovar=k.objvar))

    def versioned(kernel_version):
        return lambda self, node: kernel_version(self, node) + (SHARED_PER_CONTEXT,)

    replace(KERNEL_VARS, base, '_generate_kernel_vars', kernel_vars)
    replace(KERNEL_INIT, base, '_generate_kernel_init', kernel_init)
    replace(KERNEL_CLEANUP, base, '_generate_kernel_cleanup', kernel_cleanup)
    wrap(KERNEL_VERSION, base, 'kernel_version', versioned)


def _build_strided_elemwise_kernels_when_called(elemwise):
    """GpuElemwise_new builds, besides the kernel for contiguous operands,
    one kernel per rank up to the op's (1-D, 2-D, ...), each with 32-bit
    and with 64-bit addressing: 1 + 2*ndim kernels for every op, most never
    called.  Given rank 0, libgpuarray builds only the contiguous kernel;
    GpuElemwise_call builds a strided one when an operand first needs it
    (check_basic grows its buffers to the operands' rank).  The contiguous
    kernel holds the op's expression, so one that does not compile still
    fails when the function is made."""
    def strided_when_called(stock):
        def c_init_code_struct(self, node, name, sub):
            eager = 'args, %d, GE_CONVERT_F16);' % node.inputs[0].ndim
            build = stock(self, node, name, sub).replace(eager, 'args, 0, GE_CONVERT_F16);')
            # The context's GpuElemwise of this module, built by its first node.
            ctx = '%s->ctx' % sub['params']
            return ('ge = tmg_ge_find(%s);\nif (ge == NULL) {\n%s\ntmg_ge_keep(%s, ge);\n}\n'
                    % (ctx, build, ctx))
        return c_init_code_struct
    wrap(ELEMWISE_INIT, elemwise, 'c_init_code_struct', strided_when_called)


# pool_ave_grad.c's window loops, as Theano 1.0.5 ships them (2-D, then
# 3-D), and as the forward kernels (pool.c) size the windows.
_AVERAGE_2D = """        if (sum_mode) {
          collector += gz[ph*pooled_width + pw];
        } else {
          // figure out the pooling size
          const ga_size hstart = ph * stride_h - pad_h;
          const ga_size wstart = pw * stride_w - pad_w;
          const ga_size hend = min(hstart + kernel_h, height + pad_h);
          const ga_size wend = min(wstart + kernel_w, width + pad_w);
          const ga_size pool_size = (hend - hstart) * (wend - wstart);
          collector += gz_slice[ph*pooled_width + pw] / pool_size;
        }"""
_AVERAGE_2D_FIXED = """        if (sum_mode) {
          collector += gz_slice[ph*pooled_width + pw];
        } else {
          // the window's size, as the forward kernel counts it
          ga_int hstart = (ga_int)(ph * stride_h) - (ga_int)pad_h;
          ga_int wstart = (ga_int)(pw * stride_w) - (ga_int)pad_w;
          ga_int hend = min(hstart + (ga_int)kernel_h, (ga_int)(height + pad_h));
          ga_int wend = min(wstart + (ga_int)kernel_w, (ga_int)(width + pad_w));
          if (!inc_pad) {
            hstart = max(hstart, 0); wstart = max(wstart, 0);
            hend = min(hend, (ga_int)height); wend = min(wend, (ga_int)width);
          }
          const ga_size pool_size = (ga_size)((hend - hstart) * (wend - wstart));
          collector += gz_slice[ph*pooled_width + pw] / pool_size;
        }"""
_AVERAGE_3D = """          if (sum_mode) {
            collector += gz[ph*pooled_width + pw];
          } else {
            // figure out the pooling size
            const ga_size dstart = pd * stride_d - pad_d;
            const ga_size hstart = ph * stride_h - pad_h;
            const ga_size wstart = pw * stride_w - pad_w;
            const ga_size dend = min(dstart + kernel_d, depth + pad_d);
            const ga_size hend = min(hstart + kernel_h, height + pad_h);
            const ga_size wend = min(wstart + kernel_w, width + pad_w);
            const ga_size pool_size = (dend - dstart) * (hend - hstart) * (wend - wstart);
            collector += gz[ph*pooled_width + pw] / pool_size;
          }"""
_AVERAGE_3D_FIXED = """          const ga_size window = (pd*pooled_height + ph)*pooled_width + pw;
          if (sum_mode) {
            collector += gz_slice[window];
          } else {
            // the window's size, as the forward kernel counts it
            ga_int dstart = (ga_int)(pd * stride_d) - (ga_int)pad_d;
            ga_int hstart = (ga_int)(ph * stride_h) - (ga_int)pad_h;
            ga_int wstart = (ga_int)(pw * stride_w) - (ga_int)pad_w;
            ga_int dend = min(dstart + (ga_int)kernel_d, (ga_int)(depth + pad_d));
            ga_int hend = min(hstart + (ga_int)kernel_h, (ga_int)(height + pad_h));
            ga_int wend = min(wstart + (ga_int)kernel_w, (ga_int)(width + pad_w));
            if (!inc_pad) {
              dstart = max(dstart, 0); hstart = max(hstart, 0); wstart = max(wstart, 0);
              dend = min(dend, (ga_int)depth); hend = min(hend, (ga_int)height);
              wend = min(wend, (ga_int)width);
            }
            const ga_size pool_size = (ga_size)((dend - dstart) * (hend - hstart)
                                                * (wend - wstart));
            collector += gz_slice[window] / pool_size;
          }"""


def corrected_average_pool_grad(kernels):
    """pool_ave_grad.c's kernels section, corrected (see the module
    docstring); PatchTargetError when it is not Theano 1.0.5's."""
    found = [kernels.count(_AVERAGE_2D), kernels.count(_AVERAGE_3D)]
    if found != [1, 1]:
        raise refused('theano.gpuarray.pool.GpuAveragePoolGrad',
                      'its kernels in c_code/pool_ave_grad.c are corrected',
                      'its 2-D and 3-D window loops once each', 'found them %s times' % found)
    return kernels.replace(_AVERAGE_2D, _AVERAGE_2D_FIXED).replace(_AVERAGE_3D,
                                                                   _AVERAGE_3D_FIXED)


# pool.c's and pool_max_rop.c's output shape, as Theano 1.0.5 ships it (in
# size_t: a window larger than the input wraps), and as Pool.out_shape
# computes it.
_OUTPUT_DIMS = """#define OUTPUT_DIMS(in_dim, ws, st, ignore_border)        \\
  (ignore_border ? (in_dim - ws)/st + 1 :                 \\
   (st > ws ? (in_dim - 1)/st + 1 :                       \\
    std::max<ssize_t>(0, (in_dim - 1 - ws + st)/st) + 1))"""
_OUTPUT_DIMS_FIXED = """// Pool.out_shape's rule: floor division, and never fewer than 0 windows.
static inline ssize_t pool_floor_div(ssize_t a, ssize_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}
static inline size_t pool_output_dim(ssize_t in, ssize_t ws, ssize_t st, int ignore_border) {
  ssize_t out = ignore_border ? pool_floor_div(in - ws, st) + 1
              : st > ws ? pool_floor_div(in - 1, st) + 1
              : std::max<ssize_t>(0, pool_floor_div(in - 1 - ws + st, st)) + 1;
  return out > 0 ? (size_t)out : 0;
}
#define OUTPUT_DIMS(in_dim, ws, st, ignore_border) \\
  pool_output_dim((ssize_t)(in_dim), (ssize_t)(ws), (ssize_t)(st), (ignore_border))"""
# An empty output has nothing to compute: no kernel is launched.
_LAUNCH_SIZES = ('size_t num_kernels = z_dims[0] * z_dims[1] * z_dims[2] * z_dims[3];',
                 'size_t num_kernels = z_dims[0] * z_dims[1] * z_dims[2] * z_dims[3] * z_dims[4];')


def corrected_pool_output_shape(sections):
    """Correct pool.c's or pool_max_rop.c's sections in place (see
    _OUTPUT_DIMS); PatchTargetError when they are not Theano 1.0.5's."""
    support, struct = sections['support_code'], sections['support_code_struct']
    found = [support.count(_OUTPUT_DIMS)] + [struct.count(s) for s in _LAUNCH_SIZES]
    if found != [1] * len(found):
        raise refused('theano.gpuarray.pool.GpuPool',
                      'the output shape in c_code/pool.c and pool_max_rop.c is corrected',
                      'its OUTPUT_DIMS macro and its 2 kernel launch sizes once each',
                      'found them %s times' % found)
    sections['support_code'] = support.replace(_OUTPUT_DIMS, _OUTPUT_DIMS_FIXED)
    for launch in _LAUNCH_SIZES:
        struct = struct.replace(launch, launch + '\n      if (num_kernels == 0) return 0;')
    sections['support_code_struct'] = struct


def code_digest(sections):
    """The first 16 hex digits of the SHA-256 of an op's C code sections."""
    text = '\n'.join('%s\n%s' % (name, sections[name]) for name in sorted(sections))
    return hashlib.sha256(text.encode('utf8')).hexdigest()[:16]


def _correct_c_code(op_class, init_expectation, version_expectation, correct, version_tag):
    """Every instance of ``op_class`` gets its C code sections corrected by
    ``correct`` (a function of the sections dict) after loading; its cache
    key holds ``version_tag`` and the digest of the code it compiles."""
    def corrected_init(init):
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            correct(self.code_sections)
        return __init__

    def tagged_cache_version(cache_version):
        def c_code_cache_version_apply(self, node):
            version = cache_version(self, node)
            if not version:
                return version
            return version + (version_tag, code_digest(self.code_sections))
        return c_code_cache_version_apply
    wrap(init_expectation, op_class, '__init__', corrected_init)
    wrap(version_expectation, op_class, 'c_code_cache_version_apply', tagged_cache_version)


def _correct_average_pool_grad_sections(sections):
    sections['kernels'] = corrected_average_pool_grad(sections['kernels'])


def _fix_pools(gpuarray_pool):
    _correct_c_code(gpuarray_pool.GpuAveragePoolGrad, AVERAGE_POOL_GRAD_INIT,
                    AVERAGE_POOL_GRAD_CACHE_VERSION, _correct_average_pool_grad_sections,
                    'windows corrected')
    for op_class, init, version in ((gpuarray_pool.GpuPool, POOL_INIT, POOL_CACHE_VERSION),
                                    (gpuarray_pool.GpuMaxPoolRop, POOL_ROP_INIT,
                                     POOL_ROP_CACHE_VERSION)):
        _correct_c_code(op_class, init, version, corrected_pool_output_shape,
                        'output shape as Pool.out_shape')


def _raise_kernel_build_errors(gof_op):
    CODE_SECTIONS.check(gof_op.COp.load_c_code)
    wrap(MAKE_C_THUNK, gof_op.Op, 'make_c_thunk', _raising_kernel_build_errors)


def _raising_kernel_build_errors(stock):
    def make_c_thunk(self, node, storage_map, compute_map, no_recycling):
        try:
            return stock(self, node, storage_map, compute_map, no_recycling)
        except RuntimeError as error:
            # (NotImplementedError, a RuntimeError, is an op without C code.)
            context = _context_name(node)
            if context is None or isinstance(error, (KernelBuildError, NotImplementedError)):
                raise
            message = _message(node, context, error)
            if message is None:
                raise
            raise KernelBuildError(message) from error
    return make_c_thunk


def _context_name(node):
    """The context name of ``node``'s GPU outputs or inputs ('' for
    Theano's default context), or None for an op of the host."""
    from theano.gpuarray.type import GpuArrayType
    for variable in list(node.outputs) + list(node.inputs):
        if isinstance(variable.type, GpuArrayType):
            return variable.type.context_name or ''
    return None


def _message(node, context, error):
    """KernelBuildError's message, or None when ``error`` is not a kernel
    that failed to build."""
    from theano.gpuarray.type import get_context
    device = get_context(context or None)
    log = kernel_build_log(node, device)
    if log is None:
        if not any(marker in str(error) for marker in KERNEL_INIT_FAILURES):
            return None   # not a kernel that failed to build
        log = str(error)
    lines = log.strip().splitlines()
    shown = '\n'.join('    ' + line for line in lines[:LOG_LINES])
    more = '\n    ... (%d more lines)' % (len(lines) - LOG_LINES) if len(lines) > LOG_LINES else ''
    return ('the GPU kernel of %s failed to build on context %s (%s), so the function '
            'cannot run there. The compiler said:\n%s%s\nThis is a gap in Theano\'s '
            'GPU code for this device, not in your model: report it with the lines '
            'above; meanwhile run on the CPU (THEANO_FLAGS device=cpu) or on a CUDA '
            'device.' % (node.op, _user_name(context), device.devname, shown, more))


def _user_name(context):
    """The context's name in THEANO_FLAGS contexts=, with its device (the
    master's context is Theano's default, named None in the graph)."""
    from ..config import mesh
    try:
        current = mesh.current()
    except Exception:   # no mesh: a plain run's contexts
        current = None
    for name in (current.names if current is not None else []):
        if current.graph_name(name) == (context or None):
            return '%s -> %s' % (name, current.devices.get(name, '?'))
    return context or 'None (the default context)'


def kernel_build_log(node, context):
    """The compiler's log for the first of ``node``'s kernels that does not
    build on ``context`` (a pygpu GpuContext), or None when all build (or
    the op has no kernel source to try)."""
    from pygpu import gpuarray
    for source, name, types, flags in _kernel_sources(node):
        try:
            gpuarray.GpuKernel(source, name, types, context=context, **flags)
        except gpuarray.GpuArrayException as error:
            return str(error)
    return None


def _kernel_sources(node):
    """[(source, kernel name, argument types, pygpu flags)] of ``node``'s
    GPU kernels, as far as Theano states them."""
    from theano.gpuarray.basic_ops import GpuKernelBase
    from theano.gpuarray.elemwise import GpuElemwise
    if isinstance(node.op, GpuElemwise):
        return [_elemwise_kernel(node)]
    if isinstance(node.op, GpuKernelBase):
        return [(k.code, k.name, k.params,
                 dict((key, value) for key, value in k.flags.items() if key != 'cflags'))
                for k in node.op.gpu_kernels(node, 'kernel_build_log')]
    return []


def _elemwise_kernel(node):
    """A contiguous kernel computing GpuElemwise ``node``'s expression, as
    libgpuarray builds it (its own kernels are made inside the C library)."""
    from pygpu import gpuarray
    support, expression = node.op._generate_op_string(node)
    inputs, outputs = node.op._get_vnames(node)
    # An output computed in place is named as its input.
    variables = list(zip(inputs, node.inputs)) + [
        (name, v) for name, v in zip(outputs, node.outputs) if name not in inputs]
    params = ', '.join('GLOBAL_MEM %s *%s_p' % (gpuarray.dtype_to_ctype(v.dtype), name)
                       for name, v in variables)
    reads = ' '.join('%s %s = %s_p[i];' % (gpuarray.dtype_to_ctype(v.dtype), name, name)
                     for name, v in zip(inputs, node.inputs))
    declared = ' '.join('%s %s;' % (gpuarray.dtype_to_ctype(v.dtype), name)
                        for name, v in zip(outputs, node.outputs) if name not in inputs)
    writes = ' '.join('%s_p[i] = %s;' % (name, name) for name in outputs)
    source = ('#include "cluda.h"\n%s\nKERNEL void elemwise(const ga_size n, %s) {\n'
              '  for (ga_size i = GID_0 * LDIM_0 + LID_0; i < n; i += LDIM_0 * GDIM_0) {\n'
              '    %s %s\n%s\n    %s\n  }\n}\n'
              % (support, params, reads, declared, expression, writes))
    types = [gpuarray.SIZE] + [gpuarray.GpuArray] * len(variables)
    flags = dict(have_double=any(v.dtype == 'float64' for _, v in variables),
                 have_small=any(v.type.dtype in ('int8', 'uint8', 'int16', 'uint16', 'float16')
                                for _, v in variables))
    return source, 'elemwise', types, flags


def install():
    """Register the fixes, each applied when its Theano module is imported."""
    from .. import importhook
    importhook.after_import('theano.scalar.basic', _fix_nan_in_maximum_and_minimum)
    importhook.after_import('theano.gpuarray.elemwise', _fix_elemwise_handle)
    importhook.after_import('theano.gof.op', _raise_kernel_build_errors)
    importhook.after_import('theano.gpuarray.pool', _fix_pools)
    importhook.after_import('theano.gpuarray.basic_ops', _check_kernel_sources)
    importhook.after_import('theano.gpuarray.basic_ops', _share_kernels_per_context)
