"""The layer-wise plan of this process: which context holds each layer,
made from a function's layer calls at its first call and grown by later
functions (their layers not planned yet).

The numbers (each layer's bytes, each context's budget) are counted here;
``planner`` decides from them.
"""
import numpy as np
import theano
from theano.gpuarray.type import get_context

from ..config.flags import parse_device_memory, parse_layer_map
from . import planner

__all__ = ['Plan', 'current_plan', 'plan_layers']


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


def _activation_bytes(call, batch_rows):
    """Bytes of a layer call's outputs at ``batch_rows`` rows."""
    total = 0
    for tensor, shape in zip(call.outputs, call.output_shapes):
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


def plan_layers(calls, owners, mesh, batch_rows):
    """Plan the layers of ``calls`` (layer-wise LayerCalls; those not
    planned yet) into the process's Plan, making it if there is none.
    ``owners``: {id(state): (state, weight)}, optimizer state counted with
    its weight.  Raises PlanError when they do not fit."""
    global _plan
    known = _plan.contexts if _plan is not None else {}
    new = [c for c in calls if c.name not in known]
    if not new:
        return
    by_layer, order = {}, []
    for call in new:
        if call.name not in by_layer:
            by_layer[call.name] = planner.LayerNeeds(call.name)
            order.append(by_layer[call.name])
        by_layer[call.name].activations += _activation_bytes(call, batch_rows)
    claimed = {}
    for call in new:
        for variable in call.variables:
            if id(variable) not in claimed and variable.placed is None:
                claimed[id(variable)] = call.name
                by_layer[call.name].weights += variable.nbytes
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
