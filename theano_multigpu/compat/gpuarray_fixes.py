"""Theano's gpuarray backend with several named contexts: six fixes.

Theano 1.0.5 was written and tested with one context.  With a named context
holding the weights and Theano's default context (``None``) also defined,
ops landed on ``None`` and every weight was copied there and back on each
call; libgpuarray refused to copy views between contexts; the softmax
gradient, which has no GPU op without cuDNN, took each replica's backward
through the host; Theano merged the replicas' recurrent loops into one
scan, which then ran on one context; and allocations with no GPU input
(the zeros a gradient is accumulated into) went to the default context,
taking the ops that fill them there; and the GPU random generator's
samples were typed for the default context whatever its state's context.
"""
from collections import deque

from theano import gof, tensor
from theano.gpuarray.rng_mrg import GPUA_mrg_uniform
from theano.scan_module.scan_opt import ScanMerge
from theano.tensor.nnet import SoftmaxGrad
from theano.gpuarray import basic_ops
from theano.gpuarray.basic_ops import (GpuAlloc, GpuAllocEmpty, GpuContiguous, GpuToGpu,
                                       HostFromGpu, as_gpuarray_variable, gpu_contiguous,
                                       host_from_gpu)
from theano.gpuarray.type import ContextNotDefined, GpuArrayType, get_context

from ..patch_targets import Parameters, SourceDigest, replace
from .optimizers import register_optimizer

__all__ = ['install']

INFER_CONTEXT_NAME = SourceDigest(
    'theano.gpuarray.basic_ops.infer_context_name', '1de00c3a2b34cf05',
    'its code is replaced by a search through ops of any arity')
MRG_UNIFORM_NEW = SourceDigest(
    'theano.gpuarray.rng_mrg.GPUA_mrg_uniform.new', '2381ac0315963a02',
    "replaced: samples typed for the state's context")
SCAN_MERGE_TEST = Parameters(
    'theano.scan_module.scan_opt.ScanMerge.belongs_to_set', ('self', 'node', 'set_nodes'),
    'wrapped: scans of different contexts are not merged')


def _infer_context_name(*variables):
    """Theano's ``infer_context_name``, searching through ops of any arity.

    Theano's looks through single-input ops only, so for
    ``W[:, :, ::-1, ::-1]`` (Subtensor has three inputs) it answered the
    default context instead of W's.  Nearest context first, as Theano's.
    Its code replaces Theano's and runs with basic_ops' globals, which
    hold the same names as this module.
    """
    todo = deque()
    todo.extendleft(variables)
    seen = set()
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v.type, GpuArrayType):
            return v.type.context_name
        if hasattr(v.tag, 'context_name'):
            return v.tag.context_name
        if v.owner:
            if isinstance(v.owner.op, HostFromGpu):
                return v.owner.inputs[0].type.context_name
            todo.extendleft(v.owner.inputs)
    try:
        get_context(None)
        return None
    except ContextNotDefined:
        raise ValueError("Could not infer context from inputs")


@gof.local_optimizer([GpuToGpu])
def local_gpu_to_gpu_contiguous(node):
    """GpuToGpu(x) -> GpuToGpu(GpuContiguous(x)): libgpuarray copies between
    contexts in one segment only ("Array (a) not one segment" for a view
    such as a flipped convolution kernel).  GpuContiguous costs nothing
    when ``x`` is contiguous already."""
    if not isinstance(node.op, GpuToGpu):
        return False
    x, = node.inputs
    if x.owner is not None and isinstance(x.owner.op, GpuContiguous):
        return False
    return [node.op(gpu_contiguous(x))]


@gof.local_optimizer([SoftmaxGrad])
def local_softmax_grad_elementwise(node):
    """SoftmaxGrad(dy, sm) -> (dy - sum(dy * sm, axis=1)) * sm, in ops that
    Theano lifts onto the context of their inputs.  Without cuDNN Theano has
    no GPU SoftmaxGrad, so each replica's backward went to the host and
    back (a HostFromGpu, which also waits for the device to finish).
    Runs just before the GPU lifting, once the stabilising rewrites that
    look for SoftmaxGrad have run."""
    if not isinstance(node.op, SoftmaxGrad):
        return False
    dy, sm = node.inputs
    if dy.ndim != 2 or sm.ndim != 2:
        return False
    dx = (dy - tensor.sum(dy * sm, axis=1, keepdims=True)) * sm
    return [tensor.patternbroadcast(dx, node.outputs[0].broadcastable)]


def _is_metadata(variable):
    """Constants, the small integer vectors shapes are made of, and what is
    no tensor at all (a slice, a random state)."""
    ndim, dtype = getattr(variable.type, 'ndim', None), getattr(variable.type, 'dtype', None)
    return (isinstance(variable, gof.Constant) or ndim is None or dtype is None
            or (ndim <= 1 and not dtype.startswith('float')))


