"""Property (hypothesis): for any small Keras model drawn from a pool of
layers and Lambdas, row-meeting ones included (computed over the whole
batch), batch-wise on two pocl contexts gives one context's losses and
weights.

Two long-lived children (tests/children/model_worker.py), one context and
two, train each drawn model for 3 steps on the same data; most layers are
compiled once and then come from the caches, so the examples stay cheap.
"""
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings, strategies as st

from conftest import CHILDREN, ONE, TEST_COMPILE_FLAGS, TWO, needs_pocl, side_by_side

sys.path.insert(0, CHILDREN)
from model_worker import LAYERS, ROWS_MEET  # noqa: E402
from one_context import Worker  # noqa: E402  (benchmarks/, on the path through conftest)

pytestmark = needs_pocl
EXAMPLES, STEPS = 4, 3


@pytest.fixture(scope='module')
def workers(tmp_path_factory):
    """{1: worker on one context, 2: worker on two}."""
    flags = {1: ONE, 2: TWO}
    slots, caches = side_by_side(list(flags))
    base = tmp_path_factory.mktemp('rows_property')
    started = {}
    with caches:
        for key in flags:
            home = base / ('home_%s' % key)
            home.mkdir()
            started[key] = Worker(str(home), 'theano_multigpu',
                                  TEST_COMPILE_FLAGS + ',' + flags[key], None,
                                  script=os.path.join(CHILDREN, 'model_worker.py'),
                                  slot=slots[key])
        yield started
        for worker in started.values():
            worker.close()


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(layers=st.lists(st.sampled_from(sorted(LAYERS)), min_size=1, max_size=4))
@example(layers=list(ROWS_MEET))   # every row-meeting Lambda in one model
def test_two_contexts_equal_one(workers, layers):
    request = {'layers': layers, 'steps': STEPS}
    for worker in workers.values():   # both at once, on a core each
        worker.send(request)
    one, two = workers[1].answer(), workers[2].answer()
    assert np.all(np.isfinite(one['losses'])), (layers, one['losses'])
    np.testing.assert_allclose(two['losses'], one['losses'], rtol=1e-4, atol=1e-6)
    for mine, theirs in zip(two['weights'], one['weights']):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-6, err_msg=str(layers))
