"""Where a compiled function runs: the placement check and the report.

Both read the compiled graph (``fn.maker.fgraph``), since the optimizer
moves ops between contexts (DESIGN.md, trap 5).  Each variable gets the
set of *owners* whose data it carries: the plan's own transfer into
context ``c`` (ToContext) starts owner ``c`` afresh, every other op
(Theano's own transfers included) unions its inputs' owners, except that
shapes are metadata, owned by no one (and a fill, such as ones_like, reads
only its first input's shape).  So a replica's forward and backward ops are
owned by that replica alone, and whatever mixes several replicas (the
gather, the loss, the gradient sum, the updates) by several.  The check:
a heavy op owned by one replica runs on that replica's context; one owned
by several runs on the master; none runs on the host (ops owned by no one
compute from constants and shapes alone, and may run anywhere).
"""
import sys

from theano.compile import SharedVariable
from theano.compile.ops import Shape, Shape_i
from theano.scalar import Second
from theano.gpuarray.type import GpuArrayType

from . import transfer
from .errors import PlacementError
from .transfer import ToContext

__all__ = ['HEAVY_OPS', 'HOST', 'heavy_nodes', 'heavy_op_counts', 'misplaced', 'check',
           'resident_bytes', 'report', 'FirstCallReport']

# Class-name fragments of the ops that carry a model's work.
HEAVY_OPS = ('Dot22', 'Gemm', 'Gemv', 'Corr', 'DnnConv', 'Pool', 'Softmax', 'Scan')
HOST = 'host'


def _context_of(variable, mesh):
    """The context name ``variable`` lives on (the master for Theano's
    default context), or HOST."""
    if not isinstance(variable.type, GpuArrayType):
        return HOST
    name = variable.type.context_name
    return mesh.master if name is None else name


def heavy_nodes(fgraph):
    """The nodes of ``fgraph`` whose op is one of HEAVY_OPS, in order."""
    return [node for node in fgraph.toposort()
            if any(h in type(node.op).__name__ for h in HEAVY_OPS)]


def heavy_op_counts(fgraph, mesh):
    """{context name or HOST: {op class name: count}}."""
    counts = {}
    for node in heavy_nodes(fgraph):
        per_op = counts.setdefault(_context_of(node.outputs[0], mesh), {})
        name = type(node.op).__name__
        per_op[name] = per_op.get(name, 0) + 1
    return counts


def _owners(fgraph, mesh):
    """{variable: frozenset of context names whose data it carries}."""
    owners = {}
    for node in fgraph.toposort():
        if isinstance(node.op, ToContext):
            mine = frozenset([_context_of(node.outputs[0], mesh)])
        elif isinstance(node.op, (Shape, Shape_i)):
            mine = frozenset()
        elif isinstance(getattr(node.op, 'scalar_op', None), Second):
            # fill(x, v) (ones_like, zeros_like) reads x's shape only
            mine = frozenset().union(*[owners.get(v, frozenset()) for v in node.inputs[1:]])
        else:
            mine = frozenset().union(*[owners.get(v, frozenset()) for v in node.inputs])
        for output in node.outputs:
            owners[output] = mine
    return owners


def misplaced(fgraph, mesh):
    """[(op name, context it runs on, context it should run on)]."""
    owners = _owners(fgraph, mesh)
    wrong = []
    for node in heavy_nodes(fgraph):
        runs_on = _context_of(node.outputs[0], mesh)
        owned_by = owners[node.outputs[0]]
        if not owned_by:
            continue   # computes from constants and shapes alone
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


def resident_bytes(theano_function, mesh):
    """{context name or HOST: bytes of the shared variables it holds}."""
    resident = {}
    for item in theano_function.maker.inputs:
        variable = item.variable
        if not isinstance(variable, SharedVariable):
            continue
        value = variable.get_value(borrow=True, return_internal_type=True)
        nbytes = int(getattr(value, 'size', 0)) * value.dtype.itemsize
        where = _context_of(variable, mesh)
        resident[where] = resident.get(where, 0) + nbytes
    return resident


def format_bytes(n):
    for unit, size in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if n >= size:
            return '%.1f %s' % (n / size, unit)
    return '%d B' % n


