"""A placed variable split into blocks of rows of its first axis, each on a
context of its own: its whole value read, written and pickled, graphs read
the join of its blocks, and bad parts are refused; a later update that
cannot use its blocks does not stop the split of others (one child Python,
two pocl contexts)."""
import json

import numpy as np

from conftest import TWO, needs_pocl, run_python

CHILD = '''
    import json, pickle
    import numpy as np
    import theano
    from theano_multigpu.graph import placed

    def blocks_of(v):
        return [[b.context, b.start, b.stop, b.variable.type.context_name,
                 np.asarray(b.variable.get_value()).tolist()] for b in v.blocks]

    def refused(call):
        try:
            call()
        except ValueError as error:
            return str(error)
        return None

    out = {}
    for name, value, parts in (
            ('w', np.arange(15, dtype='float32').reshape(5, 3) / 4 - 1,
             [('dev0', 0, 3), ('dev1', 3, 5)]),
            ('b', np.arange(7, dtype='int32') * 3 - 5, [('dev0', 0, 4), ('dev1', 4, 7)])):
        v = placed.new_variable(value, value.dtype, name)
        before = placed.is_placed(v)
        v.place_blocks(parts)
        got = {'class': type(v).__name__, 'placed before': before,
               'placed after': placed.is_placed(v), 'whole copy': v.placed is not None,
               'value': v.get_value().tolist(), 'dtype': str(v.get_value().dtype),
               'blocks': blocks_of(v), 'nbytes': v.nbytes,
               'placeholder strides': list(v.container.storage[0].strides),
               'twice': theano.function([], v * 2)().tolist(),
               'twice of view': theano.function([], v.graph_view() * 2)().tolist(),
               'replaced': placed.placed_replacements([v])[v] is v.graph_view()}
        v.set_value(value[::-1] + 1)
        got['after set'] = v.get_value().tolist()
        got['blocks after set'] = blocks_of(v)
        got['twice after set'] = theano.function([], v * 2)().tolist()
        back = pickle.loads(pickle.dumps(v))
        got['unpickled'] = [type(back).__name__, placed.is_placed(back),
                            back.get_value().tolist()]
        got['wrong shape'] = refused(lambda: v.set_value(np.zeros((2,) + value.shape)))
        got['value holder'] = refused(lambda: placed.value_holder(v))
        got['placed again'] = [refused(lambda: v.place_blocks(parts)),
                               refused(lambda: v.place('dev0'))]
        out[name] = got

    rows = np.ones((5, 2), 'float32')
    bad = placed.new_variable(rows, 'float32', 'bad')
    out['bad parts'] = dict((case, refused(lambda: bad.place_blocks(parts))) for case, parts in (
        ('gap', [('dev0', 0, 2), ('dev1', 3, 5)]),
        ('overlap', [('dev0', 0, 3), ('dev1', 2, 5)]),
        ('empty', [('dev0', 0, 3), ('dev1', 3, 3), ('dev1', 3, 5)]),
        ('short', [('dev0', 0, 3), ('dev1', 3, 4)]),
        ('long', [('dev0', 0, 3), ('dev1', 3, 6)]),
        ('late start', [('dev0', 1, 5)]),
        ('none', []),
        ('not triples', [('dev0', 0)]),
        ('fractional rows', [('dev0', 0, 2.5), ('dev1', 2.5, 5)])))
    out['bad left unplaced'] = [placed.is_placed(bad), bad.get_value().tolist()]
    # One part is a valid split too; a whole placement is still one copy.
    one = placed.new_variable(rows, 'float32', 'one')
    one.place_blocks([('dev1', 0, 5)])
    whole = placed.new_variable(rows * 2, 'float32', 'whole')
    whole.place('dev1')
    out['one part'] = [blocks_of(one), theano.function([], one + 0)().tolist()]
    out['whole'] = [whole.blocks is None, placed.value_holder(whole) is whole.placed,
                    theano.function([], whole + 0)().tolist(), whole.nbytes]

    # A later function whose update of a weight split before reads across
    # its rows does not stop the split of a new weight (the rewrite updates
    # the former whole, batchwise._by_block).
    import theano.tensor as T
    from theano_multigpu.graph import sharding
    from theano_multigpu.graph.gradients import gradient_stand_ins
    tied = placed.new_variable(np.ones((4, 3), 'float32'), 'float32', 'tied')
    tied.place_blocks([('dev0', 0, 2), ('dev1', 2, 4)])
    fresh = placed.new_variable(np.ones((4, 3), 'float32'), 'float32', 'fresh')
    gradients = gradient_stand_ins(T.scalar('loss'), [tied, fresh])
    mixing = theano.shared(np.ones((4, 4), 'float32'), name='mixing')
    chosen = sharding.weights_to_split(
        [fresh], {}, [(tied, tied - T.dot(mixing, gradients[0])), (fresh, fresh - gradients[1])],
        gradients, 2, [tied, fresh])
    out['split beside one split before'] = sorted(w.name for w, _ in chosen.values())
    print('RESULT ' + json.dumps(out))
'''


