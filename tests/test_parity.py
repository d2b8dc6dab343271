"""One-context parity: the shim trains exactly as stock Keras-Theano does.

Same seeds, same data, 5 ``train_on_batch`` steps of each model in
benchmarks/models.py (an MLP, a CNN, an LSTM, a functional model with two
inputs, two outputs and loss weights); every weight must agree to 1e-7.

Stock is ``KERAS_BACKEND=theano THEANO_MULTIGPU_COMPAT=1`` (plain
Keras-Theano with the Python 3.11 fixes alone).  On the CPU neither side sets
contexts; on pocl the shim runs with ``contexts=dev0->opencl0:0`` and stock
with ``device=opencl0:0``, the same device.  Each configuration is one child
Python that trains all four models (the pocl compile is slow) and writes an
.npz; the two sides of a configuration run at the same time.
"""
import os
import sys

import numpy as np
import pytest

from conftest import REPO, have_pocl_devices, missing, run_python, run_side_by_side

BENCHMARKS = os.path.join(REPO, 'benchmarks')
sys.path.insert(0, BENCHMARKS)
from models import MODELS  # noqa: E402

STEPS = 5
TOLERANCE = 1e-7

CHILD = '''
import sys
import numpy as np
sys.path.insert(0, %(benchmarks)r)
from models import MODELS, build
import keras.backend as K

def where(variable):
    return '%%s:%%s' %% (type(variable).__name__,
                         getattr(variable.type, 'context_name', None))

out = {'impl': np.array(K.variable.__module__)}
for name in MODELS:
    case = build(name, size='test')
    model = case.model
    out[name + '/loss'] = np.array([
        np.hstack(np.atleast_1d(model.train_on_batch(case.x, case.y)))
        for _ in range(%(steps)d)])
    weights = model.get_weights()
    out[name + '/count'] = np.array(len(weights))
    for i, w in enumerate(weights):
        out['%%s/w%%d' %% (name, i)] = w
    held = list(model.weights) + list(getattr(model.optimizer, 'weights', []))
    out[name + '/where'] = np.array([where(v) for v in held])
    compiled = getattr(model, 'model', model).train_function.function
    out[name + '/copies'] = np.array(sum(
        type(node.op).__name__ in ('GpuToGpu', 'ToContext')
        for node in compiled.maker.fgraph.toposort()))
try:
    from theano.gpuarray.type import get_context
    out['default_is_dev0'] = np.array(get_context(None) is get_context('dev0'))
except Exception:
    out['default_is_dev0'] = np.array(False)
np.savez(sys.argv[1], **out)
'''

STOCK = dict(backend='theano', extra={'THEANO_MULTIGPU_COMPAT': '1'})
SHIM = dict(backend='theano_multigpu', extra=None)
CONFIGURATIONS = {
    'cpu': {'stock': dict(STOCK, flags=''), 'shim': dict(SHIM, flags='')},
    'pocl': {'stock': dict(STOCK, flags='device=opencl0:0'),
             'shim': dict(SHIM, flags='contexts=dev0->opencl0:0')},
}


def _train_both(tmp_path_factory, configuration):
    """Run the stock and the shim child of ``configuration`` side by side;
    return {'stock': npz dict, 'shim': npz dict}."""
    base = tmp_path_factory.mktemp('parity_' + configuration)
    code = CHILD % {'benchmarks': BENCHMARKS, 'steps': STEPS}

    def train(side, slot):
        settings = CONFIGURATIONS[configuration][side]
        home = base / side
        home.mkdir()
        run_python(home, code, flags=settings['flags'], backend=settings['backend'],
                   extra_env=settings['extra'], slot=slot, timeout=1800,
                   args=[str(base / (side + '.npz'))])
        with np.load(str(base / (side + '.npz'))) as data:
            return {key: data[key] for key in data.files}

    return run_side_by_side(CONFIGURATIONS[configuration], train)


@pytest.fixture(scope='module')
def cpu_runs(tmp_path_factory):
    return _train_both(tmp_path_factory, 'cpu')


@pytest.fixture(scope='module')
def pocl_runs(tmp_path_factory):
    if not have_pocl_devices(1):
        missing('needs pygpu and a pocl OpenCL device (pocl-opencl-icd, '
                'POCL_DEVICES="pthread pthread")')
    return _train_both(tmp_path_factory, 'pocl')


def _assert_parity(runs, name):
    stock, shim = runs['stock'], runs['shim']
    assert str(stock['impl']) == 'keras.backend.theano_backend'
    assert str(shim['impl']) == 'theano_multigpu.keras_adapter'
    count = int(stock[name + '/count'])
    assert count > 0 and int(shim[name + '/count']) == count
    for i in range(count):
        key = '%s/w%d' % (name, i)
        np.testing.assert_allclose(shim[key], stock[key], rtol=TOLERANCE, atol=TOLERANCE,
                                   err_msg='%s differs from stock Keras' % key)
    np.testing.assert_allclose(shim[name + '/loss'], stock[name + '/loss'],
                               rtol=TOLERANCE, atol=TOLERANCE)
    losses = stock[name + '/loss']  # the comparison is not vacuous: it trained
    assert not np.allclose(losses[0], losses[-1]), '%s did not train' % name


@pytest.mark.parametrize('name', MODELS)
def test_cpu_parity(cpu_runs, name):
    _assert_parity(cpu_runs, name)
    for side in ('stock', 'shim'):
        assert all(w == 'TensorSharedVariable:cpu'
                   for w in cpu_runs[side][name + '/where']), cpu_runs[side][name + '/where']


@pytest.mark.parametrize('name', MODELS)
def test_pocl_one_context_parity(pocl_runs, name):
    _assert_parity(pocl_runs, name)
    # Both sides really ran on the device: weights and optimizer state where
    # stock puts them (Theano's default context, which the shim made dev0's;
    # integer counters on the host), and no step copies between contexts.
    assert bool(pocl_runs['shim']['default_is_dev0'])
    where = list(pocl_runs['shim'][name + '/where'])
    assert where == list(pocl_runs['stock'][name + '/where'])
    assert set(where) <= {'GpuArraySharedVariable:None', 'TensorSharedVariable:cpu'}
    assert where.count('GpuArraySharedVariable:None') >= len(where) - 1, where
    for side in ('stock', 'shim'):
        assert int(pocl_runs[side][name + '/copies']) == 0
