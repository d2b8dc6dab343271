"""Two pocl contexts batch-wise against the CPU (one device), on models of
Keras scripts' patterns and on drawn ones.

Property (hypothesis): a model with a recurrent, a Dense and a
convolution branch, each drawn with dimensions of 1 (features, timesteps,
units, filters, kernel sizes, channels, image sides) and a batch of 1 to 5
rows, trained batch-wise on two pocl contexts (a batch of 1 leaves one
context no rows), gives the CPU's losses, weights and predictions, all
finite.  The issue that found OpenCL's NaN (CLBlast's gemv reading memory
nobody wrote) drew exactly such a shape: an LSTM on one feature.

Two long-lived children (tests/children/comparison_worker.py), the CPU and two
contexts, train each drawn model for 3 steps; one compile covers the
three branches, and the named models.
"""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings, strategies as st

from conftest import CHILDREN, TEST_COMPILE_FLAGS, TWO, needs_pocl
from one_context import Worker  # noqa: E402  (benchmarks/, on the path through conftest)

pytestmark = needs_pocl
EXAMPLES, TRAIN_STEPS = 3, 3


@pytest.fixture(scope='module')
def workers(tmp_path_factory):
    """{'cpu': worker without contexts, 'two': worker on two pocl contexts}."""
    base = tmp_path_factory.mktemp('opencl_property')
    started = {}
    for key, flags in (('cpu', ''), ('two', TWO)):
        home = base / key
        home.mkdir()
        started[key] = Worker(str(home), 'theano_multigpu',
                              ','.join(f for f in (TEST_COMPILE_FLAGS, flags) if f), None,
                              script=os.path.join(CHILDREN, 'comparison_worker.py'))
    yield started
    for worker in started.values():
        worker.close()


ONE_OR = st.sampled_from
SPECS = st.fixed_dictionaries({
    'rnn': st.sampled_from(['lstm', 'gru', 'simple']),
    'units': ONE_OR([1, 3]), 'steps': ONE_OR([1, 3]), 'features': ONE_OR([1, 2]),
    'dense_in': ONE_OR([1, 3]), 'dense_units': ONE_OR([1, 4]),
    'channels': ONE_OR([1, 2]), 'side': ONE_OR([1, 3]), 'filters': ONE_OR([1, 2]),
    'kernel': ONE_OR([1, 3]), 'batch': st.sampled_from([1, 2, 3, 5]),
})
# The shape: an LSTM on one feature and one timestep, and every
# other dimension 1.
ALL_ONES = dict(rnn='lstm', units=1, steps=1, features=1, dense_in=1, dense_units=1,
                channels=1, side=1, filters=1, kernel=1, batch=1)


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=SPECS)
@example(spec=ALL_ONES)
def test_two_pocl_contexts_equal_the_cpu_with_dimensions_of_one(workers, spec):
    request = dict(spec, train_steps=TRAIN_STEPS)
    for worker in workers.values():   # both at once, on a core each
        worker.send(request)
    cpu, two = workers['cpu'].answer(), workers['two'].answer()
    assert_equal_to_the_cpu(two, cpu, spec)


def assert_equal_to_the_cpu(two, cpu, what):
    for key in ('losses', 'predictions'):
        assert np.all(np.isfinite(two[key])), (what, key, two[key])
        np.testing.assert_allclose(two[key], cpu[key], rtol=1e-4, atol=1e-5,
                                   err_msg='%s %s' % (key, what))
    assert len(two['weights']) == len(cpu['weights']), what
    for mine, theirs in zip(two['weights'], cpu['weights']):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5, err_msg=str(what))


@pytest.mark.parametrize('name', ['word_dropout', 'deconvolution_fixed_batch',
                                  'conv_lstm_fixed_batch'])
def test_keras_patterns_that_stopped_batch_wise_train_as_on_one_device(workers, name):
    """Embedding's word dropout (the row analysis failed with a TypeError:
    the shape of a draw over the vocabulary was unknown to it), and a
    Deconvolution2D whose output_shape carries the batch size on a fixed
    batch_shape (each replica's convolution claimed the whole batch's 8
    rows, and Theano reshaped 4 rows as 8 at the first step), and
    ConvLSTM2D on a fixed batch_input_shape (the same, inside its loop)."""
    request = {'named': name, 'train_steps': TRAIN_STEPS}
    for worker in workers.values():
        worker.send(request)
    cpu, two = workers['cpu'].answer(), workers['two'].answer()
    assert_equal_to_the_cpu(two, cpu, name)
