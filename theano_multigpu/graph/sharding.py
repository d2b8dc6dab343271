"""Sharded batch-wise mode: where each weight lives.

Weights are PlacedVariables (``placed``), as in layer-wise mode.  Before a
batch-wise function compiles, the weights it reads that no earlier function
placed are placed, each with its optimizer state (the accumulators its
update alone reads):

- split (``multigpu.shard_split``): a weight of at least that many bytes,
  with at least one row per context, whose state has its shape and whose
  update and its state's can be computed block by block (``blocks``), is cut
  along its first axis into one block of rows per context, in the contexts'
  order, its state at the same rows.  A function that trains nothing (a
  ``predict`` before the ``fit``) splits the trainable weights it reads by
  size and rows alone: their state, placed by the first function that
  trains them, joins their blocks, and an update that cannot use the blocks
  is computed whole on the master (``batchwise._by_block``);
- whole: every other weight is one unit with its state, and the planner
  spreads the units over the contexts to balance bytes, counting what the
  contexts hold already (the blocks, the weights placed before, and every
  other shared variable where it lives: random generators' states, on the
  master).

The batch-wise rewrite then reads each weight gathered from where it lives,
sums each block's gradient on its context and updates it there (but see
above).  The plan
counts what it placed (``plan.planned_bytes``), for the next plan and the
placement report.
"""
import theano

from ..config.flags import parse_split_size
from . import planner
from .blocks import split_updates
from .placed import PlacedVariable, holders, is_placed, optimizer_state_owners, split_cut
from .placement import context_of
from .plan import budgets_of, hold, nbytes, place, place_blocks, planned_bytes
from .rows import slice_bounds

__all__ = ['place_shards', 'weights_to_split']


def _units(weights, owners):
    """[LayerNeeds] of ``weights`` (unplaced), each with its optimizer state
    (``owners``: {id(state): (state, weight)}), and {unit name: [variables]}."""
    state_of = _states_of(owners)
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


def _states_of(owners):
    """{id(weight): [its optimizer state]} of ``owners``."""
    state_of = {}
    for state, weight in owners.values():
        state_of.setdefault(id(weight), []).append(state)
    return state_of


def weights_to_split(weights, owners, updates, stand_ins, contexts, read=()):
    """{id(weight): (weight, [its state])} of those of ``weights`` (unplaced
    weights gradients are taken of, or trainable) that ``multigpu.shard_split`` splits
    over ``contexts`` (a count): at least that many bytes, a row per
    context, state of the weight's shape, and the updates of the weight
    and of its state computable block by block (``blocks.split_updates``
    on the host graph, with those of ``read``, the function's variables,
    that an earlier function split cut at their blocks; ``stand_ins``: the
    gradient stand-ins the updates read)."""
    threshold = parse_split_size(theano.config.multigpu.shard_split)
    if threshold is None or contexts < 2:
        return {}
    state_of = _states_of(owners)
    chosen = dict((id(w), (w, state_of.get(id(w), []))) for w in weights
                  if w.ndim >= 1 and _shape(w)[0] >= contexts and nbytes(w) >= threshold
                  and all(_shape(s) == _shape(w) for s in state_of.get(id(w), [])))
    # A refused weight is read whole by the others' blocks: the second
    # split refuses none (see split_updates); a third pass is a bug.
    before = split_cut(read, stand_ins)
    for _ in range(3):
        cut = dict(before)
        for weight, states in chosen.values():
            bounds = slice_bounds(_shape(weight)[0], contexts)
            cut.update((leaf, bounds) for leaf in [weight] + states)
            cut.update((s, bounds) for s in stand_ins
                       if s.tag.multigpu_gradient.param is weight)
        _, refused = split_updates(updates, cut, lambda leaf, k: leaf.type())
        # (Variables split before are not refused: batchwise._by_block.)
        refused = [v for v in refused if v not in before]
        if not refused:
            return chosen
        for variable in refused:
            for key, (weight, states) in list(chosen.items()):
                if variable is weight or any(variable is s for s in states):
                    del chosen[key]
    raise RuntimeError('the split of the weights refused weights again after those it '
                       'refused were kept whole; please report this with the model')


