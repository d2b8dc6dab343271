"""The step's peak per context, planned before a call runs.

``planned_peak(function, args, names)`` replays a compiled function's call
without computing it:

- the shapes of its values at this call (``value_shapes``);
- its ops in the order the function's VM runs them: Theano's C VM (the
  default) and Stack (``multigpu.measure_peak``) both run an op once its
  inputs are computed, depth first from the outputs, the C VM from the
  first output and each op's first input, the Stack from the last; a
  branch (IfElse) runs the side its condition takes, read from the call;
  a Python Loop runs the graph's order;
- each value freed after its last reader ran, where the VM frees
  (``allow_gc``, Theano's default; without it, every value is held);
- an output that is a view of its input or overwrites it (``view_map``,
  ``destroy_map``) shares the input's buffer.

After every op it adds up the bytes held on each context, as
``peak.PeakMeter`` measures them, and keeps the most.  Not counted, by the
plan nor the meter: the values Scan keeps inside its loop, an op's own
workspace, and what the allocator caches.
"""
import numpy as np
import theano
from theano.compile import SharedVariable
from theano.gof import vm
from theano.gpuarray.type import GpuArrayType, get_context
from theano.ifelse import IfElse

from ..config.devices import total_memory
from ..config.flags import format_bytes, parse_device_memory
from ..errors import PlanError
from . import planner
from .value_shapes import NotPlannable, ValueShapes

__all__ = ['NotPlannable', 'planned_peak', 'peaks_and_room', 'misfit']


def planned_peak(theano_function, args, names):
    """{context name: the most bytes held on it at once} during a call of
    ``theano_function`` with ``args`` (its explicit inputs, in order);
    ``names``: {graph name of a context: its name} (a context it does not
    name is counted as 'default').  Raises NotPlannable."""
    fgraph = theano_function.maker.fgraph
    try:
        shapes = ValueShapes(fgraph, _input_values(theano_function, args))
        order = _order(theano_function, shapes)
        freeing = getattr(theano_function.maker.linker, 'allow_gc', True)
        return _replay(fgraph, order, shapes, names, freeing)
    except NotPlannable:
        raise
    except Exception as error:   # a plan must not stop a step it cannot plan
        raise NotPlannable('planning failed (%s: %s); please report this with the model'
                           % (type(error).__name__, error))


def peaks_and_room(theano_function, args, mesh):
    """[(context names, their planned peak together, the room they have)]
    for a call with ``args``: each context with a multigpu.device_memory
    alone, the others grouped by device, against the device's memory (not
    its free memory, which excludes what the allocator keeps cached from
    the step before); None where the peak cannot be planned or a device
    does not say its memory."""
    given = parse_device_memory(theano.config.multigpu.device_memory)
    try:
        peak = planned_peak(theano_function, args, mesh.names_by_graph_name())
        limits = _limits(mesh, given)
    except Exception:   # nothing planned, nothing refused
        return None
    return [(names, sum(peak.get(name, 0) for name in names), room) for names, room in limits]


def misfit(limits, title):
    """The PlanError that stops a call, before it runs, whose planned peak
    exceeds the room of its contexts (``limits``: ``peaks_and_room``'s, or
    None where the peak is not planned: the call runs); None where it
    fits.  ``title`` names the function."""
    over = [name for names, need, room in limits or () if need > room for name in names]
    if not over:
        return None
    return PlanError(
        '%s expects each context to hold, at the peak of its step, what it holds at once '
        '(its weights and optimizer state, the copies of weights it reads, the batch\'s '
        'activations and gradients), but %s do(es) not have that room. Planned for '
        'this call, before it ran:\n  %s\nUse a smaller batch or more contexts, split '
        'more weights (a lower multigpu.shard_split), or raise multigpu.device_memory '
        'if the devices have more memory than it says.'
        % (title, ', '.join(over), '\n  '.join(
            '%s: peak %s, has %s' % (' + '.join(names), format_bytes(need), format_bytes(room))
            for names, need, room in limits)))


def _limits(mesh, given):
    """[(context names, bytes they may hold together)]: each context with
    a multigpu.device_memory alone, the others grouped by device."""
    limits, by_device = [], {}
    for name in mesh.names:
        budget = given.get(name, given.get(None))
        if budget is not None:
            limits.append(([name], budget))
        else:
            by_device.setdefault(mesh.devices[name], []).append(name)
    for names in by_device.values():
        memory = total_memory(get_context(mesh.graph_name(names[0])))
        if memory is not None:
            limits.append((names, memory))
    return limits


def _input_values(theano_function, args):
    """{fgraph input: its value} for a call with ``args``."""
    args = list(args)
    values = {}
    for spec, variable, storage in zip(theano_function.maker.inputs,
                                       theano_function.maker.fgraph.inputs,
                                       theano_function.input_storage):
        if isinstance(spec.variable, SharedVariable) or spec.implicit:
            values[variable] = storage.data
        elif args:
            values[variable] = args.pop(0)
    return values


