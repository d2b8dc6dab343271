"""The batch-wise row analysis over Keras 1.2.2's layers, without compiling:
every layer class the Theano backend builds keeps the batch's rows apart
(or meets them only where the split makes it exact), and Lambdas that
regroup, count or loop over the rows, read a whole-batch tensor other than
row by row, or use an op no rule knows, are found, with the op, the layer
and why: the rewrite computes them over the whole batch.

What these graphs compute on several contexts is compared with one context
in test_batchwise.py (the 'zoo' model uses the rules added here, the
'rows_meet' model the whole-batch ops) and under MPI in test_mpi.py.
"""
import json
import os

import pytest

from conftest import CHILDREN, run_python


@pytest.fixture(scope='module')
def analysed(tmp_path_factory):
    home = tmp_path_factory.mktemp('rows_analysis')
    result = run_python(home, flags='device=cpu',
                        args=[os.path.join(CHILDREN, 'row_analysis.py')], timeout=600)
    return json.loads(result.stdout.strip().split('\n')[-1])


LAYER_MODELS = ['dense', 'conv2d', 'conv1d', 'conv3d', 'conv3d2d', 'deconv', 'recurrent',
                'stateful', 'convlstm', 'word_dropout', 'merge']


@pytest.mark.parametrize('name', LAYER_MODELS)
def test_every_keras_layer_keeps_the_rows_apart(analysed, name):
    assert 'computed_whole' not in analysed[name], analysed[name]
    assert 'frontier_rows' not in analysed[name], analysed[name]


def test_what_the_split_needs_is_found(analysed):
    """Noise and dropout masks of the batch's shape are whole-batch draws
    (GaussianNoise, GaussianDropout and Dropout; the recurrent layers'
    dropout_W and dropout_U masks); BatchNormalization is synchronised;
    LocallyConnected's reshapes are checked as they run."""
    assert analysed['dense']['whole'] == 3
    assert analysed['recurrent']['whole'] > 0
    assert analysed['conv2d']['synced'] == 1
    assert analysed['conv2d']['checks'] > 0 and analysed['conv1d']['checks'] > 0
    for name in ('conv3d', 'conv3d2d', 'deconv', 'stateful', 'convlstm', 'word_dropout',
                 'merge'):
        assert analysed[name] == {'whole': 0, 'synced': 0, 'checks': 0}, name


WHOLE = {
    'regrouped': ('Reshape{2}', "reshapes the batch's rows across other axes"),
    'counted': ('Subtensor{::, int64::}', 'uses K.shape(x)[0], the number of rows, as a number'),
    # A draw's mean is the whole batch's on one device, a slice's on a replica.
    'rescaled': ('Elemwise{true_div,no_inplace}', "meets the rows with a tensor made from "
                 "the whole batch's shape (a count, range or draw of it) other than row by row"),
    # (Scan's sequence starts at x[0:]; the loop itself reads it whole.)
    'looped': ('Subtensor{int64::}', "indexes along the batch's rows"),
    'unknown': ('DiffOp{n=1, axis=1}', 'is an op theano_multigpu has no rule for'),
    # Keras 1.0's Convolution3D takes them along time, never the rows.
    'diagonal': ('DiagonalSubtensor', "takes diagonals across the batch's rows"),
    # The shape of a draw of the batch's shape counts the rows.
    'draw_counted': ('Elemwise{true_div,no_inplace}', "meets the rows with a tensor made "
                     "from the whole batch's shape (a count, range or draw of it) other than "
                     "row by row"),
}


@pytest.mark.parametrize('name', sorted(WHOLE))
def test_lambdas_where_rows_meet_are_computed_over_the_whole_batch(analysed, name):
    op, why = WHOLE[name]
    found = analysed[name].get('computed_whole', [])
    assert any(entry[:2] == [name, op] and entry[2].startswith(why) for entry in found), found


def test_a_layer_output_with_its_rows_off_the_first_axis_is_joined_along_theirs(analysed):
    assert analysed['transposed'] == {'whole': 0, 'synced': 0, 'checks': 0,
                                      'frontier_rows': [1]}


def test_a_range_of_the_rows_is_read_row_by_row(analysed):
    """K.arange(K.shape(x)[0]) meeting the rows elementwise: each replica
    takes its rows of the whole batch's range, as it does of a draw."""
    assert analysed['positions'] == {'whole': 1, 'synced': 0, 'checks': 0}


def test_a_reshape_only_the_run_can_judge_is_checked(analysed):
    """K.reshape of rows moved off axis 0: whether each row keeps a block
    of its own depends on a size Theano cannot tell before the run."""
    assert analysed['moved'] == {'whole': 0, 'synced': 0, 'checks': 1}


def test_batch_normalisation_with_statistics_of_its_own_is_computed_over_the_batch(analysed):
    """Keras 1.0's BatchNormalization computes its statistics with K.mean
    over the rows: by default (multigpu.batchnorm=sync) they are computed
    over the whole batch, as one device computes them; with
    multigpu.batchnorm=local each context's rows are its batch, by
    choice."""
    found = analysed['old_batchnorm'].get('computed_whole', [])
    assert ['own_statistics', 'Sum{axis=[0], acc_dtype=float64}',
            "reduces over the batch's rows (axis 0)"] in found, found
    assert analysed['old_batchnorm_local'] == {'whole': 0, 'synced': 0, 'checks': 0}
    found = analysed['gram_batchnorm'].get('computed_whole', [])
    assert ['gram', 'dot', 'multiplies rows with rows (a product over the batch)'] in found, found
