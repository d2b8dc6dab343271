"""The step's peak per context, planned before a call runs.

``planned_peak(function, args)`` replays a compiled function's call without
computing it: the shapes of its values inferred op by op from the shapes
of the call's inputs and weights alone (each op's ``infer_shape``, a rule
for the GPU ops without one, else Theano's shape inference,
``fgraph.shape_feature``); the ops in the order Theano's VM runs them (its Stack:
each output's op once its inputs are computed, depth first from the
outputs); each value freed after its last reader ran, as the VM frees it;
an output that is a view of its input or overwrites it (``view_map``,
``destroy_map``) shares the input's buffer.  After every op it adds up the
bytes held on each context, as ``peak.PeakMeter`` measures them, and keeps
the most.  A value whose shape only its computation tells (an op without
shape inference) makes the function ``NotPlannable``, naming it.
"""
import numpy as np
import theano
from theano import gof
from theano.compile import SharedVariable
from theano.gpuarray.type import GpuArrayType, get_context
from theano.tensor.nnet import corr

from ..config.devices import total_memory
from ..config.flags import format_bytes, parse_device_memory
from ..errors import ConfigurationError, PlanError
from . import planner
from theano.compile.ops import Shape, Shape_i

__all__ = ['NotPlannable', 'planned_peak', 'check_peak_fits']


class NotPlannable(ValueError):
    """A function's peak cannot be planned: the message says why."""


def planned_peak(theano_function, args, names):
    """{context name: the most bytes held on it at once} during a call of
    ``theano_function`` with ``args`` (its explicit inputs, in order);
    ``names``: {graph name of a context: its name} (a context it does not
    name is counted as 'default').  Raises NotPlannable."""
    fgraph = theano_function.maker.fgraph
    shape_of = getattr(getattr(fgraph, 'shape_feature', None), 'shape_of', None)
    if shape_of is None:
        raise NotPlannable('the compiled graph keeps no shape inference (ShapeFeature)')
    try:
        shapes = _Shapes(fgraph, shape_of, _input_values(theano_function, args))
        return _replay(fgraph, shapes, names)
    except NotPlannable:
        raise
    except Exception as error:   # a plan must not stop a step it cannot plan
        raise NotPlannable('planning failed (%s: %s); please report this with the model'
                           % (type(error).__name__, error))


def check_peak_fits(theano_function, args, mesh, title):
    """Raise PlanError, before a call with ``args`` runs, when its planned
    peak on a context exceeds what the context may use: its
    multigpu.device_memory, else its device's memory (not its free memory,
    which excludes what the allocator keeps cached for the next step),
    shared by the contexts on that device.  A function whose peak cannot be
    planned, or a device that does not say its memory, is not checked."""
    names = dict((mesh.graph_name(name), name) for name in mesh.names)
    given = parse_device_memory(theano.config.multigpu.device_memory)
    try:
        peak = planned_peak(theano_function, args, names)
        room = planner.budgets(mesh.names, mesh.devices, given, lambda name: total_memory(
            get_context(mesh.graph_name(name))))
    except (NotPlannable, ConfigurationError):
        return
    over = [name for name in mesh.names if peak.get(name, 0) > room[name]]
    if over:
        raise PlanError(
            '%s expects each context to hold, at the peak of its step, what it holds at once '
            '(its weights and optimizer state, the copies of weights it reads, the batch\'s '
            'activations and gradients), but %s do(es) not have that room. Planned for '
            'this call, before it ran:\n  %s\nUse a smaller batch or more contexts, split '
            'more weights (a lower multigpu.shard_split), or raise multigpu.device_memory '
            'if the devices have more memory than it says.'
            % (title, ', '.join(over), '\n  '.join(
                '%s: peak %s, has %s' % (name, format_bytes(peak.get(name, 0)),
                                         format_bytes(room[name])) for name in mesh.names)))


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


