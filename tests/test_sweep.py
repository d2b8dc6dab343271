"""The sweep of Keras on contexts (tests/children/keras_sweep.py): every
layer class, objective, metric, activation, optimizer, constraint and
regularizer of Keras 1.2.2 and backend functions its layers and examples
call, in one model; one training step and predictions on the CPU, one pocl
context, two batch-wise and two layer-wise, each equal to the CPU to
float32 tolerance (the CPU and OpenCL kernels round differently), and the
several contexts equal to one context.  Then the layers Keras 1.0.1 has,
under Keras 1.0.1, on the CPU and batch-wise on two contexts.  In each
configuration the step also runs with Scan's Python loop, from the same
state, and equals the compiled loop's bit for bit.

It compiles one large model six times, about 30 minutes from a cold
cache.  ``make test`` runs the first phase, the CPU and layer-wise on two
contexts side by side (about 11 minutes cold): every kernel the sweep
builds, on one context or the other, and the layer-wise rewrite of every
layer, checked against the CPU.  ``make sweep`` (SWEEP=1) runs all three.
"""
import os

import numpy as np
import pytest

from conftest import CHILDREN, KERAS_101, ONE, TWO, needs_pocl, run_python, run_side_by_side

pytestmark = needs_pocl

# {configuration: (THEANO_FLAGS, Keras 1.0.1 rather than 1.2.2)}
# On two contexts, an op that runs away from its data (the placement check)
# fails the run too.
CHECKED = TWO + ',multigpu.check=error'
CONFIGURATIONS = {'cpu': ('device=cpu', False), 'one': (ONE, False), 'batch': (CHECKED, False),
                  'layer': (CHECKED + ',multigpu.mode=layer', False),
                  '1.0.1 cpu': ('device=cpu', True), '1.0.1 batch': (CHECKED, True)}
# Side by side, two at a time; the later ones find the compiled modules and
# kernels of the earlier in the caches.
ALL_PHASES = [['cpu', 'layer'], ['one', 'batch'], ['1.0.1 cpu', '1.0.1 batch']]
PHASES = ALL_PHASES if os.environ.get('SWEEP') else ALL_PHASES[:1]
RUN = set(key for phase in PHASES for key in phase)
# The CPU and OpenCL kernels sum in other orders: one step of SGD after a
# model this deep differs by about 1e-6 relative, predictions by less.
CPU_RTOL, CPU_ATOL = 1e-3, 1e-4
RTOL, ATOL = 1e-4, 1e-6


@pytest.fixture(scope='module')
def swept(tmp_path_factory):
    """{configuration: {name: array}}."""
    base = tmp_path_factory.mktemp('sweep')

    def sweep(key, slot):
        flags, keras_101 = CONFIGURATIONS[key]
        home = base / key.replace(' ', '_')
        home.mkdir()
        out = str(home / 'out.npz')
        result = run_python(home, flags=flags, slot=slot, timeout=3600,
                            extra_env={'PYTHONPATH': KERAS_101} if keras_101 else None,
                            args=[os.path.join(CHILDREN, 'keras_sweep.py'), out])
        version = '1.0.1' if keras_101 else '1.2.2'
        assert 'sweep under Keras %s:' % version in result.stdout, result.stdout[-2000:]
        return dict(np.load(out))
    results = {}
    for phase in PHASES:
        results.update(run_side_by_side(phase, sweep))
    return results


def _arrays(results):
    """The arrays to compare between configurations (not the counts of
    scan calls, which grow with the replicas)."""
    return sorted(name for name in results if not name.startswith('scan_calls/'))


@pytest.mark.parametrize('key,reference', [('one', 'cpu'), ('batch', 'cpu'), ('layer', 'cpu'),
                                           ('1.0.1 batch', '1.0.1 cpu')])
def test_each_configuration_equals_the_cpu(swept, key, reference):
    _runs(key, reference)
    cpu, other = swept[reference], swept[key]
    assert _arrays(cpu) == _arrays(other) and len(_arrays(cpu)) > 100
    for name in _arrays(cpu):
        np.testing.assert_allclose(other[name], cpu[name], rtol=CPU_RTOL, atol=CPU_ATOL,
                                   err_msg=name)


@pytest.mark.parametrize('key', ['batch', 'layer'])
def test_several_contexts_equal_one(swept, key):
    _runs(key, 'one')
    for name in _arrays(swept['one']):
        np.testing.assert_allclose(swept[key][name], swept['one'][name], rtol=RTOL, atol=ATOL,
                                   err_msg=name)


@pytest.mark.parametrize('key', sorted(CONFIGURATIONS))
def test_the_compiled_scan_loop_equals_the_python_loop(swept, key):
    """Every recurrent layer of the sweep (masked, backwards, bidirectional,
    convolutional), one step with each loop from the same state: the same
    losses and recurrent weights, bit for bit, and the compiled loop ran in
    the first alone."""
    _runs(key)
    results = swept[key]
    assert results['scan_calls/compiled'] > 0 and results['scan_calls/python'] == 0
    python = [name for name in results if name.startswith('python_loop/')]
    assert len(python) >= 30 and 'python_loop/losses' in python
    for name in python:
        np.testing.assert_array_equal(results[name], results[name[len('python_loop/'):]],
                                      err_msg=name)


def _runs(*keys):
    if not RUN.issuperset(keys):
        pytest.skip('%s run(s) with make sweep (SWEEP=1)' % ' and '.join(sorted(set(keys) - RUN)))
