"""Updates of a weight cut into blocks of rows (graph/blocks.py): each
block's new value, built from that block of the weight, its gradient and
its optimizer state, is the rows of the whole new value, and reads other
blocks only through the partial reductions of a value reduced over the rows
(a global gradient norm, column norms).

Keras 1.2.2's optimizers (SGD with momentum, Nesterov and decay, RMSprop,
Adagrad, Adadelta, Adam, Adamax, Nadam; clipnorm and clipvalue) and
constraints (maxnorm over either axis, nonneg, unitnorm) update a 7 x 3
weight whose gradient is an input, as the shim's gradient stand-ins are;
a few hand-written updates reduce over the first axis with max,
min and product, or slice an operand that reads no cut leaf.  The rows are
cut 4/3, 2/2/2/1 and at random bounds.  Two weights of 7 and 5 rows, each
cut at its own bounds, share clipnorm's global norm; one split over many
weights builds that norm once (the node count grows with the weights, not
their square).  Updates that read rows across the first axis, or mix leaves
cut at different bounds, are refused, naming the op.

Theano reads its flags once, at import: this file runs itself as a child
Python on the CPU (plain Keras with the compatibility fixes), which builds
and evaluates the graphs with Theano's Python linker and prints what the
tests check.
"""
import json
import os
import sys

import numpy as np
import pytest

from conftest import run_python

ROWS, COLUMNS = 7, 3
BOUNDS = {'4/3': [(0, 4), (4, 7)], '2/2/2/1': [(0, 2), (2, 4), (4, 6), (6, 7)]}
RANDOM_BOUNDS = 12
LONG_CHAIN = 1500
# Two weights of 7 and 5 rows, each cut at its own bounds into as many blocks.
TWO_ROWS = (7, 5)
TWO_BOUNDS = {'4/3 and 3/2': ([(0, 4), (4, 7)], [(0, 3), (3, 5)]),
              '2/2/2/1 and 2/1/1/1': ([(0, 2), (2, 4), (4, 6), (6, 7)],
                                      [(0, 2), (2, 3), (3, 4), (4, 5)])}
TWO_CASES = {'sgd_momentum_clipnorm': ('SGD', dict(lr=0.1, momentum=0.9, clipnorm=1.0), None),
             'adam_clipnorm': ('Adam', dict(lr=0.01, clipnorm=0.5), None)}
# The cut leaves each case updates per weight: the weight and its state.
TWO_UPDATED = {'sgd_momentum_clipnorm': 2, 'adam_clipnorm': 3}
# Weights in the node count, of 2 to 6 rows cut in two blocks each, updated by
# SGD with momentum and clipnorm; the nodes of all the blocks' graphs are at
# most NODES_PER_BLOCK times those of the whole updates per block.  Measured
# with 100 weights: 1602 nodes of the whole updates, 2602 of one split over
# all the weights (0.8 per block), 8049 of a split per weight (2.5 per block,
# growing with the number of weights: each rebuilds the norm's chain).
MANY_WEIGHTS = 100
NODES_PER_BLOCK = 1.5
# Keras optimizer, its arguments, the constraint on W (a Keras name and arguments).
KERAS_CASES = {
    'sgd_nesterov_decay_nonneg': ('SGD', dict(lr=0.1, momentum=0.9, nesterov=True, decay=0.01),
                                  ('nonneg', {})),
    'sgd_momentum_clipnorm': ('SGD', dict(lr=0.1, momentum=0.5, clipnorm=1.0), None),
    'rmsprop_clipnorm_maxnorm': ('RMSprop', dict(lr=0.01, clipnorm=1.0), ('maxnorm', dict(m=2))),
    'adagrad_clipvalue_unitnorm': ('Adagrad', dict(lr=0.1, clipvalue=0.5), ('unitnorm', {})),
    'adadelta_maxnorm_axis1': ('Adadelta', {}, ('maxnorm', dict(m=1.5, axis=1))),
    'adam_clipnorm_clipvalue_maxnorm': ('Adam', dict(lr=0.01, clipnorm=1.0, clipvalue=0.3),
                                        ('maxnorm', dict(m=1.5))),
    'adamax_unitnorm_axis1': ('Adamax', dict(lr=0.01), ('unitnorm', dict(axis=1))),
    'nadam_clipnorm': ('Nadam', dict(lr=0.01, clipnorm=0.5), None),
}
HAND_CASES = ['max_over_rows', 'min_over_rows', 'product_over_rows', 'sliced_operand',
              'sum_over_a_kept_row', 'product_over_a_kept_row']