# What ``_contexts_of_readers`` finds for a reader of constants and shapes
# alone, or past its depth.
_NO_CONTEXT = object()


def _contexts_of_readers(variable, depth=8):
    """The contexts whose data the ops reading ``variable`` compute with:
    through ops that read nothing else (a DimShuffle, a Reshape, another
    Alloc), up to ``depth`` ops on.  ``'output'`` if it is an output."""
    found = set()
    for client, index in variable.clients:
        if client == 'output':
            found.add('output')
            continue
        if not _is_passed_along(client, index):
            found.add(_context_read_with(client, (index,)))
        elif depth > 0:
            for output in client.outputs:
                found |= _contexts_of_readers(output, depth - 1)
        else:
            found.add(_NO_CONTEXT)
    return found


def _is_passed_along(node, index):
    """True when ``node`` computes with its input ``index`` and constants
    and shapes alone (a DimShuffle, a Reshape, another Alloc)."""
    return all(_is_metadata(v) for i, v in enumerate(node.inputs) if i != index)


def _context_read_with(node, left_out):
    """The context whose data ``node`` computes with, its inputs
    ``left_out`` (indices), constants and shapes aside: a context name
    (Theano's default context, None, the master with several, is one like
    any other), or _NO_CONTEXT when it reads constants and shapes alone."""
    others = [v for i, v in enumerate(node.inputs) if i not in left_out and not _is_metadata(v)]
    if any(_comes_from_a_context(v) for v in others):
        return basic_ops.infer_context_name(*others)
    return _NO_CONTEXT


def _comes_from_a_context(variable):
    """True when ``variable`` is computed from data on a context (a GPU
    array, or a host view of one, through ops of any arity), not from
    constants and shapes alone."""
    todo, seen = [variable], set()
    while todo:
        v = todo.pop()
        if id(v) in seen or _is_metadata(v):
            continue
        seen.add(id(v))
        if isinstance(v.type, GpuArrayType):
            return True
        if v.owner is not None:
            if isinstance(v.owner.op, HostFromGpu):
                return True
            todo.extend(v.owner.inputs)
    return False


@gof.local_optimizer([tensor.Alloc, tensor.AllocEmpty])
def local_alloc_on_clients_context(node):
    """Alloc(...) -> HostFromGpu(GpuAlloc<c>(...)) when no input of the
    Alloc is on a GPU and its value is computed on ``c`` or, for a value of
    constants, of the named contexts the ops that read it compute with data
    from ``c`` alone.  Theano's lifter puts such allocations (zeros an
    initial state or a gradient starts from) on the default context, and
    the first GPU input decides where an op runs, so e.g. the IncSubtensor
    that fills a replica's gradient ran on the master."""
    if type(node.op) not in (tensor.Alloc, tensor.AllocEmpty):
        return False   # GpuAlloc and GpuAllocEmpty are subclasses: placed already
    output = node.outputs[0]
    if not output.dtype.startswith('float'):
        return False
    if any(v.owner is not None and isinstance(v.owner.op, HostFromGpu) for v in node.inputs):
        return False   # the lifter places it by that input
    if isinstance(node.op, tensor.Alloc) and _comes_from_a_context(node.inputs[0]):
        # A value computed on a context is spread there (Theano's lifter
        # would search the shapes too, which may name another context).
        context_name = basic_ops.infer_context_name(node.inputs[0])
    else:
        contexts = _contexts_of_readers(output)
        named = contexts - {None, _NO_CONTEXT}
        if len(named) != 1 or 'output' in named or None in contexts:
            return False   # read on several contexts: the lifter's default one
        context_name = named.pop()
    return [_placed_allocation(node, context_name)]


def _allocation_below(variable, depth=8):
    """The chain from a host float Alloc (or AllocEmpty) whose value is
    not computed on a context to ``variable``, through ops that read
    nothing else: ``[(node, input index), ...]`` from the Alloc's reader
    up, the Alloc's node first.  None for any other variable."""
    chain = []
    while variable.owner is not None and depth >= 0:
        node = variable.owner
        if type(node.op) in (tensor.Alloc, tensor.AllocEmpty):
            if (not variable.dtype.startswith('float')
                    or (isinstance(node.op, tensor.Alloc)
                        and _comes_from_a_context(node.inputs[0]))):
                return None
            return [(node, None)] + chain[::-1]
        moving = [i for i, v in enumerate(node.inputs) if not _is_metadata(v)]
        if len(moving) != 1 or len(node.outputs) != 1:
            return None
        chain.append((node, moving[0]))
        variable = node.inputs[moving[0]]
        depth -= 1
    return None


