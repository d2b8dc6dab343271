"""Layer-wise (model parallel) mode: each layer, its weights and its
optimizer state live on one context.

In layer-wise mode ``K.variable`` makes a ``PlacedVariable``: a host
variable until the plan places it, then a handle on its copy on the
planned context (``get_value``/``set_value`` read and write that copy, and
the host one keeps only its shape).  Each function, at its first call,
plans the layers it computes that no earlier plan placed, from the whole
graph and the batch size of that call (``planner``).  The rewrite then computes
each Keras layer application from its inputs moved to its context (only
where the previous layer sits elsewhere) and from its weights' copies
there; loss, metrics and updates read the rewritten outputs, and the
gradients (stand-ins from ``K.gradients``) are taken of the rewritten
loss, so the backward pass crosses contexts where the forward did.
"""
import numpy as np
import theano
from theano import gof
from theano.gpuarray.basic_ops import host_from_gpu
from theano.gpuarray.type import get_context, gpuarray_shared_constructor
from theano.tensor.sharedvar import TensorSharedVariable

from . import planner
from .gradients import real_gradients, stand_ins_in
from .settings import parse_device_memory, parse_layer_map
from .transfer import on_context

__all__ = ['PlacedVariable', 'new_variable', 'Plan', 'current_plan', 'rewrite',
           'LayerwiseFunction', 'host_graph']


class PlacedVariable(TensorSharedVariable):
    """A Keras weight in layer-wise mode (see the module docstring)."""

    placed = None        # the GPU shared variable holding the value, once placed

    def get_value(self, borrow=False, return_internal_type=False):
        if self.placed is None:
            return super(PlacedVariable, self).get_value(borrow, return_internal_type)
        return np.asarray(self.placed.get_value(borrow=borrow))

    def set_value(self, value, borrow=False):
        if self.placed is None:
            return super(PlacedVariable, self).set_value(value, borrow)
        self.placed.set_value(np.asarray(value, dtype=self.dtype), borrow=borrow)

    def place(self, context_name):
        """Move the value to ``context_name`` (a graph name); the host
        variable keeps a zero-strided placeholder of the same shape."""
        value = self.get_value()
        self.placed = gpuarray_shared_constructor(value, name=self.name, target=context_name)
        self.container.storage[0] = np.broadcast_to(np.zeros((), value.dtype), value.shape)

    @property
    def nbytes(self):
        value = self.get_value(borrow=True)
        return int(value.size) * value.dtype.itemsize


def new_variable(value, dtype, name):
    """A PlacedVariable for arrays; scalars (learning rates, counters) stay
    plain host variables, which every context reads at no cost."""
    value = np.asarray(value, dtype=dtype)
    variable = theano.shared(value=value, name=name, strict=False, target='cpu')
    if value.ndim >= 1:
        variable.__class__ = PlacedVariable
    variable._keras_shape = value.shape
    variable._uses_learning_phase = False
    return variable


class Plan(object):
    """Where each layer (by name) lives, and what the planner counted."""

    def __init__(self, contexts, needs, budgets, batch_rows):
        self.contexts = contexts        # {layer name: context name}
        self.needs = needs              # [LayerNeeds] in topological order
        self.budgets = budgets          # {context name: bytes or None}
        self.batch_rows = batch_rows

    def needs_on(self, name):
        """The LayerNeeds of the layers on context ``name``."""
        return [n for n in self.needs if self.contexts[n.name] == name]


_plan = None


def current_plan():
    """The process's Plan, or None before the first layer-wise call."""
    return _plan


# ---------------------------------------------------------------- the graph

class _Application(object):
    """One call of a Keras layer: its output and input tensors, and the
    PlacedVariables its own ops read."""

    def __init__(self, layer, node):
        self.layer = layer
        self.outputs = list(node.output_tensors)
        self.inputs = list(node.input_tensors)
        self.variables = []


def _keras_layer(variable):
    history = getattr(variable, '_keras_history', None)
    return history[0] if history else None


def _applications(roots):
    """The Keras layer calls whose outputs ``roots`` read, in topological
    order (inputs first), each with what its own ops read (``reads``) and
    the PlacedVariables among that.  The order follows the graph, not
    Keras's nodes: a layer that returns its input (Dropout(0)) takes over
    that tensor's history."""
    found = {}
    for variable in gof.graph.ancestors(roots):
        layer = _keras_layer(variable)
        if layer is not None and variable.owner is not None:
            key = (id(layer), variable._keras_history[1])
            if key not in found:
                found[key] = _Application(layer, layer.inbound_nodes[key[1]])
    producer = dict((id(t), a) for a in found.values() for t in a.outputs)
    for application in found.values():
        application.reads = _region_inputs(application.outputs, producer)
        application.variables = [v for v in application.reads if isinstance(v, PlacedVariable)]
    order, done = [], set()

    def visit(application):
        if id(application) in done:
            return
        done.add(id(application))
        for read in application.reads:
            if id(read) in producer and producer[id(read)] is not application:
                visit(producer[id(read)])
        order.append(application)

    for application in found.values():
        visit(application)
    return order


