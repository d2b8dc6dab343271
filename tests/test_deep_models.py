"""Deep models: the train graph Theano is handed (before its optimiser)
grows linearly with the blocks times the contexts, batch-wise, layer-wise
and under mpirun -np 2.

The batch-wise rewrite once built each replica with ``theano.clone``, which
copies every replacement's upstream graph: a synchronised
BatchNormalization joins every replica's rows, so every later layer of
every replica copied every replica's earlier layers, four times over per
block on two contexts (840, 3317 and 13066 nodes for 1 to 3 blocks; 4 ended
in RecursionError, 13 on 4 contexts in the OOM killer).  Nothing here
compiles (tests/children/graph_growth.py); that the 4-block model of
tests/children/train_models.py ('cnn_bn') compiles and trains as one
context is tests/test_batchwise.py's and tests/test_mpi.py's.
"""
import os
import re

import pytest

from conftest import CHILDREN, FOUR, ONE, TWO, needs_pocl, run_python, run_side_by_side

pytestmark = needs_pocl

EIGHT = 'contexts=' + ';'.join('dev%d->opencl0:%d' % (k, k % 2) for k in range(8))
# name: (THEANO_FLAGS, MPI ranks or None, replicas of the model in one
# process: layer-wise mode has one, spread over the contexts; an MPI rank on
# the CPU one)
CONFIGURATIONS = {1: (ONE, None, 1), 2: (TWO, None, 2), 4: (FOUR, None, 4),
                  8: (EIGHT, None, 8), 'layer': (FOUR + ',multigpu.mode=layer', None, 1),
                  'mpi': ('device=cpu', 2, 1)}
DEPTHS = (5, 10, 20, 50)
EXAMPLES = 12   # drawn networks per configuration of the property
PROPERTY_ON = (2, 'layer', 'mpi')


@pytest.fixture(scope='module')
def growth(tmp_path_factory):
    """{configuration: (child stdout of the counts, of the property)}; the
    children run side by side, two at a time."""
    base = tmp_path_factory.mktemp('growth')
    ranks = dict((key, r) for key, (_, r, _) in CONFIGURATIONS.items() if r)

    def run(key, slot):
        flags, ranks_here, _ = CONFIGURATIONS[key]
        home = base / ('home_%s' % key)
        home.mkdir()
        child = os.path.join(CHILDREN, 'graph_growth.py')
        counts = run_python(home, flags=flags, ranks=ranks_here, slot=slot, timeout=900,
                            args=[child, 'counts'] + [str(d) for d in DEPTHS]).stdout
        drawn = ''
        if key in PROPERTY_ON:
            drawn = run_python(home, flags=flags, ranks=ranks_here, slot=slot,
                               timeout=900, args=[child, 'property', str(EXAMPLES)]).stdout
        return counts, drawn

    return run_side_by_side(CONFIGURATIONS, run, ranks, at_once=2)


def _counts(stdout):
    """{blocks: nodes}, as rank 0 of an MPI run prints them."""
    found = {}
    for depth, nodes in re.findall(r'^(\d+): (\d+)$', stdout, re.M):
        assert int(depth) not in found, stdout
        found[int(depth)] = int(nodes)
    assert sorted(found) == list(DEPTHS), stdout
    return found


def _per_block(counts):
    """The nodes each block adds, between each pair of depths."""
    return [(counts[b] - counts[a]) / float(b - a) for a, b in zip(DEPTHS, DEPTHS[1:])]


@pytest.mark.parametrize('key', list(CONFIGURATIONS))
def test_each_block_adds_the_same_nodes(growth, key):
    """The graph is affine in the blocks: from 5 to 10, 10 to 20 and 20 to
    50 blocks, each block adds the same nodes (a copy per reader grows with
    a power of the depth)."""
    per_block = _per_block(_counts(growth[key][0]))
    assert max(per_block) == min(per_block), per_block


@pytest.mark.parametrize('key', [k for k in CONFIGURATIONS if k != 1])
def test_a_block_adds_nodes_in_proportion_to_the_replicas(growth, key):
    """A block adds at most three times one context's nodes per replica
    (its forward and backward, the join and the statistics sent back, the
    transfers between layer-wise contexts, an MPI rank's gather); one
    context's graph is Keras's own with its gradients."""
    one = _per_block(_counts(growth[1][0]))[0]
    many = _per_block(_counts(growth[key][0]))[0]
    assert many <= 3 * CONFIGURATIONS[key][2] * one, (many, one)


@pytest.mark.parametrize('key', PROPERTY_ON)
def test_drawn_networks_stay_within_the_linear_bound(growth, key):
    """Hypothesis draws networks (depth, residual sums and concatenations,
    BatchNormalization before or after the activation or none, channels of
    1, SGD or Adam); each train graph holds at most 6 x contexts x the
    nodes Keras hands K.function, plus 200 (graph_growth.py)."""
    lines = [line for line in growth[key][1].split('\n') if line.startswith('property held')]
    assert lines and lines[0].startswith('property held for %d networks' % (EXAMPLES + 1)), \
        growth[key][1]