# The cases whose new rows read only the same rows: no clipnorm, no norm over the first axis.
ROW_LOCAL = {'sgd_nesterov_decay_nonneg', 'adadelta_maxnorm_axis1', 'adamax_unitnorm_axis1',
             'sliced_operand'}
# Updates of W that read rows across the first axis, and the op each error names.
REFUSED = {'dot': 'dot (Dot)', 'transpose': 'InplaceDimShuffle{1,0} (DimShuffle)',
           'reshape': 'Reshape{2} (Reshape)', 'reversed': 'Subtensor{::int64} (Subtensor)',
           'sort': 'SortOp{quicksort, None} (SortOp)',
           'all_rows_in_one': 'InplaceDimShuffle{x,0,1} (DimShuffle)',
           'mean_op': 'Mean{0} (Mean)',
           'leaves_at_different_bounds': 'Elemwise{sub,no_inplace} (Elemwise)',
           'a_leaf_at_other_bounds': 'Elemwise{mul,no_inplace} (Elemwise)'}
# The refusals of leaves cut at bounds other than W's name both leaves and their bounds.
MIXED = {'leaves_at_different_bounds': ('W, cut at [(0, 4), (4, 7)]',
                                        'V, cut at [(0, 3), (3, 7)]'),
         'a_leaf_at_other_bounds': ('cut at [(0, 4), (4, 7)] (those of W)',
                                    'V, cut at [(0, 3), (3, 7)]')}


@pytest.fixture(scope='module')
def checked(tmp_path_factory):
    home = tmp_path_factory.mktemp('blocks')
    result = run_python(home, flags='device=cpu', backend='theano',
                        extra_env={'THEANO_MULTIGPU_COMPAT': '1'},
                        args=[os.path.abspath(__file__)], timeout=600)
    return json.loads(result.stdout.strip().split('\n')[-1])


@pytest.mark.parametrize('bounds', sorted(BOUNDS))
@pytest.mark.parametrize('case', sorted(KERAS_CASES) + HAND_CASES)
def test_each_block_of_an_update_is_the_rows_of_the_whole_update(checked, case, bounds):
    found = checked['cases'][case][bounds]
    assert found['finite'], found
    assert found['same_rows'], found
    assert found['reads_no_cut_leaf'], found
    # A block reads other blocks only for a value reduced over the rows
    # (a global norm, column norms), from the blocks' partial reductions.
    assert found['reads_own_block_only'] == (case in ROW_LOCAL), found


def test_clipping_and_constraints_were_active(checked):
    """The comparisons mean something: clipnorm and maxnorm changed the
    update (the whole values differ from those without them)."""
    assert checked['clipnorm_clips'] and checked['maxnorm_scales'], checked


def test_a_norm_over_more_weights_than_the_recursion_limit_is_split(checked):
    found = checked['long_chain']
    assert LONG_CHAIN > found['recursion_limit'], found
    assert found == dict(found, blocks=len(BOUNDS['2/2/2/1']), reads_no_cut_leaf=True)


def test_any_bounds_give_the_rows_of_the_whole_update(checked):
    draws = checked['random']
    assert len(draws) == RANDOM_BOUNDS
    assert {len(d['bounds']) for d in draws} >= {1, ROWS}, draws   # one block, one row each
    for draw in draws:
        assert draw['finite'] and draw['same_rows'] and draw['reads_no_cut_leaf'], draw


