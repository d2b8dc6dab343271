"""The layer-wise plans: which context holds each layer, planned by the
first call of the first function that computes it, and kept while the
layer lives (``planner.LayerPlans``, keyed by the layer objects).

The numbers (each layer's bytes, each context's budget, and the shared
variables no plan places, such as random generators' states, where they
live) are counted here; ``planner`` decides from them.  What the plans
counted is the session's (``Plans``, a part of ``config.session``).
"""
import gc
import weakref

import numpy as np
import theano
from theano.gpuarray.type import GpuArrayType, get_context

from ..config.devices import free_memory
from ..config.flags import parse_device_memory, parse_layer_map
from ..config.session import current_session
from . import planner
from .placed import is_placed
from .placement import context_of

__all__ = ['Plans', 'plans', 'current_plan', 'layer_context', 'layer_needs', 'plan_layers',
           'function_plan', 'budgets_of', 'hold', 'place', 'place_blocks', 'held_bytes',
           'planned_bytes', 'nbytes']


class Plans(object):
    """A session's plans: ``layers``, the layer-wise plans of the layers
    alive; and {GPU shared variable: context name}, held weakly:
    ``held``, those on a context that no plan places (random generators'
    states, which Theano makes on its default context), counted where they
    live; ``placed``, the copies of the weights and optimizer state the
    plans placed."""

    def __init__(self):
        self.layers = planner.LayerPlans()
        self.held = weakref.WeakKeyDictionary()
        self.placed = weakref.WeakKeyDictionary()


def plans():
    """This session's Plans."""
    return current_session().part(Plans)


def nbytes(variable):
    """The bytes of a shared variable's value (a GPU array's, not copied)."""
    value = variable.get_value(borrow=True, return_internal_type=True)
    return int(getattr(value, 'size', 0)) * value.dtype.itemsize


def hold(variables, mesh):
    """Count those of ``variables`` that are shared variables on a context
    (GPU arrays) where they live, unless a plan placed them."""
    counted = plans()
    for variable in variables:
        if (isinstance(getattr(variable, 'type', None), GpuArrayType)
                and hasattr(variable, 'get_value') and variable not in counted.placed):
            counted.held[variable] = context_of(variable, mesh)


def place(variable, name, mesh):
    """Place PlacedVariable ``variable`` on context ``name``, and count it."""
    variable.place(mesh.graph_name(name))
    plans().placed[variable.placed] = name


def place_blocks(variable, parts, mesh):
    """Split PlacedVariable ``variable`` into blocks of rows, ``parts``:
    [(context name, start, stop)], and count each block where it lives."""
    variable.place_blocks([(mesh.graph_name(name), start, stop) for name, start, stop in parts])
    for (name, _, _), block in zip(parts, variable.blocks):
        plans().placed[block.variable] = name


def _bytes_by_context(where, mesh, variables):
    found = dict((name, 0) for name in mesh.names)
    chosen = None if variables is None else set(id(v) for v in variables)
    for variable, name in list(where.items()):
        if chosen is None or id(variable) in chosen:
            found[name] = found.get(name, 0) + nbytes(variable)
    return found


def _collect_if_all(variables):
    """Before counting all the session holds: a dead model's weights and
    layers, waiting for Python's cycle collector, would otherwise count or
    not depending on when it last ran, and the same script would place its
    weights differently from run to run."""
    if variables is None:
        gc.collect()


def held_bytes(mesh):
    """{context name: bytes of what ``hold`` counted there}."""
    _collect_if_all(None)
    return _bytes_by_context(plans().held, mesh, None)


def planned_bytes(mesh, variables=None):
    """{context name: bytes the plans put there for good}: the weights and
    optimizer state they placed and what ``hold`` counted, all of them or
    those among ``variables`` (e.g. what a compiled function reads)."""
    _collect_if_all(variables)
    counted = plans()
    found = _bytes_by_context(counted.placed, mesh, variables)
    for name, n in _bytes_by_context(counted.held, mesh, variables).items():
        found[name] = found.get(name, 0) + n
    return found


