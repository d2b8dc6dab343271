"""Theano's ops on OpenCL contexts: what OpenCL's libraries do otherwise
than CUDA's.

A product that ignores its output's old contents where BLAS says it does.
BLAS's gemv computes ``y = alpha A x + beta y`` and, with ``beta`` 0, does
not read ``y``: callers pass memory nobody wrote.  Theano does: a dot whose
operand has a dimension of 1 known to the graph (a recurrent layer's or
``TimeDistributed(Dense)``'s input of one feature, reshaped to one column,
whose gradient is ``dot(x.T, g)``) becomes ``GpuGemv(y, 1, A, x, 0)`` with
``y`` from ``GpuAllocEmpty``.  CLBlast's gemv, which libgpuarray
uses on OpenCL, reads ``y`` anyway, and ``0 x NaN`` is NaN: wherever the
fresh memory held a NaN's bits, the product was NaN (a loss that went NaN
at a random step).  cuBLAS keeps the rule, so CUDA contexts are left as
Theano makes them.  CLBlast's gemm keeps it too.  On an OpenCL context
such a gemv's ``y`` is allocated filled with zeros.

Zero fills with a kernel built once.  libgpuarray's OpenCL memset writes
the buffer's offset and size into a kernel's source and builds it at every
call (about 25 ms on pocl for 10,000 floats, against 0.02 ms for a kernel
launch).  So on an OpenCL context ``GpuAlloc{memset_0=True}``, Theano's
zeros, broadcasts its zero value in its C code as the other GpuAllocs do
(``GpuArray_setarray``, whose kernel libgpuarray builds once per context
and keeps), and never calls the memset.
"""
import functools

import numpy as np

from ..patch_targets import Parameters, SourceDigest, refused, source_digest, wrap

__all__ = ['install']

GEMV_INPUTS = Parameters(
    'theano.gpuarray.blas.GpuGemv.make_node', ('self', 'y', 'alpha', 'A', 'x', 'beta'),
    "read: y is the gemv's input 0 and beta its input 4")
GPU_ALLOC_C_CODE = SourceDigest(
    'theano.gpuarray.basic_ops.GpuAlloc.c_code', '65475f94f37135d4',
    'wrapped: on OpenCL contexts its zeros are a broadcast of its value, not a memset')
GPU_ALLOC_CACHE_VERSION = Parameters(
    'theano.gpuarray.basic_ops.GpuAlloc.c_code_cache_version_apply', ('self', 'node'),
    'wrapped: its C code on OpenCL contexts gets a cache key of its own')


def _is_zero_constant(variable):
    from theano import tensor
    try:
        return float(tensor.get_scalar_constant_value(variable)) == 0.0
    except tensor.NotScalarConstantError:
        return False


def _is_opencl(context_name):
    from theano.gpuarray.type import get_context
    return get_context(context_name).kind == b'opencl'


def _gemv_reads_zeros(node):
    """Rule: on an OpenCL context, a GpuGemv with beta 0 reads y from an
    allocation filled with zeros, never from GpuAllocEmpty."""
    from theano.gpuarray.basic_ops import GpuAlloc, GpuAllocEmpty, as_gpuarray_variable
    from theano.gpuarray.blas import GpuGemv
    if not isinstance(node.op, GpuGemv):
        return False
    y, beta = node.inputs[0], node.inputs[4]
    if y.owner is None or not isinstance(y.owner.op, GpuAllocEmpty):
        return False
    context_name = y.type.context_name
    if not _is_zero_constant(beta) or not _is_opencl(context_name):
        return False
    from theano.gof.opt import inherit_stack_trace
    with inherit_stack_trace(node.outputs):
        zero = as_gpuarray_variable(np.asarray(0, dtype=y.dtype), context_name)
        zeros = GpuAlloc(context_name, memset_0=True)(zero, *y.owner.inputs)
        return [node.op(zeros, *node.inputs[1:])]


def _register(gpuarray_opt):
    from theano import gof
    from theano.gpuarray.blas import GpuGemv
    from .optimizers import register_optimizer
    GEMV_INPUTS.check(GpuGemv.make_node)
    # After the GPU lifting made the gemv (48.5), before the destroy
    # handler (49.5) and the in-place passes that follow it.
    register_optimizer('gemv_reads_zeros_on_opencl',
                       gof.local_optimizer([GpuGemv])(_gemv_reads_zeros),
                       'add_destroy_handler', -0.1)


def _fill_zeros_without_memset(basic_ops):
    """Rule: GpuAlloc's C code on an OpenCL context never calls
    GpuArray_memset (nor pygpu_zeros, which calls it): its zeros are its
    value, 0, broadcast by GpuArray_setarray.  (Its Python ``perform``,
    which runs only without a C compiler, still fills with pygpu's zeros.)
    The cache key holds the digest of this rewrite's code."""
    wrap(GPU_ALLOC_C_CODE, basic_ops.GpuAlloc, 'c_code', _filling_by_broadcast)
    wrap(GPU_ALLOC_CACHE_VERSION, basic_ops.GpuAlloc, 'c_code_cache_version_apply',
         _keyed_by_the_fill)


def _filling_by_broadcast(c_code):
    @functools.wraps(c_code)
    def fill_by_broadcast(self, node, name, inputs, outputs, sub):
        code = c_code(self, node, name, inputs, outputs, sub)
        if not (self.memset_0 and _is_opencl(self.context_name)):
            return code
        memset_0 = '%s->memset_0' % sub['params']
        if code.count(memset_0) != 2:
            raise refused(GPU_ALLOC_C_CODE.target, 'its C code on OpenCL contexts is rewritten',
                          'C code that reads %s twice' % memset_0,
                          'this one reads it %d times' % code.count(memset_0))
        return code.replace(memset_0, '0')
    return fill_by_broadcast


def _keyed_by_the_fill(cache_version):
    rewrite_digest = source_digest(_filling_by_broadcast)

    @functools.wraps(cache_version)
    def c_code_cache_version_apply(self, node):
        version = cache_version(self, node)
        if version and self.memset_0 and _is_opencl(self.context_name):
            return version + ('zeros by broadcast', rewrite_digest)
        return version
    return c_code_cache_version_apply


def install():
    """Register the gemv rewrite and the fill, each when its Theano module
    is imported."""
    from .. import importhook
    importhook.after_import('theano.gpuarray.opt', _register)
    importhook.after_import('theano.gpuarray.basic_ops', _fill_zeros_without_memset)