def _order(theano_function, shapes):
    """The ops the function's VM runs for this call, in its order."""
    fgraph, machine = theano_function.maker.fgraph, theano_function.fn
    if isinstance(machine, (vm.Loop, vm.LoopGC)):
        return list(machine.nodes)
    return _depth_first(fgraph, shapes, last_first=isinstance(machine, vm.Stack))


def _depth_first(fgraph, shapes, last_first):
    """Each op once the ops computing its inputs ran, and those its graph
    orders before it (the readers of a value it overwrites), from the
    outputs, in order or (``last_first``, the Stack) in reverse; an IfElse
    needs its condition, then the side it takes."""
    done, order = set(), []
    before = dict((node, [o for p in prerequisites for o in p.outputs])
                  for node, prerequisites in fgraph.orderings().items())

    def needs(node):
        if isinstance(node.op, IfElse):
            condition = node.inputs[0]
            if condition.owner is not None and condition.owner not in done:
                return [condition]
            inputs = [condition] + list(_taken(node, shapes))
        else:
            inputs = list(node.inputs)
        # The C VM runs the ordered-before first; the Stack lists them last.
        ordered = before.get(node, [])
        return inputs + ordered if last_first else ordered + inputs

    roots = [o.owner for o in fgraph.outputs if o.owner]
    stack = list(roots) if last_first else list(reversed(roots))
    while stack:
        node = stack.pop()
        if node in done:
            continue
        waiting = [v.owner for v in needs(node) if v.owner is not None and v.owner not in done]
        if waiting:
            stack.append(node)
            stack.extend(waiting if last_first else reversed(waiting))
        else:
            done.add(node)
            order.append(node)
    return order


def _taken(node, shapes):
    """The inputs of the side of IfElse ``node`` its condition takes."""
    n = node.op.n_outs
    if np.asarray(shapes.value(node.inputs[0])).item():
        return node.inputs[1:1 + n]
    return node.inputs[1 + n:1 + 2 * n]


def _aliases(node, shapes):
    """{output index: index of the input whose buffer it shares}."""
    if isinstance(node.op, IfElse):
        # A view of the true side, when taken (the false side is copied).
        taken_true = node.inputs[1:1 + node.op.n_outs] == _taken(node, shapes)
        return dict((k, 1 + k) for k in range(node.op.n_outs)) \
            if node.op.as_view and taken_true else {}
    found = dict((k, ins[0]) for k, ins in (getattr(node.op, 'view_map', {}) or {}).items())
    found.update((k, ins[0]) for k, ins in (getattr(node.op, 'destroy_map', {}) or {}).items())
    return found


class _Held(object):
    """The bytes held per context, buffer by buffer: a buffer counts while
    any value on it is held, at the size of the largest."""

    def __init__(self):
        self.total = {}
        self._buffer = {}     # value: the value whose buffer it is on
        self._size = {}       # buffer: (context, bytes)
        self._holders = {}    # buffer: values held on it

    def hold(self, variable, context, nbytes, source=None):
        buffer = self._buffer.get(source, variable) if source is not None else variable
        self._buffer[variable] = buffer
        before = self._size.get(buffer, (context, 0))[1] if self._holders.get(buffer) else 0
        size = max(before, nbytes)
        self._size[buffer] = (context, size)
        self._holders[buffer] = self._holders.get(buffer, 0) + 1
        self.total[context] = self.total.get(context, 0) + size - before

    def free(self, variable):
        buffer = self._buffer.get(variable)
        if buffer is None:
            return
        self._holders[buffer] -= 1
        if not self._holders[buffer]:
            context, size = self._size[buffer]
            self.total[context] -= size


def _replay(fgraph, order, shapes, names, freeing):
    """The most bytes per context held at once (see the module docstring)."""
    # A value is freed once every op that reads it ran: one the VM skips
    # (a branch not taken) keeps it until the call ends.
    readers = {}
    for node in fgraph.apply_nodes:
        for variable in node.inputs:
            readers.setdefault(variable, set()).add(node)
    outputs = set(fgraph.outputs)
    held = _Held()

    def hold(variable, source=None):
        if isinstance(variable.type, GpuArrayType):
            nbytes = int(np.prod(shapes.shape(variable), dtype='int64')) * \
                np.dtype(variable.dtype).itemsize
            held.hold(variable, names.get(variable.type.context_name, 'default'), nbytes,
                      source)

    for variable in fgraph.inputs:
        hold(variable)
    peak = dict(held.total)
    ran = set()
    for node in order:
        aliases = _aliases(node, shapes)
        for k, output in enumerate(node.outputs):
            hold(output, node.inputs[aliases[k]] if k in aliases else None)
        ran.add(node)
        for name, n in held.total.items():
            peak[name] = max(peak.get(name, 0), n)
        if freeing:
            for variable in set(node.inputs):
                if (variable.owner is not None and variable not in outputs
                        and readers[variable] <= ran):
                    held.free(variable)
    return peak