@pytest.mark.parametrize('bounds', sorted(TWO_BOUNDS))
@pytest.mark.parametrize('case', sorted(TWO_CASES))
def test_weights_cut_at_their_own_bounds_share_one_clipnorm(checked, case, bounds):
    """A 7-row and a 5-row weight, split together: each block of each
    update is the rows of the whole one, at that weight's bounds, and reads
    its own block of every leaf (the norm: each leaf's blocks' partials)."""
    found = checked['two_weights'][case][bounds]
    assert found['finite'] and found['same_rows'] and found['reads_no_cut_leaf'], found
    assert found['blocks'] == TWO_UPDATED[case] * len(TWO_ROWS) * len(TWO_BOUNDS[bounds][0])
    assert found['clipnorm_clips'], found


def test_a_norm_shared_by_many_weights_is_built_once(checked):
    """One split over every weight: the nodes of all the blocks grow with
    the whole update graph, not with its square as a split per weight does."""
    found = checked['node_counts']
    bound = NODES_PER_BLOCK * found['blocks'] * found['whole']
    assert found['one_split'] <= bound < found['split_per_weight'], found
    assert found['reads_no_cut_leaf'], found


def test_a_refused_weight_leaves_the_others_split_and_a_second_split_refuses_none(checked):
    """split_updates refuses per weight: W still splits when V's update
    cannot, and with V's leaves read whole W's blocks are exact."""
    found = checked['one_refused']
    assert found['first_refused'] == ['V'] and found['names_weight'], found
    assert found['first_split'] == ['W'], found
    assert found['same_rows'] and found['reads_no_cut_leaf'] and found['blocks'] == 2, found


@pytest.mark.parametrize('name', sorted(MIXED))
def test_leaves_cut_at_different_bounds_meeting_in_an_update_are_refused(checked, name):
    message = checked['refused'][name]
    assert all(leaf_and_bounds in message for leaf_and_bounds in MIXED[name]), message


def test_malformed_bounds_are_refused_before_anything_is_built(checked):
    found = checked['bad_bounds']
    expected = {'gap': 'a gap', 'overlap': 'an overlap', 'empty': 'is empty',
                'fractional': 'pairs of whole rows', 'late start': 'starts at row 1, not 0'}
    for case, words in expected.items():
        assert found[case].startswith('Blocks expects each cut leaf'), found
        assert words in found[case], found


@pytest.mark.parametrize('name', sorted(REFUSED))
def test_an_update_that_reads_rows_across_the_first_axis_is_refused_naming_the_op(checked,
                                                                                   name):
    message = checked['refused'][name]
    assert message.startswith('the update of W cannot be computed block by block'), message
    assert 'received %s' % REFUSED[name] in message, message   # the op and its class
    assert 'Keep this weight whole' in message, message


# --- The child: run as a script on the CPU ------------------------------------------


def _gradient_input():
    """An op whose output, a loss, has the gradient with respect to its first
    input given by its second: Keras's ``K.gradients`` then returns that
    input itself, a leaf, as the shim's gradient stand-ins are."""
    import theano
    import theano.tensor as T

    class GivenGradient(theano.Op):
        __props__ = ()

        def make_node(self, weight, gradient):
            return theano.Apply(self, [weight, gradient], [T.scalar(dtype=weight.dtype)])

        def perform(self, node, inputs, outputs):
            outputs[0][0] = np.zeros((), node.outputs[0].dtype)

        def grad(self, inputs, output_gradients):
            return [inputs[1], T.zeros_like(inputs[1])]

    return GivenGradient()