# (header, row key, width); the byte-valued keys are formatted as sizes.
BATCH_COLUMNS = [('context', 'context', 9), ('device', 'device', 10),
                 ('batch rows', 'rows', 14), ('resident', 'resident', 11),
                 ('copied in', 'moved_in', 11), ('copied out', 'moved_out', 11),
                 ('heavy ops', 'heavy', 0)]
LAYER_COLUMNS = [('context', 'context', 9), ('device', 'device', 10),
                 ('layers', 'layers', 28), ('resident', 'resident', 11),
                 ('activations', 'activations', 11), ('copied in', 'moved_in', 11),
                 ('copied out', 'moved_out', 11), ('heavy ops', 'heavy', 0)]
_BYTE_KEYS = ('resident', 'activations', 'moved_in', 'moved_out')


def _cell(row, key):
    value = row[key]
    if key in _BYTE_KEYS:
        return format_bytes(value)
    if key == 'heavy':
        return ', '.join('%s x%d' % item for item in sorted(value.items())) or '-'
    return str(value)


def format_report(title, rows, columns=BATCH_COLUMNS):
    """The report's text: ``rows`` are dicts with the keys of ``columns``."""
    def line(cells):
        return '  ' + ' '.join(cell.ljust(width) for cell, (_, _, width)
                               in zip(cells, columns)).rstrip()
    lines = ['theano_multigpu placement report: %s' % title,
             line([header for header, _, _ in columns])]
    lines += [line([_cell(row, key) for _, key, _ in columns]) for row in rows]
    return '\n'.join(lines)


class FirstCallReport(object):
    """A Keras backend Function that prints its placement report after its
    first call, when the batch size and the bytes moved are known."""

    def __init__(self, keras_function, mesh, title, stream=None):
        self._keras_function = keras_function
        self._mesh = mesh
        self._title = title
        self._stream = stream
        self._reported = False

    def __call__(self, inputs):
        if self._reported:
            return self._keras_function(inputs)
        before = dict(transfer.bytes_moved)
        outputs = self._keras_function(inputs)
        self._reported = True
        batch_rows = len(inputs[0]) if inputs and getattr(inputs[0], 'ndim', 0) else 0
        moved = {key: n - before.get(key, 0) for key, n in transfer.bytes_moved.items()}
        text = report(self._keras_function.function, self._mesh, self._title,
                      batch_rows, moved)
        (self._stream or sys.stderr).write(text + '\n')
        return outputs

    def __getattr__(self, name):
        return getattr(self._keras_function, name)


def report(theano_function, mesh, title, batch_rows, moved):
    """The placement report of a compiled function after a call with
    ``batch_rows`` rows that moved ``moved`` ({(source, dest): bytes})."""
    from .batchwise import slice_bounds
    if mesh.mode == 'layer':
        from .layerwise import report_rows
        return format_report('%s (* master; activations estimated for the plan\'s '
                             'batch; bytes moved by this call)' % title,
                             report_rows(theano_function, mesh, moved), LAYER_COLUMNS)
    heavy = heavy_op_counts(theano_function.maker.fgraph, mesh)
    resident = resident_bytes(theano_function, mesh)
    bounds = dict(zip(mesh.names, slice_bounds(batch_rows, len(mesh.names))))
    rows = []
    for name in mesh.names + ([HOST] if HOST in heavy or HOST in resident else []):
        graph_names = (name, None) if name == mesh.master else (name,)
        start, stop = bounds.get(name, (0, 0))
        rows.append({
            'context': name + ('*' if name == mesh.master else ''),
            'device': mesh.devices.get(name, '-'),
            'rows': '%d-%d of %d' % (start, stop, batch_rows) if stop > start else '0 of %d' % batch_rows,
            'heavy': heavy.get(name, {}),
            'resident': resident.get(name, 0),
            'moved_in': sum(n for (s, d), n in moved.items() if d in graph_names),
            'moved_out': sum(n for (s, d), n in moved.items() if s in graph_names),
        })
    return format_report('%s (* master; bytes moved by this call)' % title, rows)
