"""Sharded batch-wise mode: which context owns each weight.

Weights are PlacedVariables (``placed``), as in layer-wise mode.  Before a
batch-wise function compiles, the weights it reads that no earlier function
placed get an owner: each weight with its optimizer state (the accumulators
its update alone reads) is one unit, and the planner spreads the units over
the contexts to balance bytes, counting what the contexts hold already (the
weights placed before, and every other shared variable where it lives:
random generators' states, on the master).  The batch-wise rewrite then
reads each weight on its owner, where its gradient is summed and its update
computed.

The plan counts what it placed (``plan.planned_bytes``), for the next plan
and the placement report.
"""
from . import planner
from .placed import PlacedVariable, optimizer_state_owners
from .placement import context_of
from .plan import budgets_of, hold, nbytes, place, planned_bytes

__all__ = ['place_shards']


def _units(weights, owners):
    """[LayerNeeds] of ``weights`` (unplaced), each with its optimizer state
    (``owners``: {id(state): (state, weight)}), and {unit name: [variables]}."""
    state_of = {}
    for state, weight in owners.values():
        state_of.setdefault(id(weight), []).append(state)
    states = set(id(s) for ss in state_of.values() for s in ss)
    needs, members = [], {}
    for weight in weights:
        if id(weight) in states:
            continue
        name = weight.name or 'weight'
        if name in members:
            name = '%s#%d' % (name, len(needs))
        own = state_of.get(id(weight), [])
        needs.append(planner.LayerNeeds(name, weights=nbytes(weight),
                                        state=sum(nbytes(s) for s in own)))
        members[name] = [weight] + own
    return needs, members


def place_shards(variables, updates, params, mesh):
    """Give every unplaced PlacedVariable of ``variables`` (the shared
    variables a function reads or updates) an owner context and place it;
    ``updates`` (pairs) tell which optimizer state goes with which of
    ``params`` (the weights gradients are taken of: a stateful layer's
    state is not one, though its update alone reads the layer's weights).
    Raises PlanError, before compiling, when a context cannot hold its
    share (with multigpu.device_memory, or what the device reports)."""
    placed = [v for v in variables if isinstance(v, PlacedVariable)]
    placed_ids = set(id(v) for v in placed)
    owners = optimizer_state_owners(updates, [p for p in params if id(p) in placed_ids])
    for key, (state, weight) in list(owners.items()):
        if state.placed is not None:
            del owners[key]
        elif weight.placed is not None:   # it joins its weight, placed before
            place(state, context_of(weight.placed, mesh), mesh)
            del owners[key]
    hold(variables, mesh)
    needs, members = _units([v for v in placed if v.placed is None], owners)
    if not needs:
        return
    loads = planned_bytes(mesh)
    budgets = budgets_of(mesh)
    # Balanced by the budgets given (multigpu.device_memory), not by the
    # free memory devices report, which moves with every allocation: the
    # same script would place its weights differently from run to run.
    given = budgets_of(mesh, given_only=True)
    contexts = planner.owners_balanced(needs, mesh.names, given, loads)
    earlier = [(nbytes(p.placed), context_of(p.placed, mesh)) for p in params
               if id(p) in placed_ids and p.placed is not None]
    elsewhere = dict((name, sum(n for n, where in earlier if where != name))
                     for name in mesh.names)
    # A device's free memory excludes what it holds already.
    held = dict((name, loads[name] if given[name] is not None else 0) for name in mesh.names)
    planner.check_shards_fit(needs, contexts, mesh.names, budgets, held, elsewhere)
    for need in needs:
        for variable in members[need.name]:
            place(variable, contexts[need.name], mesh)
    left = [v for v in placed if v.placed is None]
    if left:
        raise RuntimeError('sharded plan left %s unplaced; please report this with the '
                           'model' % ', '.join(str(v) for v in left[:5]))