def _keras_update(case, rng, rows=(ROWS,)):
    """(updates, [cut leaves of each weight], [G of each weight]): Keras's
    update pairs of weights of ``rows`` x 3 whose gradients are the inputs G,
    for a ``case`` of KERAS_CASES (the constraint on the first weight); the
    cut leaves of a weight are the weight, its optimizer state of its shape
    (each given random values) and its G (the shim gives each block a
    gradient stand-in of its own)."""
    import theano.tensor as T
    import keras.backend as K
    from keras import constraints, optimizers
    optimizer_name, arguments, constraint = case
    weights = [K.variable(rng.randn(r, COLUMNS) * 1.5, name='W' if i == 0 else 'W%d' % i)
               for i, r in enumerate(rows)]
    grads = [T.matrix('G' if i == 0 else 'G%d' % i) for i in range(len(rows))]
    given = _gradient_input()
    loss = sum([given(W, G) for W, G in zip(weights, grads)])
    assert all(g is G for g, G in zip(K.gradients(loss, weights), grads))
    optimizer = getattr(optimizers, optimizer_name)(**arguments)
    constraint = {weights[0]: constraints.get(*constraint)} if constraint else {}
    updates = optimizer.get_updates(weights, constraint, loss)
    state = [w for w in optimizer.weights if w.ndim == 2]   # Keras: per kind, in weights' order
    for s, r in zip(state, list(rows) * 2):   # accumulators of squares must stay >= 0
        s.set_value(np.abs(rng.randn(r, COLUMNS)).astype(s.dtype) * 0.1)
    if optimizer.weights and optimizer.weights[0].ndim == 0:
        optimizer.weights[0].set_value(np.asarray(3, optimizer.weights[0].dtype))
    leaves = [[W] + state[i::len(rows)] + [G] for i, (W, G) in enumerate(zip(weights, grads))]
    return updates, leaves, grads


def _hand_update(name, rng):
    """Updates written with Theano: reductions over the first axis that
    combine block partials, and an operand that reads no cut leaf (G is not
    cut here, each block reads its rows)."""
    import theano
    import theano.tensor as T
    W = theano.shared(rng.randn(ROWS, COLUMNS).astype('float32'), name='W')
    G = T.matrix('G')
    if name == 'max_over_rows':
        new = W / T.max(abs(W + G), axis=0, keepdims=True)
    elif name == 'min_over_rows':
        new = W - T.min(W * G, axis=[0, 1]) * G
    elif name == 'product_over_rows':
        new = W * T.prod(1 + 0.1 * T.tanh(W), axis=0).dimshuffle('x', 0)
    elif name == 'sum_over_a_kept_row':   # each block holds the same one row
        new = W / T.sum(T.sqrt(T.sum(T.sqr(W + G), axis=0, keepdims=True)))
    elif name == 'product_over_a_kept_row':
        new = W * T.prod(T.max(abs(W), axis=0, keepdims=True), axis=0, keepdims=True)
    else:   # a batch-norm-like running mean: G's column means read row by row
        mean = theano.shared(rng.randn(ROWS).astype('float32'), name='mean')
        new = W * 0.9 + (G.mean(axis=1) * 0.1).dimshuffle(0, 'x') + mean.dimshuffle(0, 'x')
    return [(W, new)], [W], G


def _refused_update(name):
    """The message of NotBlockable for an update of W that reads across rows."""
    import theano
    import theano.tensor as T
    from theano_multigpu.graph.blocks import NotBlockable, split_updates
    W = theano.shared(np.ones((ROWS, COLUMNS), 'float32'), name='W')
    new = {'dot': lambda: W - T.dot(T.matrix('A'), W),
           'transpose': lambda: W * T.sum(W.T, axis=1).dimshuffle(0, 'x'),   # built, not run
           'reshape': lambda: W.reshape((COLUMNS, ROWS)).reshape((ROWS, COLUMNS)),
           'reversed': lambda: W[::-1],
           'sort': lambda: T.sort(W, axis=0),
           'all_rows_in_one': lambda: W * T.sum(W.dimshuffle('x', 0, 1),
                                                axis=[1, 2]).dimshuffle(0, 'x'),
           'mean_op': lambda: W - T.mean(W, axis=0, op=True)}.get(name, lambda: None)()
    V = theano.shared(np.ones((ROWS, COLUMNS), 'float32'), name='V')
    if name == 'leaves_at_different_bounds':
        new = W - 0.1 * T.tanh(V)
    elif name == 'a_leaf_at_other_bounds':
        new = V * 2
    _, refused = split_updates([(W, new)], {W: BOUNDS['4/3'], V: [(0, 3), (3, ROWS)]},
                               lambda X, k: X[:1])
    if refused:
        error, = refused.values()
        assert isinstance(error, NotBlockable) and error.weight is W, refused
        return str(error)
    return 'not refused'


