"""Layer-wise (model parallel) rewriting of one function's graph: each
layer, its weights and its optimizer state live on one context.

Weights are PlacedVariables (``placed``).  Each function, at its first
call, plans the layers it computes that no plan has (by layer object: a
new model's layers are new, whatever their names), from the whole graph
and the batch size of that call (``plan``).  The rewrite then
computes each layer call from its inputs moved to its context (only where
the previous layer sits elsewhere) and from its weights' copies there;
loss, metrics and updates read the rewritten outputs, and the gradients
(stand-ins, ``gradients``) are taken of the rewritten loss, so the backward
pass crosses contexts where the forward did.

Which tensors are layer calls is the caller's knowledge (the Keras
adapter's): it passes ``layer_calls(roots)``, returning LayerCalls.
"""
from theano import gof

from .gradients import real_gradients, rewritten_stand_ins, stand_ins_in
from .placed import (PlacedVariable, check_no_placeholder, is_placed, optimizer_state_owners,
                     placed_replacements, value_holder)
from .plan import function_plan, layer_context, place, plan_layers
from .replace import replaced
from .transfer import on_context

__all__ = ['LayerCall', 'rewrite']


class LayerCall(object):
    """One call of a layer: the layer (the plan's unit, an object the plan
    holds weakly), its name, its input and output tensors, and the shapes
    of its outputs (None for any size).  The rewrite adds ``reads``, what
    the call's own ops read, and ``variables``, the PlacedVariables among
    them."""

    def __init__(self, layer, name, inputs, outputs, output_shapes):
        self.layer = layer
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.output_shapes = list(output_shapes)
        self.reads = []
        self.variables = []


def _in_order(calls):
    """``calls`` in topological order (inputs first), each with ``reads``
    and ``variables`` set.  The order follows the graph, not the model's
    nodes: a layer that returns its input (Dropout(0)) takes over that
    tensor's call."""
    producer = dict((id(t), c) for c in calls for t in c.outputs)
    for call in calls:
        call.reads = _region_inputs(call.outputs, producer)
        call.variables = [v for v in call.reads if isinstance(v, PlacedVariable)]
    order, done = [], set()

    def visit(call):
        if id(call) in done:
            return
        done.add(id(call))
        for read in call.reads:
            if id(read) in producer and producer[id(read)] is not call:
                visit(producer[id(read)])
        order.append(call)

    for call in calls:
        visit(call)
    return order


def _region_inputs(outputs, stop):
    """The variables ``outputs`` are computed from, stopping at layer
    outputs (ids in ``stop``) other than ``outputs`` themselves."""
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


def _place(calls, owners, roots, mesh):
    """Place every PlacedVariable the function reads: a layer's on its
    layer's context, optimizer state with its weight (``owners``), the rest
    on the master."""
    where = {}
    for call in calls:
        for variable in call.variables:
            where.setdefault(id(variable), layer_context(call.layer))
    for variable in gof.graph.inputs(roots):
        if isinstance(variable, PlacedVariable) and not is_placed(variable):
            _, owner = owners.get(id(variable), (None, None))
            name = where.get(id(variable)) or where.get(id(owner)) or mesh.master
            place(variable, name, mesh)


def rewrite(inputs, outputs, updates, mesh, batch_rows, layer_calls, placed_outputs=None):
    """(outputs, updates, plan) of the layer-wise function, ``plan`` the
    planner.Plan of its layers (for its report); plans its layers first if
    they are not planned yet.  ``updates`` is a list of pairs;
    ``layer_calls(roots)`` lists the LayerCalls whose outputs ``roots``
    read, in any order.

    With ``placed_outputs`` (a set, under MPI), the gradients stay
    stand-ins, of the rewritten loss, for the batch-wise rewrite across the
    ranks to take, and the ids of the rewritten layer outputs are added to
    it."""
    roots = list(outputs) + [new for _, new in updates]
    stand_ins = stand_ins_in(roots)
    losses = [s.tag.multigpu_gradient.loss for s in stand_ins]
    calls = _in_order(layer_calls(roots + losses))
    owners = optimizer_state_owners(updates, [v for c in calls for v in c.variables])
    plan_layers(calls, owners, mesh, batch_rows, gof.graph.inputs(roots + losses))
    _place(calls, owners, roots + losses, mesh)

    input_ids = set(id(v) for v in inputs)
    rewritten, located = {}, {}
    for call in calls:
        context = mesh.graph_name(layer_context(call.layer))
        replace = placed_replacements(call.reads)
        for read in call.reads:
            if id(read) in located:
                source = located[id(read)]
                replace[read] = (rewritten[id(read)] if source == context else
                                 on_context(rewritten[id(read)], context, came_from=source))
            elif id(read) in input_ids and read.ndim >= 1:
                replace[read] = on_context(read, context)
        for tensor, new in zip(call.outputs, replaced(call.outputs, replace)):
            rewritten[id(tensor)], located[id(tensor)] = new, context

    replace = placed_replacements(gof.graph.inputs(roots + losses))
    for call in calls:
        for tensor in call.outputs:
            replace[tensor] = rewritten[id(tensor)]
    # Targets and sample weights go where the model's output is computed:
    # left on the host, Theano may lift the loss onto another context.
    if calls:
        output_context = located[id(calls[-1].outputs[0])]
        read_by_layers = set(id(v) for c in calls for v in c.reads)
        for variable in gof.graph.inputs(roots + losses):
            if (id(variable) in input_ids and id(variable) not in read_by_layers
                    and variable.ndim >= 1):
                replace[variable] = on_context(variable, output_context)
    if placed_outputs is None:
        replace.update(real_gradients(stand_ins, replace, wrt=value_holder))
    else:
        placed_outputs.update(id(v) for v in rewritten.values())
        replace.update(rewritten_stand_ins(stand_ins, replace))
    new_roots = replaced(roots, replace)
    check_no_placeholder(new_roots, 'layer-wise rewrite')
    new_updates = [(value_holder(variable), new)
                   for (variable, _), new in zip(updates, new_roots[len(outputs):])]
    return new_roots[:len(outputs)], new_updates, function_plan(calls, batch_rows)
