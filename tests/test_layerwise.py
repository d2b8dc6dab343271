"""Layer-wise mode on pocl contexts: layers spread over 2 and 3 contexts
train as one context does, sit where the plan says, and a model too big for
one context's memory budget trains only when spread.

The 1-, 2- and 3-context configurations (3 = two names on one pocl
device) each run tests/children/train_models.py in a child Python, side
by side.
"""
import os

import numpy as np
import pytest

from conftest import CHILDREN, ONE, THREE, TWO, needs_pocl, run_python, train_models

pytestmark = needs_pocl

LAYER = ',multigpu.mode=layer'
CONFIGURATIONS = {1: ONE, 2: TWO + LAYER, 3: THREE + LAYER}
MODELS = ['deep_mlp', 'residual', 'cnn', 'lstm']
STEPS, BATCH = 5, 10
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """{number of contexts: {key: array}} of train_models.py's results."""
    models = dict((n, MODELS) for n in CONFIGURATIONS)
    models[2] = MODELS + ['mlp_dropout']   # a random generator's state
    return train_models(tmp_path_factory.mktemp('layerwise'), CONFIGURATIONS, models,
                        STEPS, BATCH)


CASES = [(n, name) for n in (2, 3) for name in MODELS]


@pytest.mark.parametrize('n,name', CASES)
def test_same_weights_losses_predictions(runs, n, name):
    one, many = runs[1], runs[n]
    keys = sorted(k for k in one if k.startswith(name + '/') and one[k].dtype.kind == 'f')
    assert any('/w' in k for k in keys)
    for key in keys:
        np.testing.assert_allclose(many[key], one[key], rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.mark.parametrize('n,name', CASES)
def test_weights_and_state_sit_where_the_plan_says(runs, n, name):
    """Every weight and optimizer state on its layer's context, read from
    there by the compiled train function; the layers in contiguous groups,
    in context order; heavy ops on the contexts that hold their data (the
    placement check finds nothing)."""
    results = runs[n]
    assert list(results[name + '/placement_errors']) == []
    assert list(results[name + '/misplaced']) == []
    names = ['dev%d' % i for i in range(n)]
    contexts = [c for c in results[name + '/layer_contexts']]
    groups = [c for i, c in enumerate(contexts) if i == 0 or c != contexts[i - 1]]
    assert groups == sorted(groups, key=names.index) and len(set(groups)) == len(groups)
    if name in ('deep_mlp', 'residual'):   # layers of similar size: every context has some
        assert groups == names
    # Heavy ops run only on contexts that hold layers (dev0 is Theano's
    # default context, None), the output layer's softmax on the last.
    graph_names = ['None' if g == 'dev0' else g for g in groups]
    assert set(results[name + '/contexts']) <= set(graph_names)
    assert graph_names[-1] in set(results[name + '/contexts'])


@pytest.mark.parametrize('n,name', CASES + [(2, 'mlp_dropout')])
def test_each_context_holds_what_the_plan_counted(runs, n, name):
    """The train function's shared variables hold, on each context, the
    bytes the plan counted there (weights, optimizer state, and Dropout's
    random generator state, on the master), within 5%."""
    memory = runs[n][name + '/memory']   # [[resident, planned] per context]
    assert memory.shape == (n, 2)
    for context, (resident, planned) in enumerate(memory):
        assert abs(int(resident) - int(planned)) <= 0.05 * max(int(planned), 1), (context, memory)
    if name == 'mlp_dropout':
        assert memory[0, 0] > 360 * 1024, memory   # the generator's state, on dev0


def _deep_mlp(home, flags):
    """Train deep_mlp for one step under ``flags`` (two contexts, layer-wise)."""
    return run_python(home, flags=TWO + LAYER + ',' + flags, check=False, args=[
        os.path.join(CHILDREN, 'train_models.py'), str(home / 'out.npz'), '1', '10',
        'deep_mlp'])


def _needed(stderr):
    """The total bytes the plan error reports the model needs."""
    text = stderr.split('The model needs ')[1].split(' in all')[0]
    number, unit = text.split()
    return float(number) * {'B': 1, 'KiB': 1 << 10, 'MiB': 1 << 20}[unit]


def test_a_model_too_big_for_one_context_trains_only_when_spread(tmp_path):
    """A budget of 75% of what the model needs: the balanced plan fits it on
    two contexts, and so does each context's step at its peak (the plan
    counts weights, state and activations, the peak gradients too: at 60%
    the first step stops before it runs), and it trains; all layers on
    dev0 stops before compiling, and so does a budget of 30%, with the
    bytes needed and available."""
    homes = [tmp_path / name for name in ('probe', 'spread', 'one', 'small', 'peak')]
    for home in homes:
        home.mkdir()
    probe = _deep_mlp(homes[0], 'multigpu.device_memory=1KiB')
    assert probe.returncode != 0
    assert 'layer-wise mode expects each context to hold its layers, but' in probe.stderr
    needed = _needed(probe.stderr)
    assert 50 * 1024 < needed < 70 * 1024   # weights + Adam's 2 states + activations

    budget = 'multigpu.device_memory=%d' % int(0.75 * needed)
    spread = _deep_mlp(homes[1], budget)
    assert spread.returncode == 0, spread.stderr[-3000:]
    contexts = set(np.load(str(homes[1] / 'out.npz'))['deep_mlp/layer_contexts'])
    assert contexts == {'dev0', 'dev1'}

    one = _deep_mlp(homes[2], budget + ',multigpu.layer_map=*->dev0')
    assert one.returncode != 0
    assert 'but dev0 do(es) not fit' in one.stderr
    assert 'dev0: needs ' in one.stderr and 'dev1: needs 0 B, has ' in one.stderr

    small = _deep_mlp(homes[3], 'multigpu.device_memory=%d' % int(0.3 * needed))
    assert small.returncode != 0
    assert 'do(es) not fit' in small.stderr and 'Add contexts' in small.stderr

    peak = _deep_mlp(homes[4], 'multigpu.device_memory=%d' % int(0.6 * needed))
    assert peak.returncode != 0
    assert 'expects each context to hold, at the peak of its step' in peak.stderr, peak.stderr


def test_explicit_layer_map_is_followed_and_checked(home):
    result = run_python(home, flags=TWO + LAYER + ',multigpu.layer_map=a*->dev1;b2->dev0',
                        code='''
        import numpy as np
        from keras.models import Sequential
        from keras.layers import Dense
        from theano_multigpu.config import mesh
        from theano_multigpu.graph import placement, planner, plan as layerwise
        from theano_multigpu.errors import PlanError
        model = Sequential([Dense(4, input_dim=3, name='a1'), Dense(4, name='a2'),
                            Dense(4, name='b1'), Dense(2, name='b2')])
        model.compile(loss='mse', optimizer='sgd')
        model.train_on_batch(np.ones((4, 3), 'float32'), np.ones((4, 2), 'float32'))
        model.predict(np.ones((4, 3), 'float32'))
        print('plan', sorted(layerwise.current_plan().contexts.items()))
        for layer_map in ([('a*', 'dev1'), ('x*', 'dev0')], [('a*', 'dev1'), ('a1', 'dev0')],
                          [('a*', 'gpu7')]):
            try:
                planner.mapped(['a1', 'a2', 'b1', 'b2'], layer_map, ['dev0', 'dev1'], 'dev0')
            except PlanError as error:
                print('error:', error)
        functions = (model.model.train_function, model.model.predict_function)
        print('misplaced', [placement.misplaced(f.function.maker.fgraph, mesh.current())
                            for f in functions])
    ''')
    # Unmatched layers (b1) follow the layer before them.
    assert "plan [('a1', 'dev1'), ('a2', 'dev1'), ('b1', 'dev1'), ('b2', 'dev0')]" \
        in result.stdout
    assert 'misplaced [[], []]' in result.stdout
    assert 'pattern(s) matching no layer: x*' in result.stdout
    assert 'layer(s) matched twice: a1 (by a*, a1)' in result.stdout
    assert "expects contexts taking part (dev0, dev1), but received 'gpu7'" in result.stdout


def test_rewriting_layer_by_layer_copies_nothing(home):
    """The rewrite reads each layer's inputs as the rewritten layers before
    it.  theano.clone copied those graphs once per read: a ten-block
    residual model (the 'residual' runs above) stopped with RecursionError,
    smaller ones took minutes to compile.  ``replaced`` computes what
    theano.clone computes for any small graph (hypothesis), keeps each
    replacement as it is, and a chain rewritten block by block keeps the
    chain's size (theano.clone's grows with the square of its depth)."""
    result = run_python(home, flags='device=cpu',
                        args=[os.path.join(CHILDREN, 'replace_property.py')])
    line = result.stdout.strip().split('\n')[-1]
    assert line.startswith('checked 27 graphs; layer by layer: replaced 48 nodes'), line
