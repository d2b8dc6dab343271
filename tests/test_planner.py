"""The sharded plan's arithmetic (``graph.planner``, which imports no
Theano), for any weights and loads (hypothesis): every weight gets one
owner, the busiest context is within one weight of an even share, and the
fit check refuses exactly the plans a context cannot hold."""
import pytest
from hypothesis import given, settings, strategies as st

from theano_multigpu.errors import PlanError
from theano_multigpu.graph import planner

NAMES = ['dev0', 'dev1', 'dev2', 'dev3']

weights = st.lists(st.tuples(st.integers(1, 10 ** 6), st.integers(0, 2 * 10 ** 6)),
                   min_size=1, max_size=30)
contexts = st.integers(2, 4)
loads = st.lists(st.integers(0, 10 ** 6), min_size=4, max_size=4)


def _needs(pairs):
    return [planner.LayerNeeds('w%d' % k, weights=w, state=s) for k, (w, s) in enumerate(pairs)]


@settings(max_examples=200, deadline=None)
@given(weights, contexts, loads)
def test_every_weight_has_an_owner_and_the_busiest_is_within_one_weight_of_even(
        pairs, n, held):
    needs, names = _needs(pairs), NAMES[:n]
    held = dict(zip(names, held))
    owners = planner.owners_balanced(needs, names, {}, held)
    assert sorted(owners) == sorted(need.name for need in needs)
    assert set(owners.values()) <= set(names)
    load = dict(held)
    for need in needs:
        load[owners[need.name]] += need.total
    total = sum(need.total for need in needs) + sum(held.values())
    largest = max(need.total for need in needs)
    assert max(load.values()) <= max(max(held.values()), total / float(n) + largest)


@settings(max_examples=200, deadline=None)
@given(weights, contexts, st.integers(1, 10 ** 7))
def test_the_fit_check_refuses_exactly_what_a_context_cannot_hold(pairs, n, budget):
    """A context holds what it owns, and a copy of every other weight."""
    needs, names = _needs(pairs), NAMES[:n]
    budgets = dict((name, budget) for name in names)
    owners = planner.owners_balanced(needs, names, budgets, {})
    all_weights = sum(need.weights for need in needs)
    asked = dict((name, all_weights + sum(need.state for need in needs
                                          if owners[need.name] == name)) for name in names)
    if max(asked.values()) <= budget:
        planner.check_shards_fit(needs, owners, names, budgets, {})
        return
    with pytest.raises(PlanError) as raised:
        planner.check_shards_fit(needs, owners, names, budgets, {})
    message = str(raised.value)
    assert message.startswith('sharded batch-wise mode expects each context to hold')
    assert all('%s: needs ' % name in message for name in names)
