"""Child script: the size of the train function's graph as Theano is handed
it (before its optimiser), for deep networks with BatchNormalization
(benchmarks/deep_bn.py), in the configuration THEANO_FLAGS gives: one
context, batch-wise or layer-wise over the contexts, or one rank of mpirun.
Nothing is compiled.

    python graph_growth.py counts BLOCKS...   # 'BLOCKS: NODES' per line, for
                                              # resnet(BLOCKS) and cnn13 ('cnn13')
    python graph_growth.py property EXAMPLES  # hypothesis: drawn networks

The property: the graph handed to Theano holds at most GROWTH times the
contexts times the nodes of the graph Keras hands K.function (its forward
pass, loss and updates), plus a constant.  A rewrite that copies a layer's
upstream graph for each layer that reads it grows with a power of the depth
instead (batch-wise mode's synchronised BatchNormalization did: 4 blocks
did not compile).  Prints 'property held for N networks, largest ratio R'.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'benchmarks'))

from deep_bn import Block, cnn13, network, resnet, train_graph_sizes  # noqa: E402

# Per context: the replica's forward pass, its backward pass (about twice
# the forward's nodes) and its transfers, against one forward pass.
GROWTH = 6
CONSTANT = 200


def say(line):
    """One line on stdout, from rank 0 only under mpirun: every rank builds
    the same graph, and mpirun interleaves the ranks' output mid-line."""
    if os.environ.get('OMPI_COMM_WORLD_RANK', os.environ.get('PMI_RANK', '0')) == '0':
        sys.stdout.write(line + '\n')
        sys.stdout.flush()


def counts(depths):
    for depth in depths:
        case = cnn13() if depth == 'cnn13' else resnet(int(depth))
        say('%s: %d' % (depth, train_graph_sizes(case)['theano']))


def holds_the_bound(examples):
    from hypothesis import HealthCheck, example, given, settings, strategies as st
    from theano_multigpu.config import mesh

    contexts = max(1, len(mesh.current().names))
    ratios = []
    blocks = st.builds(Block, st.integers(1, 4), st.sampled_from([None, 'before', 'after']),
                       st.sampled_from([None, 'sum', 'concat']))

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    # Four synchronised BatchNormalizations in a row: did not compile.
    @example(layout=[Block(2, 'before', None)] * 4, channels=3, optimizer='sgd')
    @given(layout=st.lists(blocks, min_size=1, max_size=6), channels=st.integers(1, 3),
           optimizer=st.sampled_from(['sgd', 'adam']))
    def check(layout, channels, optimizer):
        sizes = train_graph_sizes(network(layout, input_shape=(channels, 4, 4),
                                          optimizer=optimizer))
        bound = GROWTH * contexts * sizes['keras'] + CONSTANT
        assert sizes['theano'] <= bound, (layout, sizes, bound)
        ratios.append(float(sizes['theano'] - CONSTANT) / (contexts * sizes['keras']))
    check()
    say('property held for %d networks, largest ratio %.2f' % (len(ratios), max(ratios)))


if __name__ == '__main__':
    if sys.argv[1] == 'counts':
        counts(sys.argv[2:])
    else:
        holds_the_bound(int(sys.argv[2]))
