"""Gradient stand-ins: what ``K.gradients`` returns in batch-wise and
layer-wise mode.

Keras takes gradients of its full, one-context graph before the shim has
rewritten it.  A gradient of that graph would recompute the forward pass
the way Keras wrote it, so ``K.gradients`` returns stand-ins instead, and
``function`` replaces them by gradients of the rewritten loss
(``real_gradients``): the backward pass then mirrors the rewritten forward,
context by context.
"""
import theano
from theano import gof, tensor
from theano.gpuarray.basic_ops import host_from_gpu
from theano.gpuarray.type import GpuArrayType

from ..compat import compile_watch

from .replace import replaced

__all__ = ['GradientStandIn', 'gradient_stand_ins', 'stand_ins_in', 'by_loss',
           'real_gradients', 'rewritten_stand_ins', 'host_gradient', 'theano_grad']


class GradientStandIn(object):
    """What ``K.gradients(loss, params)`` stood in for, per stand-in variable."""

    def __init__(self, loss, param):
        self.loss = loss
        self.param = param


def gradient_stand_ins(loss, params):
    """Variables of each param's type, to be replaced by the real gradients
    of the rewritten loss when the function is compiled."""
    stand_ins = []
    for param in params:
        stand_in = tensor.TensorType(param.dtype, param.broadcastable)()
        stand_in.name = 'grad_of_%s' % (param.name or 'param')
        stand_in.tag.multigpu_gradient = GradientStandIn(loss, param)
        stand_ins.append(stand_in)
    return stand_ins


def stand_ins_in(roots):
    """The gradient stand-ins that ``roots`` read."""
    return [v for v in gof.graph.inputs(roots)
            if getattr(v.tag, 'multigpu_gradient', None) is not None]


def by_loss(stand_ins):
    """{loss: [its stand-ins]}, in the order the losses first appear."""
    groups = {}
    for stand_in in stand_ins:
        groups.setdefault(stand_in.tag.multigpu_gradient.loss, []).append(stand_in)
    return groups


def theano_grad(*args, **kwargs):
    """``theano.grad``, the compile's watcher told (the progress lines'
    'gradients' phase)."""
    with compile_watch.phase('gradients'):
        return theano.grad(*args, **kwargs)


def real_gradients(stand_ins, replace, wrt=None):
    """{stand-in: host-typed gradient of its loss, rewritten by ``replace``
    (``replaced``'s replacements)}, taken with respect to each param
    (or to ``wrt(param)``, e.g. the param's copy on its context)."""
    real = {}
    for loss, group in by_loss(stand_ins).items():
        rewritten_loss = replaced([loss], replace)[0]
        params = [s.tag.multigpu_gradient.param for s in group]
        grads = theano_grad(rewritten_loss, [wrt(p) for p in params] if wrt else params)
        for stand_in, grad in zip(group, grads):
            real[stand_in] = host_gradient(grad)
    return real


def rewritten_stand_ins(stand_ins, replace):
    """{stand-in: a stand-in for the gradient of its loss rewritten by
    ``replace``}: for a rewrite whose gradients a later rewrite takes."""
    new = {}
    for loss, group in by_loss(stand_ins).items():
        rewritten_loss = replaced([loss], replace)[0]
        for stand_in in group:
            new[stand_in], = gradient_stand_ins(rewritten_loss,
                                                [stand_in.tag.multigpu_gradient.param])
    return new


def host_gradient(gradient):
    """``gradient`` as a host-typed tensor (the type of its stand-in)."""
    if isinstance(gradient.type, GpuArrayType):
        gradient = host_from_gpu(gradient)
    return tensor.as_tensor_variable(gradient)
