"""Weights are never stale, batch-wise and layer-wise (pocl contexts).

tests/children/fit_digits.py fits an MLP on the digits with ModelCheckpoint,
EarlyStopping, ReduceLROnPlateau and LearningRateScheduler, then saves, sets
and reloads weights; it runs on one context, batch-wise on two and
layer-wise on two, side by side.  Plain Keras-Theano (no shim, on the CPU)
then loads the files each multi-context run saved.
"""
import os

import numpy as np
import pytest

from conftest import CHILDREN, ONE, TWO, needs_pocl, run_python, run_side_by_side

pytestmark = needs_pocl

# Batch-wise, every weight with a row per context is split into blocks
# (shard_split=0): saved, loaded and read by callbacks whole.
CONFIGURATIONS = {'one': ONE, 'batch': TWO + ',multigpu.shard_split=0',
                  'layer': TWO + ',multigpu.mode=layer'}
MODES = ['batch', 'layer']
RTOL, ATOL = 1e-4, 1e-6


@pytest.fixture(scope='module')
def fits(tmp_path_factory):
    """({configuration: fit_digits.py's results}, {mode: what plain Keras
    computed from that mode's files})."""
    base = tmp_path_factory.mktemp('fits')

    def fit(key, slot):
        home = base / key
        home.mkdir()
        run_python(home, flags=CONFIGURATIONS[key], timeout=3600, slot=slot,
                   args=[os.path.join(CHILDREN, 'fit_digits.py'), 'train', str(home)])
        return home

    def load(key, slot):
        run_python(homes[key], backend='theano', extra_env={'THEANO_MULTIGPU_COMPAT': '1'},
                   slot=slot,
                   args=[os.path.join(CHILDREN, 'fit_digits.py'), 'load', str(homes[key])])
        return dict(np.load(str(homes[key] / 'loaded.npz')))

    homes = run_side_by_side(CONFIGURATIONS, fit)
    loaded = run_side_by_side(MODES, load)
    return ({key: dict(np.load(str(home / 'results.npz'))) for key, home in homes.items()},
            loaded)


@pytest.mark.parametrize('mode', MODES)
def test_fit_with_callbacks_matches_one_context(fits, mode):
    results, _ = fits
    one, two = results['one'], results[mode]
    assert sorted(one) == sorted(two)
    assert int(two['epochs']) == int(one['epochs'])
    assert 1 < int(one['epochs']) < 6   # EarlyStopping stopped it
    for key in sorted(one):
        np.testing.assert_allclose(two[key], one[key], rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.mark.parametrize('mode', MODES)
def test_weights_are_never_stale(fits, mode):
    results, _ = fits
    two = results[mode]
    assert not np.allclose(two['pred_half'], two['pred'], atol=1e-3)
    assert not np.allclose(two['pred_zero_kernel'], two['pred_half'], atol=1e-3)
    np.testing.assert_allclose(two['pred_reloaded'], two['pred'], rtol=1e-6, atol=1e-7)
    assert two['pred_checkpoint'].shape == two['pred'].shape


@pytest.mark.parametrize('mode', MODES)
def test_files_saved_on_several_contexts_load_in_plain_keras(fits, mode):
    results, loaded = fits
    np.testing.assert_allclose(loaded[mode]['pred_model'], results[mode]['pred'],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loaded[mode]['pred_weights'], results[mode]['pred'],
                               rtol=1e-5, atol=1e-6)