def _blocks(value, parts):
    return [[name, start, stop, name, value[start:stop].tolist()] for name, start, stop in parts]


@needs_pocl
def test_a_variable_in_blocks_reads_writes_and_pickles_its_whole_value(home):
    result = run_python(home, code=CHILD, flags=TWO + ',multigpu.shard_split=0')
    line = [l for l in result.stdout.splitlines() if l.startswith('RESULT ')][0]
    out = json.loads(line[len('RESULT '):])
    for name, value, parts in (
            ('w', np.arange(15, dtype='float32').reshape(5, 3) / 4 - 1,
             [('dev0', 0, 3), ('dev1', 3, 5)]),
            ('b', np.arange(7, dtype='int32') * 3 - 5, [('dev0', 0, 4), ('dev1', 4, 7)])):
        got = out[name]
        new = value[::-1] + 1
        assert got['class'] == 'PlacedVariable'
        assert [got['placed before'], got['placed after'], got['whole copy']] == [
            False, True, False]
        assert got['value'] == value.tolist() and got['dtype'] == str(value.dtype)
        assert got['blocks'] == _blocks(value, parts)
        assert got['nbytes'] == value.nbytes
        # The host variable keeps a placeholder of no memory.
        assert got['placeholder strides'] == [0] * value.ndim
        assert got['twice'] == got['twice of view'] == (value * 2).tolist()
        assert got['replaced']
        assert got['after set'] == new.tolist()
        assert got['blocks after set'] == _blocks(new, parts)
        assert got['twice after set'] == (new * 2).tolist()
        assert got['unpickled'] == ['PlacedVariable', False, new.tolist()]
        assert 'expects a value of shape %s' % (value.shape,) in got['wrong shape']
        assert 'split into blocks' in got['value holder']
        assert 'blocks hold the value' in got['value holder']
        assert all('placed already' in message for message in got['placed again'])
    bad = out['bad parts']
    assert all(message is not None and 'stopping at row 5' in message
               for message in bad.values()), bad
    assert 'a gap' in bad['gap'] and 'an overlap' in bad['overlap']
    assert 'is empty' in bad['empty']
    assert 'stop at row 4' in bad['short'] and 'stop at row 6' in bad['long']
    assert 'starts at row 1, not 0' in bad['late start']
    assert 'no parts' in bad['none'] and 'not a list of triples' in bad['not triples']
    assert 'pairs of whole rows' in bad['fractional rows']
    assert out['bad left unplaced'] == [False, np.ones((5, 2)).tolist()]
    rows = np.ones((5, 2), 'float32')
    assert out['one part'] == [_blocks(rows, [('dev1', 0, 5)]), rows.tolist()]
    assert out['whole'] == [True, True, (rows * 2).tolist(), rows.nbytes]
    assert out['split beside one split before'] == ['fresh']
