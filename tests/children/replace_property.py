"""Property (hypothesis), run in a child (Theano reads its flags at
import): ``graph.replace.replaced`` computes what ``theano.clone`` with the
same replacements computes, for any small graph and any replacements, and
copies nothing: each value is in the result as it is, and the result holds
no more nodes than the original graph and the values together.

A Rebuilder asked for the outputs one at a time builds what it builds at
once, and refuses a key it has read already.

Prints 'checked N graphs; layer by layer: replaced M nodes, theano.clone
K'."""
import numpy as np
import theano
from hypothesis import example, given, settings, strategies as st
from theano import gof, tensor

from theano_multigpu.graph.replace import Rebuilder, replaced

# Each makes a list of variables; the last makes two outputs of one node
# (as BatchNormalization's op does: a key may be one, a reader the other).
OPS = [lambda a, b: [a + b], lambda a, b: [a * b], lambda a, b: [tensor.tanh(a) - b],
       lambda a, b: [tensor.maximum(a, b)], lambda a, b: [(a * 2).sum() + b],
       lambda a, b: list(tensor.max_and_argmax(a + b))]
INPUTS = [tensor.vector('x'), tensor.vector('y')]
VALUES = [np.linspace(-1, 1, 4).astype(theano.config.floatX),
          np.linspace(0.5, 2, 4).astype(theano.config.floatX)]


def build(steps):
    """Variables: the inputs, then one per (op, operand, operand) step."""
    variables = list(INPUTS)
    for op, i, j in steps:
        variables += OPS[op](variables[i % len(variables)], variables[j % len(variables)])
    return variables


def nodes(outputs):
    return set(gof.graph.io_toposort(gof.graph.inputs(outputs), outputs))


def evaluate(outputs):
    function = theano.function(INPUTS, outputs, mode='FAST_COMPILE', on_unused_input='ignore')
    return function(*VALUES)


checked = []


@settings(max_examples=25, derandomize=True, deadline=None, database=None)
# A key that is a node's first output, its second read on: Theano's fast
# sort waited forever.  Its second output a key, the node rebuilt: its
# value must stay.
@example(steps=[(5, 0, 1), (0, 3, 0)], picks=[0])
@example(steps=[(0, 0, 1), (5, 2, 0), (0, 3, 4)], picks=[0, 2])
@given(steps=st.lists(st.tuples(st.integers(0, len(OPS) - 1), st.integers(0, 20),
                                st.integers(0, 20)), min_size=1, max_size=8),
       picks=st.lists(st.integers(0, 20), min_size=1, max_size=3, unique=True))
def check(steps, picks):
    variables = build(steps)
    inner = variables[len(INPUTS):]
    keys = list(dict((id(inner[p % len(inner)]), inner[p % len(inner)]) for p in picks).values())
    # Each key read as a new expression of the inputs (not of other keys),
    # of the key's type.
    replace = dict((key, _value_like(key, k)) for k, key in enumerate(keys))
    outputs = [variables[-1], variables[len(variables) // 2]]
    new = replaced(outputs, replace)
    for got, want in zip(evaluate(new), evaluate(theano.clone(outputs, replace=replace))):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # Each value the outputs reach is in the result as it is, not copied.
    reached = set(id(v) for node in gof.graph.io_toposort(keys, outputs, clients={})
                  for v in node.inputs)
    reached |= set(id(v) for v in outputs)
    kept = set(id(v) for v in gof.graph.ancestors(new))
    for key, value in replace.items():
        assert id(key) not in reached or id(value) in kept, (key, value)
    assert len(nodes(new)) <= len(nodes(outputs)) + len(nodes(list(replace.values())))
    # Built piece by piece (as a replica is: its layers, then what reads
    # their whole batch), each node is built once: asked again, the same
    # variables; the same values and nodes as built at once.
    rebuilder = Rebuilder(replace)
    pieces = [rebuilder([outputs[1]])[0], rebuilder([outputs[0]])[0]][::-1]
    assert all(a is b for a, b in zip(rebuilder(outputs), pieces))
    for got, want in zip(evaluate(pieces), evaluate(new)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert len(nodes(pieces)) == len(nodes(new)), (len(nodes(pieces)), len(nodes(new)))
    # Keys added one at a time, in graph order, each after building what it
    # reads (as each synchronised batch normalisation is): the same values.
    order = dict((id(node), k) for k, node in enumerate(
        gof.graph.io_toposort(gof.graph.inputs(outputs + keys), outputs + keys)))
    rebuilder = Rebuilder()
    for key in sorted(keys, key=lambda v: order[id(v.owner)]):
        rebuilder(key.owner.inputs)
        rebuilder.add(key, replace[key])
    for got, want in zip(evaluate(rebuilder(outputs)), evaluate(new)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    checked.append(1)


def _value_like(key, k):
    value = tensor.exp(INPUTS[k % 2]) * (k + 1)
    return tensor.cast(value.sum() if key.ndim == 0 else value, key.dtype)


def layer_by_layer(depth):
    """Node counts of a residual chain rewritten one block at a time, each
    block's replacement the rewritten block before it (as layer-wise mode
    rewrites layers): (replaced, theano.clone, the chain itself)."""
    blocks = [INPUTS[0]]
    for _ in range(depth):
        blocks.append(blocks[-1] + tensor.tanh(blocks[-1] * 0.5))
    counts = []
    for rewrite in (replaced, lambda outs, rep: theano.clone(outs, replace=rep)):
        rewritten = {id(blocks[0]): INPUTS[1]}
        for before, block in zip(blocks, blocks[1:]):
            rewritten[id(block)] = rewrite([block], {before: rewritten[id(before)]})[0]
        everything = rewrite(blocks[1:], dict((b, rewritten[id(b)]) for b in blocks[1:]))
        counts.append(len(nodes(everything)))
    return counts + [len(nodes(blocks[1:]))]


def a_key_read_before_it_is_added_is_refused():
    """A node's output or a graph input, read before it is added."""
    total = INPUTS[0] + INPUTS[1]
    for key in (total, INPUTS[1]):
        rebuilder = Rebuilder({INPUTS[0]: INPUTS[1]})
        rebuilder([total * 2])
        try:
            rebuilder.add(key, INPUTS[0])
        except ValueError as error:
            assert 'after the rewritten graph read it' in str(error), error
        else:
            raise AssertionError('Rebuilder.add took a key it had read: %s' % key)


check()
a_key_read_before_it_is_added_is_refused()
ours, theirs, chain = layer_by_layer(12)
assert ours == chain, (ours, chain)
print('checked %d graphs; layer by layer: replaced %d nodes, theano.clone %d'
      % (len(checked), ours, theirs))