def _compared(updates, cut, inputs, rng):
    """Whole and block new values on random ``inputs`` ({input: shape}; the
    other leaves are shared variables), ``cut``: {leaf: bounds}: whether
    each block's value is the rows of the whole one, and what it reads."""
    import theano
    from theano import gof
    from theano_multigpu.graph.blocks import split_updates
    stand_ins = {}

    def block_leaf(X, k):
        return stand_ins.setdefault((X, k), X.type(name='%s[%d]' % (X.name, k)))

    split, refused = split_updates(updates, cut, block_leaf)
    assert not refused, refused
    function = theano.function(list(inputs) + list(stand_ins.values()),
                               [new for _, new in updates] + [new for _, _, new in split],
                               mode='FAST_COMPILE', on_unused_input='ignore')
    values = dict((X, X.get_value()) for X in cut if X not in inputs)
    same, finite = True, True
    for _ in range(3):
        values.update((x, rng.randn(*shape).astype(x.dtype)) for x, shape in inputs.items())
        out = function(*([values[x] for x in inputs] +
                         [values[X][slice(*cut[X][k])] for X, k in stand_ins]))
        whole = dict(zip([X for X, _ in updates], out[:len(updates)]))
        finite = finite and all(np.isfinite(v).all() for v in whole.values())
        for (X, k, _), value in zip(split, out[len(updates):]):
            same = same and np.allclose(value, whole[X][slice(*cut[X][k])], rtol=1e-6)
    read = [gof.graph.inputs([new]) for _, _, new in split]
    no_leaf = all(not set(leaves) & set(cut) for leaves in read)
    own = all(j == k for (_, k, _), leaves in zip(split, read)
              for (_, j), stand_in in stand_ins.items() if stand_in in leaves)
    return {'bounds': cut[split[0][0]], 'finite': bool(finite), 'same_rows': bool(same),
            'reads_no_cut_leaf': bool(no_leaf), 'reads_own_block_only': bool(own),
            'blocks': len(split)}


def _one_weight(updates, leaves, G, bounds, rng):
    """_compared for one 7 x 3 weight's ``leaves`` cut at ``bounds``."""
    return _compared(updates, dict((leaf, bounds) for leaf in leaves),
                     {G: (ROWS, COLUMNS)}, rng)


def _two_weights(case, bounds, rng):
    """_compared for a 7-row and a 5-row weight, each cut at its ``bounds``,
    updated by a Keras ``case`` with clipnorm; and whether clipnorm clipped
    (the whole values differ from those without it)."""
    import theano
    updates, leaves, grads = _keras_update(case, rng, TWO_ROWS)
    cut = dict((leaf, b) for weight_leaves, b in zip(leaves, bounds) for leaf in weight_leaves)
    found = _compared(updates, cut, dict((G, (r, COLUMNS)) for G, r in zip(grads, TWO_ROWS)),
                      rng)
    optimizer, arguments, constraint = case
    unclipped, _, other_grads = _keras_update((optimizer, dict(arguments, clipnorm=0),
                                               constraint), np.random.RandomState(0), TWO_ROWS)
    clipped, _, grads = _keras_update(case, np.random.RandomState(0), TWO_ROWS)
    g = [np.random.RandomState(1).randn(r, COLUMNS).astype('float32') for r in TWO_ROWS]
    plain = theano.function(other_grads, [new for _, new in unclipped], mode='FAST_COMPILE')(*g)
    found['clipnorm_clips'] = not all(
        np.allclose(a, b) for a, b in
        zip(plain, theano.function(grads, [new for _, new in clipped], mode='FAST_COMPILE')(*g)))
    return found