def _placed_allocation(node, context_name):
    """A new allocation like the host Alloc or AllocEmpty ``node``, on
    ``context_name``, seen from the host."""
    output = node.outputs[0]
    if isinstance(node.op, tensor.Alloc):
        value = as_gpuarray_variable(node.inputs[0], context_name)
        placed = GpuAlloc(context_name)(value, *node.inputs[1:])
    else:
        placed = GpuAllocEmpty(output.dtype, context_name)(*node.inputs)
    return tensor.patternbroadcast(host_from_gpu(placed), output.broadcastable)


@gof.local_optimizer(None)
def local_allocation_per_reading_context(node):
    """An op reading an allocation (through ops that read nothing else)
    that ops on other contexts read too gets an allocation of its own, on
    its context.  Theano's merge makes one allocation of the replicas'
    equal zeros (a GRU's gradient accumulators); placed on any one
    context, it took the other replicas' products there."""
    chains = {}
    for index, variable in enumerate(node.inputs):
        if not _is_metadata(variable):
            chain = _allocation_below(variable)
            if chain is not None:
                chains[index] = chain
    if not chains or any(_is_passed_along(node, index) for index in chains):
        return False
    context_name = _context_read_with(node, chains)
    if context_name is _NO_CONTEXT:
        return False
    inputs = list(node.inputs)
    for index, chain in chains.items():
        allocation = chain[0][0]
        readers = _contexts_of_readers(allocation.outputs[0]) - {_NO_CONTEXT}
        if len(readers) < 2:
            continue   # local_alloc_on_clients_context places it
        value = _placed_allocation(allocation, context_name)
        for passing, moving in chain[1:]:
            passed = list(passing.inputs)
            passed[moving] = value
            value = passing.op(*passed)
        inputs[index] = value
    if inputs == node.inputs:
        return False
    return node.op(*inputs, return_list=True)


def _context_of_host_node(node):
    """The context a not yet lifted node's inputs come from (nearest first)."""
    try:
        return basic_ops.infer_context_name(*node.inputs)
    except ValueError:
        return None


_stock_belongs_to_set = None


def _belongs_to_set(self, node, set_nodes):
    """ScanMerge's test, refusing to merge scans whose inputs come from
    different contexts (two replicas' recurrent layers): merged, both ran
    on the first one's context."""
    if _context_of_host_node(node) != _context_of_host_node(set_nodes[0]):
        return False
    return _stock_belongs_to_set(self, node, set_nodes)


@classmethod
def _mrg_uniform_new(cls, rstate, ndim, dtype, size):
    """GPUA_mrg_uniform.new, with the samples on the state's context (Theano
    typed them for the default context: a kernel then read another
    context's buffer, which pocl aborts on)."""
    v_size = tensor.as_tensor_variable(size)
    if ndim is None:
        ndim = tensor.get_vector_length(v_size)
    op = cls(GpuArrayType(dtype, (False,) * ndim, context_name=rstate.type.context_name))
    return op(rstate, v_size)


_installed = set()


def install(several_contexts=False):
    """Apply the fixes once: context inference, contiguous copies and the
    random generator's context always, the others only when several
    contexts take part (one context keeps stock's graph).  The new search
    replaces the code of Theano's function, so the modules that imported it
    by name get it too.  Each target is checked first (PatchTargetError if
    it is not Theano 1.0.5's)."""
    global _stock_belongs_to_set
    if 'base' not in _installed:
        replace(INFER_CONTEXT_NAME, basic_ops.infer_context_name, '__code__',
                _infer_context_name.__code__)
        # After the destroy handler (49.5), before the in-place passes.
        register_optimizer('gpu_to_gpu_contiguous', local_gpu_to_gpu_contiguous,
                           'add_destroy_handler', 0.1)
        replace(MRG_UNIFORM_NEW, GPUA_mrg_uniform, 'new', _mrg_uniform_new)
        _installed.add('base')
    if several_contexts and 'several' not in _installed:
        # Just before the GPU lifting (48.5), after the stabilising passes.
        register_optimizer('softmax_grad_elementwise', local_softmax_grad_elementwise,
                           'gpuarray_opt', -0.1)
        register_optimizer('allocation_per_reading_context',
                           local_allocation_per_reading_context, 'gpuarray_opt', -0.06)
        register_optimizer('alloc_on_clients_context', local_alloc_on_clients_context,
                           'gpuarray_opt', -0.05)
        _stock_belongs_to_set = replace(SCAN_MERGE_TEST, ScanMerge, 'belongs_to_set',
                                        _belongs_to_set)
        _installed.add('several')