def place_shards(variables, updates, stand_ins, mesh, trainable=()):
    """Place every unplaced PlacedVariable of ``variables`` (the shared
    variables a function reads or updates): split into blocks, or whole on
    an owner context (see the module docstring).  ``updates`` (pairs) tell
    which optimizer state goes with which weight gradients are taken of
    (the params of ``stand_ins``: a stateful layer's state is not one,
    though its update alone reads the layer's weights).  ``trainable``:
    the weights a later function may train; a function that trains none
    (a model's ``predict`` before its ``fit``) splits them as it would the
    params, their updates unknown yet.  Raises PlanError, before compiling, when a context cannot
    hold its share (with multigpu.device_memory, or what the device
    reports)."""
    placed = [v for v in variables if isinstance(v, PlacedVariable)]
    placed_ids = set(id(v) for v in placed)
    params = _unique([s.tag.multigpu_gradient.param for s in stand_ins], placed_ids)
    owners = optimizer_state_owners(updates, params)
    # What every replica reads: all but the optimizer state, which only its
    # weight's update reads, where the state lives.
    read_by_replicas = [v for v in placed if id(v) not in owners]
    joined = False   # whether state joined a weight placed before (the plan counts it)
    for key, (state, weight) in list(owners.items()):
        if is_placed(state):
            del owners[key]
        elif is_placed(weight):   # it joins its weight, placed before
            _place_with(state, weight, mesh)
            del owners[key]
            joined = True
    hold(variables, mesh)
    candidates = params or _unique(trainable, placed_ids)
    unplaced = [p for p in candidates if not is_placed(p)]
    split = weights_to_split(unplaced, owners, updates, stand_ins, len(mesh.names),
                             list(variables) + params)
    parts, block_needs = _blocks(split.values(), mesh)
    split_ids = set(id(v) for weight, states in split.values() for v in [weight] + states)
    needs, members = _units([v for v in placed if not is_placed(v) and id(v) not in split_ids],
                            owners)
    if not needs and not block_needs and not joined:
        return
    planned = planned_bytes(mesh)
    loads = dict(planned)
    for need, name in block_needs:
        loads[name] = loads.get(name, 0) + need.total
    budgets = budgets_of(mesh)
    # Balanced by the budgets given (multigpu.device_memory), not by the
    # free memory devices report, which moves with every allocation: the
    # same script would place its weights differently from run to run.
    given = budgets_of(mesh, given_only=True)
    contexts = planner.owners_balanced(needs, mesh.names, given, loads)
    contexts.update((need.name, name) for need, name in block_needs)
    # During a step each context holds a copy of every weight the function
    # reads (trained or not) that it does not hold whole: a split weight's
    # copy is the join of all its blocks, its own block included.
    earlier = [(nbytes(h), context_of(h, mesh), p.blocks is not None)
               for p in read_by_replicas if is_placed(p) for h in holders(p)]
    elsewhere = dict((name, sum(n for n, where, split in earlier if split or where != name))
                     for name in mesh.names)
    for need, name in block_needs:
        elsewhere[name] += need.weights
    # A device's free memory excludes what it holds already.
    held = dict((name, planned[name] if given[name] is not None else 0) for name in mesh.names)
    planner.check_shards_fit(needs + [need for need, _ in block_needs], contexts, mesh.names,
                             budgets, held, elsewhere)
    for variable, variable_parts in parts:
        place_blocks(variable, variable_parts, mesh)
    for need in needs:
        for variable in members[need.name]:
            place(variable, contexts[need.name], mesh)
    left = [v for v in placed if not is_placed(v)]
    if left:
        raise RuntimeError('sharded plan left %s unplaced; please report this with the '
                           'model' % ', '.join(str(v) for v in left[:5]))


def _unique(variables, among):
    """``variables`` whose id is in ``among``, each once, in order."""
    found = []
    for variable in variables:
        if id(variable) in among and all(f is not variable for f in found):
            found.append(variable)
    return found


def _blocks(split, mesh):
    """([(variable, [(context name, start, stop)])], [(LayerNeeds of a
    block with its state's, its context name)]) of the ``split`` weights
    ((weight, [state]) pairs): block k of each on the mesh's context k."""
    parts, needs, names = [], [], set()
    for weight, states in split:
        rows = _shape(weight)[0]
        row_bytes = nbytes(weight) // rows
        state_row_bytes = sum(nbytes(s) for s in states) // rows
        bounds = slice_bounds(rows, len(mesh.names))
        weight_parts = [(name, start, stop) for name, (start, stop) in zip(mesh.names, bounds)]
        parts += [(v, weight_parts) for v in [weight] + states]
        label = weight.name or 'weight'
        if label in names:   # the fit check counts each block by its name
            label = '%s#%d' % (label, len(names))
        names.add(label)
        needs += [(planner.LayerNeeds('%s[%d:%d]' % (label, start, stop),
                                      weights=row_bytes * (stop - start),
                                      state=state_row_bytes * (stop - start)), name)
                  for name, start, stop in weight_parts]
    return parts, needs


def _place_with(state, weight, mesh):
    """Place optimizer ``state`` where its ``weight``, placed before, lives:
    at its blocks' rows where the weight is split and the shapes agree,
    else whole on the context of the weight's first holder."""
    if weight.blocks is not None and _shape(state) == _shape(weight):
        place_blocks(state, [(context_of(b.variable, mesh), b.start, b.stop)
                             for b in weight.blocks], mesh)
    else:
        place(state, context_of(holders(weight)[0], mesh), mesh)


def _shape(variable):
    """The shape of a shared variable's whole value, read from its host
    storage (a placed variable's placeholder has it): nothing is copied
    from the contexts."""
    return variable.container.storage[0].shape
