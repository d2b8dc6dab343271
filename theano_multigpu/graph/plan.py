"""The layer-wise plan of this process: which context holds each layer,
made from a function's layer calls at its first call and grown by later
functions (their layers not planned yet).

The numbers (each layer's bytes, each context's budget, and the shared
variables no plan places, such as random generators' states, where they
live) are counted here; ``planner`` decides from them.
"""
import gc
import weakref

import numpy as np
import theano
from theano.gpuarray.type import GpuArrayType, get_context

from ..config.flags import parse_device_memory, parse_layer_map
from . import planner
from .placement import context_of

__all__ = ['Plan', 'current_plan', 'plan_layers', 'budgets_of', 'hold', 'place',
           'held_bytes', 'planned_bytes', 'nbytes']


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

# {GPU shared variable: context name}, held weakly: ``_held``, those on a
# context that no plan places (random generators' states, which Theano
# makes on its default context), counted where they live; ``_placed``, the
# copies of the weights and optimizer state the plans placed.
_held = weakref.WeakKeyDictionary()
_placed = weakref.WeakKeyDictionary()


def nbytes(variable):
    """The bytes of a shared variable's value (a GPU array's, not copied)."""
    value = variable.get_value(borrow=True, return_internal_type=True)
    return int(getattr(value, 'size', 0)) * value.dtype.itemsize


def hold(variables, mesh):
    """Count those of ``variables`` that are shared variables on a context
    (GPU arrays) where they live, unless a plan placed them."""
    for variable in variables:
        if (isinstance(getattr(variable, 'type', None), GpuArrayType)
                and hasattr(variable, 'get_value') and variable not in _placed):
            _held[variable] = context_of(variable, mesh)


def place(variable, name, mesh):
    """Place PlacedVariable ``variable`` on context ``name``, and count it."""
    variable.place(mesh.graph_name(name))
    _placed[variable.placed] = name


def _bytes_by_context(where, mesh, variables):
    found = dict((name, 0) for name in mesh.names)
    chosen = None if variables is None else set(id(v) for v in variables)
    for variable, name in list(where.items()):
        if chosen is None or id(variable) in chosen:
            found[name] = found.get(name, 0) + nbytes(variable)
    return found


def _collect_if_all(variables):
    """Before counting all the process holds: a dead model's weights,
    waiting for Python's cycle collector, would otherwise count or not
    depending on when it last ran, and the same script would place its
    weights differently from run to run."""
    if variables is None:
        gc.collect()


def held_bytes(mesh):
    """{context name: bytes of what ``hold`` counted there}."""
    _collect_if_all(None)
    return _bytes_by_context(_held, mesh, None)


def planned_bytes(mesh, variables=None):
    """{context name: bytes the plans put there for good}: the weights and
    optimizer state they placed and what ``hold`` counted, all of them or
    those among ``variables`` (e.g. what a compiled function reads)."""
    _collect_if_all(variables)
    found = _bytes_by_context(_placed, mesh, variables)
    for name, n in _bytes_by_context(_held, mesh, variables).items():
        found[name] = found.get(name, 0) + n
    return found


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


def budgets_of(mesh, given_only=False):
    """{context name: bytes the plan may use, or None when unknown}: from
    multigpu.device_memory, else the device's free memory (which excludes
    what is allocated already), unless ``given_only``."""
    given = parse_device_memory(theano.config.multigpu.device_memory)
    sharing = {}
    for name in mesh.names:
        sharing[mesh.devices[name]] = sharing.get(mesh.devices[name], 0) + 1
    budgets = {}
    for name in mesh.names:
        budget = given.get(name, given.get(None))
        if budget is None and not given_only:
            try:
                free = get_context(mesh.graph_name(name)).free_gmem
                budget = int(free) // sharing[mesh.devices[name]]
            except Exception:   # the device does not tell (OpenCL may not)
                budget = None
        budgets[name] = budget
    return budgets


def plan_layers(calls, owners, mesh, batch_rows, others=()):
    """Plan the layers of ``calls`` (layer-wise LayerCalls; those not
    planned yet) into the process's Plan, making it if there is none.
    ``owners``: {id(state): (state, weight)}, optimizer state counted with
    its weight; ``others``: the function's other shared variables, counted
    where they live (see ``hold``).  Raises PlanError when they do not fit."""
    global _plan
    hold(others, mesh)
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
    budgets, given = budgets_of(mesh), budgets_of(mesh, given_only=True)
    held = held_bytes(mesh)
    for name in mesh.names:   # what earlier plans and others use is not available
        if budgets[name] is not None:
            if given[name] is not None:   # a device's free memory excludes them
                budgets[name] -= held.get(name, 0)
            if _plan is not None:
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