def _node_counts(count):
    """Apply nodes of Keras's SGD(momentum, clipnorm) updates of ``count``
    weights of 2 to 6 rows, each cut in two blocks at its own bounds: of the
    whole updates, of one split over all the weights, and of a split per
    weight (each weight's own leaves cut, the other gradients read whole)."""
    from theano import gof
    from theano_multigpu.graph.blocks import split_updates
    rows = [2 + i % 5 for i in range(count)]
    updates, leaves, _ = _keras_update(('SGD', dict(lr=0.1, momentum=0.9, clipnorm=1.0), None),
                                       np.random.RandomState(0), rows)
    cut = dict((leaf, [(0, r // 2), (r // 2, r)])
               for weight_leaves, r in zip(leaves, rows) for leaf in weight_leaves)

    def block_leaf(X, k):
        return X.type(name='%s[%d]' % (X.name, k))

    def nodes(outputs):
        return len(gof.graph.io_toposort(gof.graph.inputs(outputs), outputs))

    one = [new for _, _, new in split_updates(updates, cut, block_leaf)[0]]
    per_weight = [new for weight_leaves in leaves
                  for _, _, new in split_updates(updates, dict((leaf, cut[leaf])
                                                               for leaf in weight_leaves),
                                                 block_leaf)[0]]
    return {'blocks': 2, 'whole': nodes([new for X, new in updates if X in cut]),
            'one_split': nodes(one), 'split_per_weight': nodes(per_weight),
            'reads_no_cut_leaf': all(not set(gof.graph.inputs([new])) & set(cut)
                                     for new in one)}


def _long_chain(count):
    """A gradient norm over ``count`` cut gradients (Keras's
    ``sum([K.sum(K.square(g)) for g in grads])``, a chain of ``count``
    additions, longer than Python's recursion limit) scaling W's update:
    the number of block updates built, and whether they read a cut leaf.
    (Theano's own compiler recurses along such a chain: not compiled.)"""
    import theano
    import theano.tensor as T
    from theano import gof
    from theano_multigpu.graph.blocks import split_updates
    W = theano.shared(np.ones((ROWS, COLUMNS), 'float32'), name='W')
    grads = [T.matrix('g%d' % i) for i in range(count)]
    norm = T.sqrt(sum([T.sum(T.square(g)) for g in grads]))
    # W and g0 at W's bounds, the other gradients at bounds of their own.
    cut = dict((g, BOUNDS['2/2/2/1'] if i % 2 == 0 else [(0, 2), (2, 3), (3, 4), (4, 5)])
               for i, g in enumerate(grads))
    cut[W] = BOUNDS['2/2/2/1']
    split, _ = split_updates([(W, W - grads[0] / norm)], cut,
                             lambda X, k: X.type(name='%s[%d]' % (X.name, k)))
    leaves = set(cut)
    return {'blocks': len(split), 'recursion_limit': sys.getrecursionlimit(),
            'reads_no_cut_leaf': all(not set(gof.graph.inputs([new])) & leaves
                                     for _, _, new in split)}


def _bounds_drawn(rng):
    """One block, a block per row, then random cuts of the rows."""
    drawn = [[(0, ROWS)], [(row, row + 1) for row in range(ROWS)]]
    while len(drawn) < RANDOM_BOUNDS:
        cuts = sorted(rng.choice(np.arange(1, ROWS), rng.randint(1, ROWS - 1), replace=False))
        edges = [0] + [int(c) for c in cuts] + [ROWS]
        drawn.append(list(zip(edges[:-1], edges[1:])))
    return drawn


def _whole_value(case):
    """The whole new W of a Keras ``case`` on fixed values."""
    import theano
    updates, [cut], [G] = _keras_update(case, np.random.RandomState(0))
    g = np.random.RandomState(1).randn(ROWS, COLUMNS).astype(G.dtype)
    return theano.function([G], dict(updates)[cut[0]], mode='FAST_COMPILE')(g)


def _one_refused_among_two(rng):
    """W and V share a gradient norm; V's update also reads V's rows through
    a dot.  The first split refuses V alone and still splits W; the second,
    V's leaves no longer cut, refuses none, and W's blocks are the rows of
    its whole update."""
    import theano
    import theano.tensor as T
    from theano_multigpu.graph.blocks import split_updates
    W, V = (theano.shared(rng.randn(ROWS, COLUMNS).astype('float32'), name=n) for n in 'WV')
    gW, gV = T.matrix('gW'), T.matrix('gV')
    norm = T.sqrt(T.sum(T.sqr(gW)) + T.sum(T.sqr(gV)))
    mixing = theano.shared(rng.randn(ROWS, ROWS).astype('float32'), name='mixing')
    updates = [(W, W - 0.1 * gW / norm), (V, V - 0.1 * T.dot(mixing, gV) / norm)]
    cut = dict((leaf, BOUNDS['4/3']) for leaf in (W, V, gW, gV))
    split, refused = split_updates(updates, cut, lambda X, k: X.type())
    kept = dict((leaf, bounds) for leaf, bounds in cut.items() if leaf not in (V, gV))
    found = _compared(updates, kept, {gW: (ROWS, COLUMNS), gV: (ROWS, COLUMNS)}, rng)
    found.update(first_refused=sorted(str(X) for X in refused),
                 first_split=sorted(set(str(X) for X, _, _ in split)),
                 names_weight=all(error.weight is X for X, error in refused.items()))
    return found


def _bad_bounds():
    """{case: the ValueError's message} of Blocks given malformed bounds."""
    import theano
    from theano_multigpu.graph.blocks import Blocks
    W = theano.shared(np.ones((ROWS, COLUMNS), 'float32'), name='W')
    found = {}
    for case, bounds in (('gap', [(0, 3), (4, 7)]), ('overlap', [(0, 4), (3, 7)]),
                         ('empty', [(0, 3), (3, 3), (3, 7)]), ('fractional', [(0, 3.9), (3.9, 7)]),
                         ('late start', [(1, 7)])):
        try:
            Blocks({W: bounds}, lambda X, k: X)
            found[case] = 'accepted'
        except ValueError as error:
            found[case] = str(error)
    return found


def child():
    report = {'cases': {}, 'refused': {}, 'random': [], 'bad_bounds': _bad_bounds()}
    for name in sorted(KERAS_CASES) + HAND_CASES:
        report['cases'][name] = {}
        for key, bounds in sorted(BOUNDS.items()):
            rng = np.random.RandomState(0)
            if name in KERAS_CASES:
                updates, [cut], [G] = _keras_update(KERAS_CASES[name], rng)
            else:
                updates, cut, G = _hand_update(name, rng)
            report['cases'][name][key] = _one_weight(updates, cut, G, bounds, rng)
    rng = np.random.RandomState(1)
    for bounds in _bounds_drawn(rng):
        updates, [cut], [G] = _keras_update(KERAS_CASES['adam_clipnorm_clipvalue_maxnorm'], rng)
        report['random'].append(_one_weight(updates, cut, G, bounds, rng))
    report['two_weights'] = dict(
        (name, dict((key, _two_weights(case, bounds, np.random.RandomState(2)))
                    for key, bounds in TWO_BOUNDS.items()))
        for name, case in TWO_CASES.items())
    report['node_counts'] = _node_counts(MANY_WEIGHTS)
    report['one_refused'] = _one_refused_among_two(np.random.RandomState(3))
    report['long_chain'] = _long_chain(LONG_CHAIN)
    for name in REFUSED:
        report['refused'][name] = _refused_update(name)
    optimizer, arguments, constraint = KERAS_CASES['rmsprop_clipnorm_maxnorm']
    plain = _whole_value((optimizer, arguments, constraint))
    report['clipnorm_clips'] = not np.allclose(
        plain, _whole_value((optimizer, dict(arguments, clipnorm=0), constraint)))
    report['maxnorm_scales'] = not np.allclose(plain, _whole_value((optimizer, arguments, None)))
    return report


if __name__ == '__main__':
    sys.stdout.write(json.dumps(child()) + '\n')
