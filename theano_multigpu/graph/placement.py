"""Where a compiled function runs, and the placement check.

It reads the compiled graph (``fn.maker.fgraph``), since Theano's optimizer
moves ops between contexts: it cuts its own transfers and puts each op on
the context of its first GPU input.  Each variable gets the
set of *owners* whose data it carries: the plan's own transfer into
context ``c`` (ToContext) starts owner ``c`` afresh, every other op
(Theano's own transfers included) unions its inputs' owners, except that
shapes are metadata, owned by no one (and a fill, such as ones_like, reads
only its first input's shape).  So a replica's forward and backward ops are
owned by that replica alone, and whatever mixes several replicas (the
gather, the loss, the gradient sum, the updates) by several.  The check:
a heavy op owned by one replica runs on that replica's context; one owned
by several runs on the master; none runs on the host: one that reads the
function's own inputs alone, not yet copied to a context, belongs on the
master (ops owned by no one compute from constants and shapes alone, and
may run anywhere).
"""
import sys

from theano import gof
from theano.compile import SharedVariable
from theano.compile.ops import Shape, Shape_i
from theano.scalar import Second
from theano.scan_module.scan_op import Scan
from theano.gpuarray.basic_ops import GpuFromHost
from theano.gpuarray.type import GpuArrayType
from theano.tensor import TensorType

from ..errors import PlacementError
from .micro_batches import After
from .transfer import HOST, ToContext

__all__ = ['HEAVY_OPS', 'context_of', 'heavy_nodes', 'heavy_op_counts', 'misplaced', 'check']

# Class-name fragments of the ops that carry a model's work.
HEAVY_OPS = ('Dot22', 'Gemm', 'Gemv', 'Corr', 'DnnConv', 'Pool', 'Softmax', 'Scan')


def context_of(variable, mesh):
    """The context name ``variable`` lives on (the master for Theano's
    default context), or HOST."""
    if not isinstance(variable.type, GpuArrayType):
        return HOST
    name = variable.type.context_name
    return mesh.master if name is None else name


def heavy_nodes(fgraph):
    """The nodes of ``fgraph`` whose op is one of HEAVY_OPS, in order; a
    Scan only when its steps compute floats: one that steps over booleans
    or integers (the sweep's masked recurrent layers compile one that
    reduces each step of the mask) is bookkeeping, not a layer's work."""
    return [node for node in fgraph.toposort()
            if any(h in type(node.op).__name__ for h in HEAVY_OPS)
            and (not isinstance(node.op, Scan) or _computes_floats(node.op))]


def _computes_floats(scan):
    return any(getattr(v, 'dtype', '').startswith('float')
               for v in gof.graph.variables(scan.inputs, scan.outputs))


def heavy_op_counts(fgraph, mesh):
    """{context name or HOST: {op class name: count}}."""
    counts = {}
    for node in heavy_nodes(fgraph):
        per_op = counts.setdefault(context_of(node.outputs[0], mesh), {})
        name = type(node.op).__name__
        per_op[name] = per_op.get(name, 0) + 1
    return counts


# The owner of the function's own host tensors (not shared variables)
# until a copy moves them to a context (the shim's ToContext, or Theano's
# own GpuFromHost where an op on that context reads them).
INPUT = 'the function\'s inputs'


def _owners(fgraph, mesh):
    """{variable: frozenset of context names whose data it carries, and
    INPUT for the function's own inputs not yet copied to a context}."""
    # (Batch-wise, where inputs stay on the host until moved; layer-wise
    # inputs are Theano's to place.)
    owners = dict((v, frozenset([INPUT])) for v in fgraph.inputs
                  if mesh.mode == 'batch' and isinstance(v.type, TensorType) and v.ndim >= 1
                  and not isinstance(v, (SharedVariable, gof.Constant)))
    for node in fgraph.toposort():
        ins = [owners.get(v, frozenset()) for v in node.inputs]
        if isinstance(node.op, ToContext) or (isinstance(node.op, GpuFromHost)
                                              and ins[0] == frozenset([INPUT])):
            mine = frozenset([context_of(node.outputs[0], mesh)])
        elif isinstance(node.op, (Shape, Shape_i)):
            mine = frozenset()
        elif isinstance(node.op, After):   # waits for the others, carries its first
            mine = owners.get(node.inputs[0], frozenset())
        elif isinstance(getattr(node.op, 'scalar_op', None), Second):
            # fill(x, v) (ones_like, zeros_like) reads x's shape only
            mine = frozenset().union(*[owners.get(v, frozenset()) for v in node.inputs[1:]])
        else:
            mine = frozenset().union(*ins)
        for output in node.outputs:
            owners[output] = mine
    return owners


def misplaced(fgraph, mesh):
    """[(op name, context it runs on, context it should run on)]."""
    owners = _owners(fgraph, mesh)
    wrong = []
    for node in heavy_nodes(fgraph):
        runs_on = context_of(node.outputs[0], mesh)
        owned_by = owners[node.outputs[0]]
        if not owned_by:
            continue   # computes from constants and shapes alone
        if owned_by == frozenset([INPUT]):   # inputs alone, on the host
            if not mesh.names:
                continue   # (without contexts, Theano's default context or the host)
            should = mesh.master
        else:
            owned_by = owned_by - frozenset([INPUT])
            should = next(iter(owned_by)) if len(owned_by) == 1 else mesh.master
        if runs_on != should:
            wrong.append((str(node.op), runs_on, should))
    return wrong


def check(theano_function, mesh, action, what='a function'):
    """Apply the placement check to a compiled function: 'error' raises
    PlacementError, 'warn' writes to stderr, 'off' does nothing."""
    if action == 'off':
        return
    wrong = misplaced(theano_function.maker.fgraph, mesh)
    if not wrong:
        return
    lines = ['%s runs on %s, expected on %s' % item for item in wrong[:10]]
    if len(wrong) > 10:
        lines.append('... and %d more' % (len(wrong) - 10))
    message = ('theano_multigpu: placement check of %s: %d heavy op(s) do not run on '
               'the context that holds their data, so that data is copied for them '
               'on every call:\n  %s\nPlease report this with the model; '
               'multigpu.check=warn (or off) lets it run as it is.'
               % (what, len(wrong), '\n  '.join(lines)))
    if action == 'error':
        raise PlacementError(message)
    sys.stderr.write(message + '\n')
