"""The plans: which context holds each layer (layer-wise), or owns each
weight (sharded batch-wise).

Pure bookkeeping on numbers, without Theano (a contract in .importlinter):
each layer's or weight's needs in bytes (weights, optimizer state,
activations at the batch size), each context's budget, and either the
balanced plan (layers: contiguous groups along the layers' topological
order; weights: any grouping; the largest share of a budget as small as it
can be) or an explicit map by layer-name patterns; and the layer-wise plans
of the layers alive (``LayerPlans``), keyed by the layer objects.
"""
import fnmatch
import weakref

from ..config.flags import format_bytes
from ..errors import ConfigurationError, PlanError

__all__ = ['LayerNeeds', 'Plan', 'LayerPlans', 'budgets', 'balanced', 'mapped',
           'check_fits', 'owners_balanced', 'check_shards_fit']


class LayerNeeds(object):
    """Bytes one layer (or one weight, sharded) needs on its context."""

    def __init__(self, name, weights=0, state=0, activations=0):
        self.name = name
        self.weights = weights
        self.state = state
        self.activations = activations

    @property
    def total(self):
        return self.weights + self.state + self.activations

    def __repr__(self):
        return 'LayerNeeds(%r, weights=%d, state=%d, activations=%d)' % (
            self.name, self.weights, self.state, self.activations)


class Plan(object):
    """Where the layers of one plan live, and what the planner counted."""

    def __init__(self, needs, contexts, budgets, batch_rows):
        self.needs = needs              # [LayerNeeds] in topological order
        self.contexts = contexts        # {LayerNeeds name: context name}
        self.budgets = budgets          # {context name: bytes}
        self.batch_rows = batch_rows

    def needs_on(self, name):
        """The LayerNeeds of the layers on context ``name``."""
        return [n for n in self.needs if self.contexts[n.name] == name]


class LayerPlans(object):
    """The plans of the layers alive: each layer's Plan and LayerNeeds,
    keyed by the layer object, held weakly, so that a layer's entry goes
    with it.  A layer is planned once; another layer of the same name is
    another layer."""

    def __init__(self):
        self._of = weakref.WeakKeyDictionary()   # {layer: (Plan, LayerNeeds)}
        self._latest = None                      # weakref to the latest Plan

    def add(self, plan, layers):
        """Record ``plan`` for ``layers`` ({LayerNeeds name: layer object})."""
        by_name = dict((n.name, n) for n in plan.needs)
        for name, layer in layers.items():
            self._of[layer] = (plan, by_name[name])
        self._latest = weakref.ref(plan)

    def planned(self, layer):
        return layer in self._of

    def context_of(self, layer):
        """The context of ``layer``, or None where no plan has it."""
        if layer not in self._of:
            return None
        plan, needs = self._of[layer]
        return plan.contexts[needs.name]

    def needs_of(self, layer):
        """The LayerNeeds counted for ``layer``, or None."""
        return self._of[layer][1] if layer in self._of else None

    def bytes_on(self, names):
        """{context name: bytes the plans count there for the layers
        alive}."""
        found = dict((name, 0) for name in names)
        for plan, needs in list(self._of.values()):
            where = plan.contexts[needs.name]
            found[where] = found.get(where, 0) + needs.total
        return found

    def latest(self):
        """The Plan made last, while one of its layers is alive, or None."""
        plan = self._latest() if self._latest is not None else None
        if plan is not None and any(p is plan for p, _ in list(self._of.values())):
            return plan
        return None

    def plan_for(self, layers, batch_rows):
        """A Plan of ``layers`` (planned, from one plan or several, in the
        order given), e.g. those one function computes."""
        needs, contexts, seen = [], {}, set()
        for layer in layers:
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            plan, need = self._of[layer]
            name = need.name if need.name not in contexts else '%s#%d' % (need.name, len(needs))
            needs.append(LayerNeeds(name, need.weights, need.state, need.activations))
            contexts[name] = plan.contexts[need.name]
        return Plan(needs, contexts, None, batch_rows)


