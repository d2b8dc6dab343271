"""The one transfer op the shim places work with: ``to_context(x, name)``.

Theano's own transfers do not keep placement: canonicalisation rewrites
``HostFromGpu(GpuToGpu(x))`` into ``x.transfer('cpu')`` and
``HostFromGpu(GpuFromHost(x))`` into ``x``, after which every op runs on the
context of its first GPU input ("first found wins"): measured, a graph
written for dev0 and dev1 with ``.transfer()`` ran entirely on dev0.
``ToContext`` is an op of its own class, so no rule removes it, and the ops
that read its output are lifted onto its context.  Its gradient is its
mirror: a ``ToContext`` back to where the input lived (the host, or another
context).
"""
from theano import gof, tensor
from theano.gpuarray.basic_ops import HostFromGpu, as_gpuarray_variable, host_from_gpu
from theano.gpuarray.type import GpuArrayType, get_context

from ..compat.optimizers import register_optimizer
from ..config.session import current_session

__all__ = ['HOST', 'ToContext', 'to_context', 'on_context', 'BytesMoved', 'bytes_moved']

# The host, wherever a place is named: a replica without a context, a
# value computed on the host, a report's row.  Theano's own name for it
# (``x.transfer('cpu')``), which no context can take (the contexts flag
# refuses it), unlike None, Theano's default context.
HOST = 'cpu'


class BytesMoved(dict):
    """{(source, destination): bytes} copied by ToContext in a session;
    source is a context name or HOST.  The placement report reads it around
    a call: what moved, measured, not estimated."""

    def count(self, source, destination, array):
        key = (source, destination)
        self[key] = self.get(key, 0) + int(array.size) * array.dtype.itemsize


def bytes_moved():
    """This session's BytesMoved (copy it to compare before and after a
    call)."""
    return current_session().part(BytesMoved)


class ToContext(gof.Op):
    """Copy a host tensor or a GPU array of any context to context ``name``.

    ``came_from`` names the context a host-typed input is computed on
    (Keras's graphs are host graphs until the optimizer lifts them; None is
    Theano's default context): the gradient is sent back there, so a
    replica's backward stays on its context.  Without it (HOST) the
    gradient of a host input stays on the host.

    ``purpose`` (or None) names what the copy is for (a layer computed over
    the whole batch); such a copy and its gradient's count the bytes they
    copied in ``copied``, for the placement report.
    """
    __props__ = ('context_name', 'came_from', 'purpose')
    _f16_ok = True

    def __init__(self, context_name, came_from=HOST, purpose=None):
        self.context_name = context_name
        self.came_from = came_from
        self.purpose = purpose
        self.copied = 0

    def __str__(self):
        return 'ToContext<%s>' % (self.context_name,)

    def make_node(self, x):
        if not isinstance(x.type, GpuArrayType):
            x = tensor.as_tensor_variable(x)
        out = GpuArrayType(dtype=x.dtype, broadcastable=x.broadcastable,
                           context_name=self.context_name)()
        return gof.Apply(self, [x], [out])

    def perform(self, node, inputs, outputs):
        import pygpu
        x, = inputs
        context = get_context(self.context_name)
        source_type = node.inputs[0].type
        if isinstance(source_type, GpuArrayType):
            # libgpuarray copies between contexts in one segment only.
            outputs[0][0] = pygpu.gpuarray.ascontiguousarray(x).transfer(context)
            source = source_type.context_name
        else:
            outputs[0][0] = pygpu.gpuarray.array(x, context=context)
            source = HOST
        bytes_moved().count(source, self.context_name, x)
        self.copied += int(x.size) * x.dtype.itemsize

    def grad(self, inputs, output_grads):
        x, = inputs
        gz, = output_grads
        gz = as_gpuarray_variable(gz, self.context_name)
        if isinstance(x.type, GpuArrayType):
            return [ToContext(x.type.context_name, purpose=self.purpose)(gz)]
        if self.came_from != HOST:
            return [host_from_gpu(ToContext(self.came_from, purpose=self.purpose)(gz))]
        return [host_from_gpu(gz)]

    def R_op(self, inputs, eval_points):
        return [self(eval_points[0])]

    def infer_shape(self, node, shapes):
        return shapes


def to_context(x, name, came_from=HOST, purpose=None):
    """``x`` (host or GPU) as a GPU array on context ``name``; ``came_from``
    is the context a host-typed ``x`` is computed on, if any; ``purpose``:
    see ToContext."""
    if isinstance(x.type, GpuArrayType) and x.type.context_name == name:
        return x
    if x.owner is not None and isinstance(x.owner.op, HostFromGpu):
        x = x.owner.inputs[0]
        if x.type.context_name == name:
            return x
    if came_from == name:
        return as_gpuarray_variable(x, name)
    return ToContext(name, came_from, purpose)(x)


def on_context(x, name, came_from=HOST, purpose=None):
    """``x`` moved to context ``name``, as a host-typed tensor that the
    optimizer computes with on that context."""
    return host_from_gpu(to_context(x, name, came_from, purpose))


@gof.local_optimizer([ToContext])
def local_to_context_from_host_view(node):
    """ToContext(HostFromGpu(g)) -> ToContext(g): copy device to device."""
    if not isinstance(node.op, ToContext):
        return False
    x, = node.inputs
    if x.owner is not None and isinstance(x.owner.op, HostFromGpu):
        source = x.owner.inputs[0]
        if source.type.context_name == node.op.context_name:
            return [source]
        return [ToContext(node.op.context_name, node.op.came_from, node.op.purpose)(source)]
    return False


# After the GPU lifting (which makes the HostFromGpu), just before Theano's
# second merge and the elementwise fusion (49).
register_optimizer('to_context_from_host_view', local_to_context_from_host_view,
                   'merge2', -0.2)