def _region_inputs(outputs, stop):
    """The variables ``outputs`` are computed from, stopping at Keras
    tensors (ids in ``stop``) other than ``outputs`` themselves."""
    own = set(id(v) for v in outputs)
    seen, found, todo = set(), [], list(outputs)
    while todo:
        variable = todo.pop()
        if id(variable) in seen:
            continue
        seen.add(id(variable))
        if variable.owner is None or (id(variable) in stop and id(variable) not in own):
            found.append(variable)
        else:
            todo.extend(variable.owner.inputs)
    return found


def _state_owners(updates, weights):
    """{id(state): (state, weight)}: the optimizer state each weight's
    update reads (an accumulator read by one weight's update alone belongs
    to it)."""
    weight_ids = set(id(w) for w in weights)
    readers = {}
    for variable, new_value in updates:
        if id(variable) not in weight_ids:
            continue
        for read in _region_inputs([new_value], set()):
            if isinstance(read, PlacedVariable) and read is not variable:
                readers.setdefault(id(read), (read, []))[1].append(variable)
    return dict((key, (state, ws[0])) for key, (state, ws) in readers.items()
                if len(ws) == 1)


# ----------------------------------------------------------------- the plan

def _activation_bytes(application, batch_rows):
    total = 0
    for tensor in application.outputs:
        shape = getattr(tensor, '_keras_shape', None) or (None,) * tensor.ndim
        elements = batch_rows
        for size in shape[1:]:
            elements *= size or 1
        total += elements * np.dtype(tensor.dtype).itemsize
    return int(total)


def _budgets(mesh):
    """{context name: bytes the plan may use, or None when unknown}."""
    given = parse_device_memory(theano.config.multigpu.device_memory)
    sharing = {}
    for name in mesh.names:
        sharing[mesh.devices[name]] = sharing.get(mesh.devices[name], 0) + 1
    budgets = {}
    for name in mesh.names:
        budget = given.get(name, given.get(None))
        if budget is None:
            try:
                free = get_context(mesh.graph_name(name)).free_gmem
                budget = int(free) // sharing[mesh.devices[name]]
            except Exception:   # the device does not tell (OpenCL may not)
                budget = None
        budgets[name] = budget
    return budgets


def _plan_layers(applications, owners, mesh, batch_rows):
    """Plan the layers of ``applications`` (those not planned yet) into the
    process's Plan, making it if there is none; ``owners`` is _state_owners'."""
    global _plan
    known = _plan.contexts if _plan is not None else {}
    new = [a for a in applications if a.layer.name not in known]
    if not new:
        return
    by_layer, order = {}, []
    for application in new:
        name = application.layer.name
        if name not in by_layer:
            by_layer[name] = planner.LayerNeeds(name)
            order.append(by_layer[name])
        by_layer[name].activations += _activation_bytes(application, batch_rows)
    claimed = {}
    for application in new:
        for variable in application.variables:
            if id(variable) not in claimed and variable.placed is None:
                claimed[id(variable)] = application.layer.name
                by_layer[application.layer.name].weights += variable.nbytes
    for state, weight in owners.values():
        if id(state) not in claimed and id(weight) in claimed and state.placed is None:
            by_layer[claimed[id(weight)]].state += state.nbytes
    budgets = _budgets(mesh)
    for name in mesh.names:   # what earlier plans use is not available
        if budgets[name] is not None and _plan is not None:
            budgets[name] -= sum(n.total for n in _plan.needs_on(name))
    layer_map = parse_layer_map(theano.config.multigpu.layer_map)
    if layer_map:
        contexts = planner.mapped([n.name for n in order], layer_map, mesh.names, mesh.names[0])
    else:
        contexts = planner.balanced(order, mesh.names, budgets)
    planner.check_fits(order, contexts, mesh.names, budgets, batch_rows)
    if _plan is None:
        _plan = Plan({}, [], budgets, batch_rows)
    _plan.contexts.update(contexts)
    _plan.needs.extend(order)


def _place(applications, owners, roots, mesh):
    """Place every PlacedVariable the function reads: a layer's on its
    layer's context, optimizer state with its weight (``owners``), the rest
    on the master."""
    where = {}
    for application in applications:
        for variable in application.variables:
            where.setdefault(id(variable), _plan.contexts[application.layer.name])
    for variable in gof.graph.inputs(roots):
        if isinstance(variable, PlacedVariable) and variable.placed is None:
            _, owner = owners.get(id(variable), (None, None))
            name = where.get(id(variable)) or where.get(id(owner)) or mesh.master
            variable.place(mesh.graph_name(name))


# -------------------------------------------------------------- the rewrite

_views = {}


