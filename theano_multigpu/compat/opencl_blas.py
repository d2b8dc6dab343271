"""BLAS on OpenCL contexts: a product that ignores its output's old
contents where BLAS says it does.

BLAS's gemv computes ``y = alpha A x + beta y`` and, with ``beta`` 0, does
not read ``y``: callers pass memory nobody wrote.  Theano does: a dot whose
operand has a dimension of 1 known to the graph (a recurrent layer's or
``TimeDistributed(Dense)``'s input of one feature, reshaped to one column,
whose gradient is ``dot(x.T, g)``) becomes ``GpuGemv(y, 1, A, x, 0)`` with
``y`` from ``GpuAllocEmpty``.  CLBlast's gemv, which libgpuarray
uses on OpenCL, reads ``y`` anyway, and ``0 x NaN`` is NaN: wherever the
fresh memory held a NaN's bits, the product was NaN (a loss that went NaN
at a random step).  cuBLAS keeps the rule, so CUDA contexts are left as
Theano makes them.  CLBlast's gemm keeps it too.

On an OpenCL context such a gemv's ``y`` is allocated filled with zeros.
"""
import numpy as np

from ..patch_targets import Parameters

__all__ = ['install']

GEMV_INPUTS = Parameters(
    'theano.gpuarray.blas.GpuGemv.make_node', ('self', 'y', 'alpha', 'A', 'x', 'beta'),
    "read: y is the gemv's input 0 and beta its input 4")


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


def install():
    """Register the rewrite when Theano's GPU optimizations are imported."""
    from .. import importhook
    importhook.after_import('theano.gpuarray.opt', _register)
