"""The plans' arithmetic (``graph.planner``, which imports no Theano), in
this process: the sharded plan for any weights and loads (hypothesis):
every weight gets one owner, the busiest context is within one weight of an
even share, and the fit check refuses exactly the plans a context cannot
hold; every context's budget known, or an error naming the context and the
setting; the layer-wise plans keyed by the layer objects, dropped with
them."""
import gc
import weakref

import pytest
from hypothesis import given, settings, strategies as st

from theano_multigpu.errors import ConfigurationError, PlanError
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


# Budgets -----------------------------------------------------------------

TWO_DEVICES = {'dev0': 'opencl0:0', 'dev1': 'opencl0:1'}


def test_a_budget_given_for_one_context_and_none_for_the_other_names_the_other():
    """multigpu.device_memory=dev0->64MiB where dev1's driver reports no
    free memory: an error naming dev1 and the setting, not a budget of
    None (which the fit check used to format, raising TypeError)."""
    with pytest.raises(ConfigurationError) as raised:
        planner.budgets(['dev0', 'dev1'], TWO_DEVICES, {'dev0': 64 << 20}, lambda name: None)
    message = str(raised.value)
    assert 'has none for dev1 (opencl0:1)' in message
    assert 'multigpu.device_memory gives budgets for dev0 only' in message
    assert "multigpu.device_memory, e.g. 'dev1->64MiB'" in message
    assert 'dev0 (' not in message


def test_budgets_come_from_the_setting_else_the_free_memory_shared_on_a_device():
    free = {'dev0': 3000, 'dev1': 3000, 'dev2': 1000}
    devices = {'dev0': 'opencl0:0', 'dev1': 'opencl0:0', 'dev2': 'opencl0:1'}
    assert planner.budgets(['dev0', 'dev1', 'dev2'], devices, {}, free.get) == \
        {'dev0': 1500, 'dev1': 1500, 'dev2': 1000}
    assert planner.budgets(['dev0', 'dev1', 'dev2'], devices, {'dev2': 7, None: 5},
                           lambda name: None) == {'dev0': 5, 'dev1': 5, 'dev2': 7}


def test_no_budget_at_all_names_every_context_and_the_unset_setting():
    with pytest.raises(ConfigurationError) as raised:
        planner.budgets(['dev0', 'dev1'], TWO_DEVICES, {}, lambda name: None)
    message = str(raised.value)
    assert 'has none for dev0 (opencl0:0), dev1 (opencl0:1)' in message
    assert 'multigpu.device_memory is unset' in message


@pytest.mark.parametrize('check', ['layers', 'shards'])
def test_the_fit_checks_refuse_an_unknown_budget_by_name(check):
    """Called with a budget of None, the fit checks name the context
    rather than fail formatting it."""
    needs = [planner.LayerNeeds('a', weights=2048), planner.LayerNeeds('b', weights=2048)]
    budgets = {'dev0': 1024, 'dev1': None}
    with pytest.raises(ConfigurationError, match=r'has none for dev1: .*multigpu.device_memory'):
        if check == 'layers':
            planner.check_fits(needs, {'a': 'dev0', 'b': 'dev1'}, ['dev0', 'dev1'], budgets, 4)
        else:
            planner.check_shards_fit(needs, {'a': 'dev0', 'b': 'dev1'}, ['dev0', 'dev1'],
                                     budgets, {})


# Layer-wise plans, by layer object ----------------------------------------

class Layer(object):
    """A layer as the plans see it: an object, whatever its name."""


def _plan(plans, names, totals, contexts, batch_rows=4):
    layers = dict((name, Layer()) for name in names)
    needs = [planner.LayerNeeds(name, weights=total) for name, total in zip(names, totals)]
    plans.add(planner.Plan(needs, dict(zip(names, contexts)), {}, batch_rows), layers)
    return [layers[name] for name in names]


def test_layers_of_the_same_names_are_planned_anew_and_charged_only_while_alive():
    plans = planner.LayerPlans()
    first = _plan(plans, ['h1', 'h2'], [100, 10], ['dev0', 'dev1'])
    second = [Layer(), Layer()]   # another model, the same layer names
    assert not any(plans.planned(layer) for layer in second)
    assert plans.context_of(second[0]) is None and plans.needs_of(second[0]) is None
    second = _plan(plans, ['h1', 'h2'], [1000, 2000], ['dev1', 'dev0'], batch_rows=8)
    assert [plans.context_of(layer) for layer in first] == ['dev0', 'dev1']
    assert [plans.context_of(layer) for layer in second] == ['dev1', 'dev0']
    assert plans.bytes_on(['dev0', 'dev1']) == {'dev0': 2100, 'dev1': 1010}
    assert plans.latest().batch_rows == 8
    view = plans.plan_for(first + second[:1], 4)
    assert [(n.name, view.contexts[n.name], n.total) for n in view.needs] == \
        [('h1', 'dev0', 100), ('h2', 'dev1', 10), ('h1#2', 'dev1', 1000)]

    gone = weakref.ref(first[0])
    del first
    gc.collect()
    assert gone() is None
    assert plans.bytes_on(['dev0', 'dev1']) == {'dev0': 2000, 'dev1': 1000}
    del second
    gc.collect()
    assert plans.bytes_on(['dev0', 'dev1']) == {'dev0': 0, 'dev1': 0}
    assert plans.latest() is None