def _view(variable):
    """The host-typed view of a placed variable's copy, one per variable."""
    if id(variable) not in _views:
        _views[id(variable)] = (variable, host_from_gpu(variable.placed))
    return _views[id(variable)][1]


def _placed_replacements(variables):
    return dict((v, _view(v)) for v in variables
                if isinstance(v, PlacedVariable) and v.placed is not None)


def rewrite(inputs, outputs, updates, mesh, batch_rows):
    """(outputs, updates) of the layer-wise function; plans its layers
    first if they are not planned yet.  ``updates`` is a list of pairs."""
    roots = list(outputs) + [new for _, new in updates]
    stand_ins = stand_ins_in(roots)
    losses = [s.tag.multigpu_gradient.loss for s in stand_ins]
    applications = _applications(roots + losses)
    owners = _state_owners(updates, [v for a in applications for v in a.variables])
    _plan_layers(applications, owners, mesh, batch_rows)
    _place(applications, owners, roots + losses, mesh)

    input_ids = set(id(v) for v in inputs)
    rewritten, located = {}, {}
    for application in applications:
        context = mesh.graph_name(_plan.contexts[application.layer.name])
        replace = _placed_replacements(application.reads)
        for read in application.reads:
            if id(read) in located:
                source = located[id(read)]
                replace[read] = (rewritten[id(read)] if source == context else
                                 on_context(rewritten[id(read)], context, came_from=source))
            elif id(read) in input_ids and read.ndim >= 1:
                replace[read] = on_context(read, context)
        for tensor, new in zip(application.outputs,
                               theano.clone(application.outputs, replace=replace, strict=False)):
            rewritten[id(tensor)], located[id(tensor)] = new, context

    replace = _placed_replacements(gof.graph.inputs(roots + losses))
    for application in applications:
        for tensor in application.outputs:
            replace[tensor] = rewritten[id(tensor)]
    # Targets and sample weights go where the model's output is computed:
    # left on the host, Theano may lift the loss onto another context.
    if applications:
        output_context = located[id(applications[-1].outputs[0])]
        read_by_layers = set(id(v) for a in applications for v in a.reads)
        for variable in gof.graph.inputs(roots + losses):
            if (id(variable) in input_ids and id(variable) not in read_by_layers
                    and variable.ndim >= 1):
                replace[variable] = on_context(variable, output_context)
    replace.update(real_gradients(stand_ins, replace, wrt=lambda p: p.placed))
    new_roots = theano.clone(roots, replace=replace, strict=False)
    left = [v for v in gof.graph.inputs(new_roots) if isinstance(v, PlacedVariable)]
    if left:
        raise RuntimeError(
            'layer-wise rewrite left the host copies of %s in the graph, where they '
            'hold no values; please report this with the model'
            % ', '.join(str(v) for v in left[:5]))
    new_updates = [(variable.placed if isinstance(variable, PlacedVariable) else variable, new)
                   for (variable, _), new in zip(updates, new_roots[len(outputs):])]
    return new_roots[:len(outputs)], new_updates


def host_graph(x):
    """``x`` with placed variables read from their copies (for K.eval)."""
    if isinstance(x, PlacedVariable) and x.placed is not None:
        return _view(x)
    replace = _placed_replacements(gof.graph.inputs([x]))
    return theano.clone(x, replace=replace, strict=False) if replace else x


class LayerwiseFunction(object):
    """A Keras backend Function compiled at its first call, when the batch
    size the plan counts activations with is known.

    ``compile_for(batch_rows)`` returns the Keras Function.
    """

    def __init__(self, compile_for):
        self._compile_for = compile_for
        self._compiled = None

    def __call__(self, inputs):
        if self._compiled is None:
            rows = next((len(x) for x in inputs if getattr(x, 'ndim', 0) >= 1), 1)
            self._compiled = self._compile_for(rows)
        return self._compiled(inputs)

    def __getattr__(self, name):
        """``function`` and the rest: the compiled Function's (compiling it,
        with the plan's batch size, if it was never called)."""
        if name.startswith('_'):
            raise AttributeError(name)
        if self._compiled is None:
            self._compiled = self._compile_for(_plan.batch_rows if _plan else 1)
        return getattr(self._compiled, name)


def report_rows(theano_function, mesh, moved):
    """Per context: its layers, resident and activation bytes, bytes moved."""
    from .placement import HOST, heavy_op_counts, resident_bytes
    heavy = heavy_op_counts(theano_function.maker.fgraph, mesh)
    resident = resident_bytes(theano_function, mesh)
    rows = []
    for name in mesh.names + ([HOST] if HOST in heavy else []):
        graph_names = (name, None) if name == mesh.master else (name,)
        on = _plan.needs_on(name)
        rows.append({
            'context': name + ('*' if name == mesh.master else ''),
            'device': mesh.devices.get(name, '-'),
            'layers': _compress([n.name for n in on]),
            'resident': resident.get(name, 0),
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

