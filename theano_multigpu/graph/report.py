"""The placement report: per context, its rows of the batch (batch-wise)
or its layers (layer-wise), the bytes it holds (and those its plan counted
there: layer-wise, and sharded batch-wise), the most bytes it holds at
once during the call, planned (``peak_plan``) and measured (``peak``, with
multigpu.measure_peak), the bytes copied in and out
by one call (measured by ``transfer.bytes_moved()``) and its heavy ops,
read from the compiled graph.
"""
from theano.compile import SharedVariable

from ..config.flags import format_bytes
from . import transfer
from .batchwise import names_in_order
from .peak import peak_of
from .peak_plan import planned_peak
from .value_shapes import NotPlannable
from .placement import context_of, heavy_op_counts
from .plan import nbytes, planned_bytes
from .rows import slice_bounds
from .transfer import HOST
from .whole_batch import purpose_of

__all__ = ['resident_bytes', 'format_report', 'report', 'copied_for']


def _shared_read(theano_function):
    return [item.variable for item in theano_function.maker.inputs
            if isinstance(item.variable, SharedVariable)]


def resident_bytes(theano_function, mesh):
    """{context name or HOST: bytes of the shared variables it holds} (a
    placed weight's host handle holds a placeholder, no memory)."""
    resident = {}
    for variable in _shared_read(theano_function):
        if getattr(variable, 'placed', None) is not None:
            continue
        where = context_of(variable, mesh)
        resident[where] = resident.get(where, 0) + nbytes(variable)
    return resident


# (header, row key, width); the byte-valued keys are formatted as sizes.
BATCH_COLUMNS = [('context', 'context', 9), ('device', 'device', 10),
                 ('batch rows', 'rows', 14), ('resident', 'resident', 11),
                 ('planned', 'planned', 11), ('peak plan', 'peak_plan', 11),
                 ('peak run', 'peak', 11), ('copied in', 'moved_in', 11), ('copied out', 'moved_out', 11),
                 ('heavy ops', 'heavy', 0)]
LAYER_COLUMNS = [('context', 'context', 9), ('device', 'device', 10),
                 ('layers', 'layers', 28), ('resident', 'resident', 11),
                 ('planned', 'planned', 11), ('peak plan', 'peak_plan', 11),
                 ('peak run', 'peak', 11), ('activations', 'activations', 11), ('copied in', 'moved_in', 11),
                 ('copied out', 'moved_out', 11), ('heavy ops', 'heavy', 0)]
_BYTE_KEYS = ('resident', 'planned', 'peak_plan', 'peak', 'activations', 'moved_in',
              'moved_out')


def _cell(row, key):
    value = row[key]
    if value is None:
        return '-'
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


def copied_for(theano_function):
    """{purpose: bytes} the copies of a compiled function that name a
    purpose (see ToContext) have copied since they were made."""
    ops = dict((id(node.op), node.op) for node in theano_function.maker.fgraph.apply_nodes
               if isinstance(node.op, transfer.ToContext) and node.op.purpose)
    copied = {}
    for op in ops.values():
        copied[op.purpose] = copied.get(op.purpose, 0) + op.copied
    return copied


def report(theano_function, mesh, title, batch_rows, moved, split=None, copied=None,
           inputs=None):
    """The placement report of a compiled function after a call with
    ``batch_rows`` rows that moved ``moved`` ({(source, dest): bytes});
    ``split``: batch-wise, which layers ran where; layer-wise, the
    planner.Plan of the function's layers; ``copied``: {purpose: bytes}
    copied by the call for each purpose (``copied_for``); ``inputs``: the
    call's, to plan its peak (``peak_plan``)."""
    peak_plan, why = _planned_peak(theano_function, mesh, inputs)
    note = '\n  peak not planned: %s' % why if why else ''
    if mesh.mode == 'layer':
        return format_report('%s (* master; activations estimated for the plan\'s '
                             'batch; bytes moved by this call)' % title,
                             _layer_rows(theano_function, mesh, moved, split, peak_plan),
                             LAYER_COLUMNS) + note
    heavy = heavy_op_counts(theano_function.maker.fgraph, mesh)
    resident = resident_bytes(theano_function, mesh)
    planned = planned_bytes(mesh, _shared_read(theano_function)) if mesh.sharded else {}
    peak = peak_of(theano_function) or {}
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
            'planned': planned.get(name),
            'peak_plan': peak_plan.get(name),
            'peak': peak.get(name),
            'moved_in': sum(n for (s, d), n in moved.items() if d in graph_names),
            'moved_out': sum(n for (s, d), n in moved.items() if s in graph_names),
        })
    text = format_report('%s (* master; bytes moved by this call)' % title, rows) + note
    return text + ('\n' + _split_lines(split, mesh, copied or {}) if split is not None else '')


def _planned_peak(theano_function, mesh, inputs):
    """({context name: planned peak bytes}, None), or ({}, why not)."""
    if inputs is None:
        return {}, None
    try:
        return planned_peak(theano_function, inputs, mesh.names_by_graph_name()), None
    except NotPlannable as error:
        return {}, str(error)


def _split_lines(split, mesh, copied):
    """Which layers ran where, under the batch-wise table."""
    contexts = ', '.join(mesh.names) or HOST
    lines = ['  layers computed on each context\'s rows (%s): %s'
             % (contexts, ', '.join(split.layers) or '-'),
             '  on the master (%s), over the whole batch: the loss%s'
             % (mesh.master or HOST, ' and metrics' if mesh.sharded else ', metrics and updates')]
    if split.synchronised:
        lines[-1] += ', and the statistics of %s' % ', '.join(split.synchronised)
    if split.whole:
        lines.append("  on the master, over the whole batch, where the batch's rows meet "
                     "(bytes copied for it by this call, both ways):")
    for layer in names_in_order(entry[0] or entry[1] for entry in split.whole):
        whys = names_in_order('%s %s' % (op, why) for name, op, why in split.whole
                      if (name or op) == layer)
        lines.append('    %s: %s; %s' % (layer, format_bytes(copied.get(purpose_of(layer), 0)),
                                         '; '.join(whys)))
    if mesh.sharded:
        lines.append("  on each weight's owner (split: on each block's context): the sum of "
                     "its gradients and its update")
    return '\n'.join(lines)


def _layer_rows(theano_function, mesh, moved, plan, peak_plan):
    """Per context: its layers (of ``plan``, the function's), resident and
    activation bytes, bytes moved."""
    heavy = heavy_op_counts(theano_function.maker.fgraph, mesh)
    resident = resident_bytes(theano_function, mesh)
    planned = planned_bytes(mesh, _shared_read(theano_function))
    peak = peak_of(theano_function) or {}
    rows = []
    for name in mesh.names + ([HOST] if HOST in heavy else []):
        graph_names = (name, None) if name == mesh.master else (name,)
        on = plan.needs_on(name)
        rows.append({
            'context': name + ('*' if name == mesh.master else ''),
            'device': mesh.devices.get(name, '-'),
            'layers': _compress([n.name for n in on]),
            'resident': resident.get(name, 0),
            'planned': planned.get(name),
            'peak_plan': peak_plan.get(name),
            'peak': peak.get(name),
            'activations': sum(n.activations for n in on),
            'heavy': heavy.get(name, {}),
            'moved_in': sum(n for (s, d), n in moved.items() if d in graph_names),
            'moved_out': sum(n for (s, d), n in moved.items() if s in graph_names),
        })
    return rows


def _compress(layers):
    if len(layers) <= 3:
        return ', '.join(layers) or '-'
    return '%s .. %s (%d)' % (layers[0], layers[-1], len(layers))