def _missing_budgets(missing, given, devices=None):
    """ConfigurationError naming the contexts without a budget (``missing``)
    and the setting that gives one."""
    where = ', '.join('%s (%s)' % (name, devices[name]) if devices else name
                      for name in missing)
    if given:
        gave = 'multigpu.device_memory gives budgets for %s only' % ', '.join(
            sorted('every context' if name is None else name for name in given))
    else:
        gave = 'multigpu.device_memory is unset'
    example = ';'.join('%s->64MiB' % name for name in missing)
    return ConfigurationError(
        'the plan expects a memory budget for every context, but has none for %s: '
        'the device\'s driver reports no free memory and %s. Set '
        "multigpu.device_memory, e.g. '%s', or '64MiB' for every context"
        % (where, gave, example))


def budgets(names, devices, given, free_memory):
    """{context name: bytes the plan may use}: from ``given`` (multigpu.
    device_memory parsed: {name or None (every context): bytes}), else the
    free memory of its device (``free_memory(name)``: bytes, or None where
    the driver has no figure) shared evenly by the names on that device
    (``devices``: {name: device}).  Raises ConfigurationError naming the
    contexts left without a budget."""
    sharing = {}
    for name in names:
        sharing[devices[name]] = sharing.get(devices[name], 0) + 1
    found, missing = {}, []
    for name in names:
        budget = given.get(name, given.get(None))
        if budget is None:
            free = free_memory(name)
            if free is None:
                missing.append(name)
                continue
            budget = int(free) // sharing[devices[name]]
        found[name] = budget
    if missing:
        raise _missing_budgets(missing, given, devices)
    return found


def _over_budgets(names, per_context, budgets):
    """(the contexts whose ``per_context`` bytes exceed their budget, a line
    per context with the bytes needed and available).  Raises
    ConfigurationError where a context has no budget."""
    missing = [name for name in names if budgets.get(name) is None]
    if missing:
        raise _missing_budgets(missing, {})
    over = [name for name in names if per_context[name] > budgets[name]]
    lines = ['%s: needs %s, has %s' % (
        name, format_bytes(per_context[name]), format_bytes(budgets[name])) for name in names]
    return over, lines


def _shares(budgets, names):
    """Each context's budget as a weight for balancing (equal when one is
    unknown)."""
    if any(budgets.get(name) is None for name in names):
        return [1.0] * len(names)
    return [float(max(1, budgets[name])) for name in names]


def _greedy(totals, capacities):
    """Context index per layer, filling each context up to its capacity in
    order, or None when the layers do not fit."""
    assignment, context, load = [], 0, 0
    for need in totals:
        while load + need > capacities[context]:
            context, load = context + 1, 0
            if context == len(capacities):
                return None
        assignment.append(context)
        load += need
    return assignment


def balanced(needs, names, budgets):
    """{layer name: context name}: contiguous groups in ``names`` order,
    minimising the largest share of a context's budget (``budgets``: bytes
    per name, or None for unknown: then the contexts count as equal)."""
    totals = [n.total for n in needs]
    weights = _shares(budgets, names)
    low, high = 0.0, float(sum(totals)) / weights[0] + 1.0
    for _ in range(64):
        middle = (low + high) / 2
        if _greedy(totals, [middle * w for w in weights]) is None:
            low = middle
        else:
            high = middle
    assignment = _greedy(totals, [high * w for w in weights])
    return dict((n.name, names[i]) for n, i in zip(needs, assignment))


def mapped(layer_names, layer_map, names, default):
    """{layer name: context name} from ``layer_map`` ([(pattern, context)]).

    A layer no pattern matches goes where the layer before it went (the
    first ones to ``default``).  Raises PlanError for a pattern that matches
    no layer, a layer two patterns match, or a context not taking part.
    """
    for pattern, name in layer_map:
        if name not in names:
            raise PlanError(
                'multigpu.layer_map expects contexts taking part (%s), but '
                'received %r in %r; use one of those names'
                % (', '.join(names), name, '%s->%s' % (pattern, name)))
    unused = [p for p, _ in layer_map
              if not any(fnmatch.fnmatchcase(layer, p) for layer in layer_names)]
    twice = []
    plan, previous = {}, default
    for layer in layer_names:
        matches = [(p, n) for p, n in layer_map if fnmatch.fnmatchcase(layer, p)]
        if len(matches) > 1:
            twice.append('%s (by %s)' % (layer, ', '.join(p for p, _ in matches)))
        previous = matches[0][1] if matches else previous
        plan[layer] = previous
    problems = []
    if unused:
        problems.append('pattern(s) matching no layer: %s' % ', '.join(unused))
    if twice:
        problems.append('layer(s) matched twice: %s' % '; '.join(twice))
    if problems:
        raise PlanError(
            'multigpu.layer_map expects each pattern to match a layer and each '
            'layer to match at most one pattern, but has %s. The model\'s layers '
            'are: %s' % ('; '.join(problems), ', '.join(layer_names)))
    return plan


