"""The plans: which context holds each layer (layer-wise), or owns each
weight (sharded batch-wise).

Pure bookkeeping on numbers, without Theano (a contract in .importlinter):
each layer's or weight's needs in bytes (weights, optimizer state,
activations at the batch size), each context's budget, and either the
balanced plan (layers: contiguous groups along the layers' topological
order; weights: any grouping; the largest share of a budget as small as it
can be) or an explicit map by layer-name patterns.
"""
import fnmatch

from ..config.flags import format_bytes
from ..errors import PlanError

__all__ = ['LayerNeeds', 'balanced', 'mapped', 'check_fits', 'owners_balanced',
           'check_shards_fit']


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
    when a context's layers need more than its budget."""
    per_context = dict((name, 0) for name in names)
    for n in needs:
        per_context[plan[n.name]] += n.total
    over = [name for name in names
            if budgets.get(name) is not None and per_context[name] > budgets[name]]
    if not over:
        return
    total = sum(n.total for n in needs)
    largest = max(needs, key=lambda n: n.total)
    lines = ['%s: needs %s, has %s' % (
        name, format_bytes(per_context[name]), format_bytes(budgets[name]))
        for name in names]
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
    owns (weights and their optimizer state) and, during a step, a copy of
    every weight it does not own: those of ``needs``, and
    ``weights_elsewhere`` ({context: bytes of the weights placed before,
    on other contexts, that the function reads}).  Gradients and
    activations are not counted."""
    weights = sum(n.weights for n in needs)
    elsewhere = weights_elsewhere or {}
    per_context = {}
    for name in names:
        owned = [n for n in needs if owners[n.name] == name]
        per_context[name] = (loads.get(name, 0) + sum(n.total for n in owned)
                             + weights - sum(n.weights for n in owned)
                             + elsewhere.get(name, 0))
    over = [name for name in names
            if budgets.get(name) is not None and per_context[name] > budgets[name]]
    if not over:
        return
    largest = max(needs, key=lambda n: n.total)
    lines = ['%s: needs %s, has %s' % (
        name, format_bytes(per_context[name]),
        'an unknown amount' if budgets.get(name) is None else format_bytes(budgets[name]))
        for name in names]
    raise PlanError(
        'sharded batch-wise mode expects each context to hold the weights it owns, '
        'their optimizer state and, during a step, a copy of every other weight, '
        'but %s do(es) not fit. The new weights need %s (weights %s, optimizer '
        'state %s; the largest weight, %s, %s with its state), the contexts hold %s '
        'already (random generators\' states, weights placed before); gradients and '
        'activations are not counted.  The plan asks:\n  %s\n'
        'Add contexts, or raise multigpu.device_memory if the devices have more '
        'memory than it says.'
        % (', '.join(over), format_bytes(weights + sum(n.state for n in needs)),
           format_bytes(weights), format_bytes(sum(n.state for n in needs)),
           largest.name, format_bytes(largest.total), format_bytes(sum(loads.values())),
           '\n  '.join(lines)))