class _Shapes(object):
    """The shapes of a graph's values, in graph order: each op's output
    shapes from its ``infer_shape`` given its inputs' shapes as numbers
    (``SHAPE_RULES`` for the GPU ops that have none), else from the graph's
    shape inference; a shape expression is evaluated with the ops' Python
    implementations on scalars and shape vectors alone."""

    def __init__(self, fgraph, shape_of, values):
        self.shape_of = shape_of
        self.values = dict(values)
        self.known = {}
        for node in fgraph.toposort():
            self._infer(node)

    def shape(self, variable):
        if variable in self.values:
            value = self.values[variable]
            return tuple(value.shape) if hasattr(value, 'shape') else np.shape(value)
        if isinstance(variable, gof.Constant):
            return np.shape(variable.data)
        if variable.owner is None:
            if getattr(variable.type, 'ndim', 0):
                raise NotPlannable('%s has no value to read its shape from' % variable)
            return ()
        if variable not in self.known:
            raise NotPlannable('the shape of %s (computed by %s) is known only once it is '
                               'computed' % (variable, variable.owner.op))
        return self.known[variable]

    def _infer(self, node):
        rule = SHAPE_RULES.get(type(node.op).__name__)
        try:
            inputs = [self.shape(v) for v in node.inputs]
            if rule is not None:
                found = rule(node, inputs)
            elif hasattr(node.op, 'infer_shape'):
                found = node.op.infer_shape(node, inputs)
            else:
                found = [self.shape_of[o] for o in node.outputs]
            for output, shape in zip(node.outputs, found):
                self.known[output] = tuple(int(self._value(d)) for d in shape)
        except NotPlannable:
            raise
        except Exception as error:   # any op's own error: the shapes cannot tell
            raise NotPlannable('the output shape of %s cannot be inferred from its inputs\' '
                               '(%s: %s)' % (node.op, type(error).__name__, error))

    def _value(self, variable):
        if not isinstance(variable, gof.Variable):
            return variable
        if variable in self.values:
            return self.values[variable]
        if isinstance(variable, gof.Constant):
            return variable.data
        node = variable.owner
        if node is None:
            raise NotPlannable('%s has no value' % variable)
        if isinstance(node.op, Shape_i):
            return np.asarray(self.shape(node.inputs[0])[node.op.i], dtype='int64')
        if isinstance(node.op, Shape):
            return np.asarray(self.shape(node.inputs[0]), dtype='int64')
        if any(getattr(v.type, 'ndim', 0) > 1 for v in node.inputs + node.outputs):
            raise NotPlannable('the shape of a value needs %s computed' % node.op)
        storage = [[None] for _ in node.outputs]
        node.op.perform(node, [self._value(v) for v in node.inputs], storage)
        for output, cell in zip(node.outputs, storage):
            self.values[output] = cell[0]
        return self.values[variable]


def _same_as_first(node, shapes):
    return [shapes[0]]


def _dot22(node, shapes):
    return [(shapes[0][0], shapes[1][1])]


def _as_cpu(cpu_class):
    """The rule of a GPU correlation op: its CPU twin's ``infer_shape``,
    which reads the same attributes."""
    def rule(node, shapes):
        return cpu_class.infer_shape(node.op, node, shapes)
    return rule


# GPU ops with no infer_shape of their own.
SHAPE_RULES = {'GpuContiguous': _same_as_first, 'GpuGemm': _same_as_first,
               'GpuGemv': _same_as_first, 'GpuGer': _same_as_first, 'GpuDot22': _dot22,
               'GpuCorrMM': _as_cpu(corr.CorrMM),
               'GpuCorrMM_gradWeights': _as_cpu(corr.CorrMM_gradWeights),
               'GpuCorrMM_gradInputs': _as_cpu(corr.CorrMM_gradInputs)}


def _stack_order(fgraph):
    """The ops in the order Theano's Stack VM runs them (non-lazy: an op
    whose inputs are not all computed goes back on the stack under the ops
    that compute them)."""
    destroy_deps = _destroy_dependencies(fgraph)
    computed = set(v for v in fgraph.variables if v.owner is None)
    stack = [o.owner for o in fgraph.outputs if o.owner]
    order = []
    while stack:
        node = stack.pop()
        deps = node.inputs + destroy_deps.get(node, [])
        if all(v in computed for v in deps):
            if not all(o in computed for o in node.outputs):
                order.append(node)
                computed.update(node.outputs)
        else:
            stack.append(node)
            stack.extend(v.owner for v in deps if v.owner)
    return order


def _destroy_dependencies(fgraph):
    """{node: the variables that must be computed before it runs} from the
    graph's orderings (an op overwriting a value runs after its readers)."""
    found = {}
    for node, prerequisites in fgraph.orderings().items():
        found[node] = [o for p in prerequisites for o in p.outputs]
    return found


def _replay(fgraph, shapes, names):
    """The most bytes per context held at once, replaying the Stack's
    order with its frees (see the module docstring)."""
    readers = {}
    for node in fgraph.apply_nodes:
        for variable in node.inputs:
            readers.setdefault(variable, []).extend(node.outputs)
    outputs = set(fgraph.outputs)
    buffer_of, size_of, context_of = {}, {}, {}

    def hold(variable, source=None):
        if not isinstance(variable.type, GpuArrayType):
            return
        buffer_of[variable] = buffer_of.get(source, variable) if source is not None else variable
        key = buffer_of[variable]
        size = int(np.prod(shapes.shape(variable), dtype='int64')) * \
            np.dtype(variable.dtype).itemsize
        size_of[key] = max(size_of.get(key, 0), size)
        context_of[key] = names.get(variable.type.context_name, 'default')

    live = set()
    for variable in fgraph.variables:
        if variable.owner is None:
            hold(variable)
            live.add(variable)
    computed = set(live)
    peak = {}
    for node in _stack_order(fgraph):
        aliases = dict(getattr(node.op, 'view_map', {}) or {})
        aliases.update(getattr(node.op, 'destroy_map', {}) or {})
        for k, output in enumerate(node.outputs):
            source = node.inputs[aliases[k][0]] if k in aliases else None
            hold(output, source)
            live.add(output)
            computed.add(output)
        held = {}
        for key in set(buffer_of[v] for v in live if v in buffer_of):
            held[context_of[key]] = held.get(context_of[key], 0) + size_of[key]
        for name, n in held.items():
            peak[name] = max(peak.get(name, 0), n)
        for variable in node.inputs:
            if (variable.owner is not None and variable not in outputs
                    and readers.get(variable)
                    and all(v in computed for v in readers[variable])):
                live.discard(variable)
    return peak