def check_fits(needs, plan, names, budgets, batch_rows):
    """Raise PlanError, with the bytes needed and available per context,
    when a context's layers need more than its budget (ConfigurationError
    where a context has no budget)."""
    per_context = dict((name, 0) for name in names)
    for n in needs:
        per_context[plan[n.name]] += n.total
    over, lines = _over_budgets(names, per_context, budgets)
    if not over:
        return
    total = sum(n.total for n in needs)
    largest = max(needs, key=lambda n: n.total)
    raise PlanError(
        'layer-wise mode expects each context to hold its layers, but %s '
        'do(es) not fit. The model needs %s in all (weights %s, optimizer state %s, '
        'activations %s at batch %d; the largest layer, %s, %s), and the plan asks:\n  %s\n'
        'Add contexts, use a smaller batch, or raise multigpu.device_memory if the '
        'devices have more memory than it says.'
        % (', '.join(over), format_bytes(total), format_bytes(sum(n.weights for n in needs)),
           format_bytes(sum(n.state for n in needs)),
           format_bytes(sum(n.activations for n in needs)), batch_rows, largest.name,
           format_bytes(largest.total), '\n  '.join(lines)))


def owners_balanced(needs, names, budgets, loads):
    """{weight name: context name}: the largest first, each to the context
    whose share of its budget is then the smallest (``loads``: bytes each
    context holds already, e.g. random generator states or weights an
    earlier plan placed)."""
    shares = _shares(budgets, names)
    load = [float(loads.get(name, 0)) for name in names]
    owners = {}
    for need in sorted(needs, key=lambda n: -n.total):
        best = min(range(len(names)), key=lambda i: ((load[i] + need.total) / shares[i], i))
        load[best] += need.total
        owners[need.name] = names[best]
    return owners


def check_shards_fit(needs, owners, names, budgets, loads, weights_elsewhere=None):
    """Raise PlanError, with the bytes needed and available per context,
    when a context cannot hold what it holds already (``loads``), what it
    owns (weights and their optimizer state, or blocks of split weights with
    theirs) and, during a step, a copy of every weight of ``needs`` it does
    not own, and ``weights_elsewhere`` ({context: bytes of the other copies
    it holds during a step: weights placed before on other contexts, and
    every block of a split weight, its own included, whose join is a whole
    copy}).  Gradients and activations are not counted.  ConfigurationError
    where a context has no budget."""
    weights = sum(n.weights for n in needs)
    elsewhere = weights_elsewhere or {}
    per_context = {}
    for name in names:
        owned = [n for n in needs if owners[n.name] == name]
        per_context[name] = (loads.get(name, 0) + sum(n.total for n in owned)
                             + weights - sum(n.weights for n in owned)
                             + elsewhere.get(name, 0))
    over, lines = _over_budgets(names, per_context, budgets)
    if not over:
        return
    largest = ''
    if needs:
        unit = max(needs, key=lambda n: n.total)
        largest = '; the largest unit, %s, %s with its state' % (unit.name,
                                                                 format_bytes(unit.total))
    raise PlanError(
        'sharded batch-wise mode expects each context to hold the weights it owns '
        '(or its blocks of split weights), their optimizer state and, during a step, '
        'a copy of every weight it does not hold whole, but %s do(es) not fit. The new '
        'weights need %s (weights %s, optimizer state %s%s), the contexts hold %s already '
        '(random generators\' states, weights placed before with their state); gradients '
        'and activations are not counted.  The plan asks:\n  %s\n'
        'Add contexts, split more weights (a lower multigpu.shard_split), or raise '
        'multigpu.device_memory if the devices have more memory than it says.'
        % (', '.join(over), format_bytes(weights + sum(n.state for n in needs)),
           format_bytes(weights), format_bytes(sum(n.state for n in needs)),
           largest, format_bytes(sum(loads.values())), '\n  '.join(lines)))