def current_plan():
    """The Plan made last while one of its layers lives, or None."""
    return plans().layers.latest()


def layer_context(layer):
    """The context name of ``layer`` (a Keras layer, as LayerCall.layer),
    or None where no plan has it."""
    return plans().layers.context_of(layer)


def layer_needs(layer):
    """The planner.LayerNeeds counted for ``layer``, or None."""
    return plans().layers.needs_of(layer)


def function_plan(calls, batch_rows):
    """A planner.Plan of the layers of ``calls`` (LayerCalls, planned),
    e.g. those one function computes, for its report."""
    return plans().layers.plan_for([c.layer for c in calls], batch_rows)


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
    """{context name: bytes the plan may use}: from multigpu.device_memory,
    else the device's free memory (which excludes what is allocated
    already) shared by the names on the device.  ConfigurationError
    (``planner.budgets``) names a context with neither.  With
    ``given_only``: {context name: bytes, or None} from
    multigpu.device_memory alone."""
    given = parse_device_memory(theano.config.multigpu.device_memory)
    if given_only:
        return dict((name, given.get(name, given.get(None))) for name in mesh.names)
    return planner.budgets(mesh.names, mesh.devices, given,
                           lambda name: free_memory(get_context(mesh.graph_name(name))))


def _units(new):
    """[LayerNeeds] of the layers of ``new`` (LayerCalls of layers not
    planned), in order, and {LayerNeeds name: layer}: one unit per layer
    object (a layer called twice is one), named by the layer, and by
    ``name#k`` where another layer of the plan has its name."""
    by_layer, order, layers = {}, [], {}
    for call in new:
        if id(call.layer) not in by_layer:
            name = call.name
            if name in layers:
                name = '%s#%d' % (name, len(order))
            by_layer[id(call.layer)] = planner.LayerNeeds(name)
            order.append(by_layer[id(call.layer)])
            layers[name] = call.layer
    return by_layer, order, layers


def plan_layers(calls, owners, mesh, batch_rows, others=()):
    """Plan the layers of ``calls`` (layer-wise LayerCalls) that no plan
    has, as a Plan of their own.  Each context's budget is charged with the
    layers alive that earlier plans put there.  ``owners``: {id(state):
    (state, weight)}, optimizer state counted with its weight; ``others``:
    the function's other shared variables, counted where they live (see
    ``hold``).  Raises PlanError when they do not fit."""
    counted = plans()
    hold(others, mesh)
    new = [c for c in calls if not counted.layers.planned(c.layer)]
    if not new:
        return
    by_layer, order, layers = _units(new)
    for call in new:
        by_layer[id(call.layer)].activations += _activation_bytes(call, batch_rows)
    claimed = {}
    for call in new:
        for variable in call.variables:
            if id(variable) not in claimed and not is_placed(variable):
                claimed[id(variable)] = by_layer[id(call.layer)]
                claimed[id(variable)].weights += variable.nbytes
    for state, weight in owners.values():
        if id(state) not in claimed and id(weight) in claimed and not is_placed(state):
            claimed[id(weight)].state += state.nbytes
    budgets, given = budgets_of(mesh), budgets_of(mesh, given_only=True)
    held = held_bytes(mesh)   # collects the dead layers, for ``bytes_on``
    alive = counted.layers.bytes_on(mesh.names)
    for name in mesh.names:   # what other layers and variables use is not available
        if given[name] is not None:   # a device's free memory excludes them
            budgets[name] -= held.get(name, 0)
        budgets[name] -= alive.get(name, 0)
    layer_map = parse_layer_map(theano.config.multigpu.layer_map)
    if layer_map:
        contexts = planner.mapped([n.name for n in order], layer_map, mesh.names, mesh.names[0])
    else:
        contexts = planner.balanced(order, mesh.names, budgets)
    planner.check_fits(order, contexts, mesh.names, budgets, batch_rows)
    counted.layers.add(planner.Plan(order, contexts, budgets, batch_rows), layers)
