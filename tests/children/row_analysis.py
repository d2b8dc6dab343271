"""Child script: the batch-wise row analysis of Keras 1.2.2's layers and of
Lambdas that make the rows meet, without compiling anything.

    python row_analysis.py

Prints one JSON object: for each model, {"whole": n, "synced": n,
"checks": n} (whole-batch operands, synchronised batch normalisations,
shape conditions checked as it runs) and, where there are any,
"computed_whole": [[layer, op, why]] (the ops computed over the whole
batch) and "frontier_rows" (the axis of each output's rows, where one is
not 0).
"""
import json

import keras.backend as K
import numpy as np
import theano
import theano.tensor as T
from keras.layers import (ELU, GRU, LSTM, SReLU, Activation, ActivityRegularization,
                          AtrousConvolution1D, AtrousConvolution2D, AveragePooling1D,
                          AveragePooling2D, AveragePooling3D, BatchNormalization,
                          Bidirectional, ConvLSTM2D, Convolution1D, Convolution2D,
                          Convolution3D, Cropping1D, Cropping2D, Cropping3D, Deconvolution2D,
                          Dense, Dropout, Embedding, Flatten, GaussianDropout, GaussianNoise,
                          GlobalAveragePooling2D, GlobalAveragePooling3D, GlobalMaxPooling1D,
                          Highway, Input, Lambda, LeakyReLU, LocallyConnected1D,
                          LocallyConnected2D, Masking, MaxoutDense, MaxPooling1D,
                          MaxPooling2D, MaxPooling3D, ParametricSoftplus, Permute, PReLU,
                          RepeatVector, Reshape, SimpleRNN, ThresholdedReLU, TimeDistributed,
                          UpSampling1D, UpSampling2D, UpSampling3D, ZeroPadding1D,
                          ZeroPadding2D, ZeroPadding3D, merge)
from keras.engine import Layer
from keras.models import Model, Sequential
from theano.tensor.nnet import conv3d2d

from theano_multigpu.graph.rows import find_rows_meeting
from theano_multigpu.keras_adapter import keras_graph

TH = {'dim_ordering': 'th'}


def layer_models():
    """Models that together use every layer class keras.layers exports in
    1.2.2 that the Theano backend builds (SeparableConvolution2D is
    TensorFlow's alone)."""
    yield 'dense', Sequential([
        Dense(4, input_dim=6), Activation('softmax'), Dropout(0.2), GaussianNoise(0.1),
        GaussianDropout(0.1), ActivityRegularization(0.1), LeakyReLU(), PReLU(), ELU(),
        ParametricSoftplus(), ThresholdedReLU(), SReLU(), Highway(), MaxoutDense(3),
        RepeatVector(3), Permute((2, 1)), Reshape((-1,)), Reshape((3, 3)), Flatten()])
    yield 'conv2d', Sequential([
        ZeroPadding2D(input_shape=(2, 8, 8), **TH), Convolution2D(3, 3, 3, **TH),
        AtrousConvolution2D(2, 3, 3, atrous_rate=(2, 2), border_mode='same', **TH),
        MaxPooling2D(**TH), UpSampling2D(**TH), AveragePooling2D(**TH),
        Cropping2D(((1, 1), (1, 1)), **TH), BatchNormalization(axis=1),
        LocallyConnected2D(2, 2, 2, **TH), GlobalAveragePooling2D(**TH)])
    yield 'conv1d', Sequential([
        Embedding(10, 4, input_length=16), ZeroPadding1D(), Convolution1D(3, 3),
        AtrousConvolution1D(3, 3), MaxPooling1D(), UpSampling1D(), AveragePooling1D(),
        Cropping1D((1, 1)), LocallyConnected1D(2, 2), GlobalMaxPooling1D()])
    yield 'conv3d', Sequential([
        ZeroPadding3D(input_shape=(1, 4, 4, 4), **TH), Convolution3D(2, 2, 2, 2, **TH),
        MaxPooling3D(**TH), UpSampling3D(**TH), AveragePooling3D(pool_size=(1, 1, 1), **TH),
        Cropping3D(**TH), GlobalAveragePooling3D(**TH)])
    # Keras 1.0's Convolution3D: Theano's conv3d2d (a diagonal view).
    filters = K.variable(np.ones((2, 2, 1, 2, 2)))
    yield 'conv3d2d', Sequential([Lambda(lambda x: conv3d2d.conv3d(x, filters),
                                         output_shape=(2, 2, 3, 3), input_shape=(3, 1, 4, 4))])
    yield 'deconv', Sequential([Deconvolution2D(2, 3, 3, output_shape=(None, 2, 10, 10),
                                                input_shape=(1, 8, 8), **TH)])
    yield 'recurrent', Sequential([
        Masking(input_shape=(5, 3)), SimpleRNN(4, return_sequences=True),
        GRU(4, return_sequences=True, go_backwards=True),
        LSTM(4, return_sequences=True, dropout_W=0.1, dropout_U=0.1),
        TimeDistributed(Dense(3)), Bidirectional(LSTM(2))])
    yield 'stateful', Sequential([
        LSTM(4, batch_input_shape=(4, 5, 3), return_sequences=True, stateful=True),
        TimeDistributed(Dense(3))])
    yield 'convlstm', Sequential([ConvLSTM2D(2, 3, 3, input_shape=(3, 1, 6, 6),
                                             border_mode='same', **TH)])
    # Embedding's word dropout: a draw over the vocabulary, not the rows.
    yield 'word_dropout', Sequential([Embedding(10, 4, input_length=6, dropout=0.2),
                                      LSTM(3)])
    a, b = Input((4,)), Input((4,))
    merged = [merge([a, b], mode=mode) for mode in ('sum', 'mul', 'concat', 'ave', 'max',
                                                    'cos', 'dot')]
    merged.append(merge([a, b], mode=lambda t: t[0] - t[1], output_shape=(4,)))
    yield 'merge', Model([a, b], merged)


# Lambdas: {name: code of x} whose ops make the rows meet, or that no rule
# knows; or ('moved') whose rows stay apart only for shapes the run tells;
# or ('positions') that meet a tensor made for the whole batch row by row.
LAMBDAS = {
    'regrouped': 'K.reshape(x, (2, -1))',
    'moved': 'K.reshape(K.permute_dimensions(x, (1, 0)), (-1, 4))',
    'positions': "x * K.cast(K.arange(K.shape(x)[0]), 'float32').dimshuffle(0, 'x')",
    'counted': 'x[:, K.shape(x)[0] % 2:]',
    'rescaled': '(lambda m: x * m / K.mean(m))(K.random_binomial(K.shape(x), p=0.5))',
    'looped': 'theano.scan(lambda r: r * 2, sequences=x)[0]',
    'unknown': 'T.extra_ops.diff(x, axis=1)',
    'transposed': 'K.transpose(x)',
    'diagonal': 'conv3d2d.diagonal_subtensor(x, 0, 1)',
    # The count of a draw of the batch's shape is the rows' count.
    'draw_counted': "x / K.cast(K.shape(K.random_binomial(K.shape(x)))[0], 'float32')",
}


def lambda_models():
    for name, code in sorted(LAMBDAS.items()):
        yield name, Sequential([Dense(4, input_dim=3),
                                Lambda(eval('lambda x: ' + code), output_shape=lambda s: s,
                                       name=name)])


def _own_statistics(self, x, mask=None):
    mean = K.mean(x, axis=0)
    return (x - mean) / K.sqrt(K.mean(K.square(x - mean), axis=0) + 1e-3)


# Keras 1.0's BatchNormalization, as far as the rows go (the shim knows
# the layer by its class's name): statistics of its own, K.mean over the
# rows, not Theano's batch normalisation.
OldBatchNormalization = type('BatchNormalization', (Layer,), {'call': _own_statistics})
# One whose rows meet other than by a reduction: local would not help.
GramBatchNormalization = type('BatchNormalization', (Layer,), {
    'call': lambda self, x, mask=None: K.dot(K.transpose(x), x),
    'get_output_shape_for': lambda self, shape: (shape[1], shape[1])})


def statistics_models():
    """(name, model, multigpu.batchnorm is sync)"""
    model = Sequential([Dense(4, input_dim=3), OldBatchNormalization(name='own_statistics')])
    yield 'old_batchnorm', model, True
    yield 'old_batchnorm_local', model, False
    yield 'gram_batchnorm', Sequential([Dense(4, input_dim=3),
                                        GramBatchNormalization(name='gram')]), True


def analyse(model, sync_batchnorm=True):
    outputs = model.outputs
    found = find_rows_meeting(list(model.inputs) + keras_graph.row_states(outputs), outputs,
                              keras_graph.node_describer(outputs), sync_batchnorm)
    result = {'whole': len(found.whole), 'synced': len(found.synced),
              'checks': len(found.checks)}
    if found.computed_whole:
        result['computed_whole'] = [[w.layer, str(w.node.op), w.why]
                                    for w in found.computed_whole]
    if found.frontier_rows != [0] * len(outputs):
        result['frontier_rows'] = found.frontier_rows
    return result


def main():
    assert K and T and theano   # the Lambdas' code reads them
    found = dict((name, analyse(model)) for models in (layer_models, lambda_models)
                 for name, model in models())
    found.update((name, analyse(model, sync)) for name, model, sync in statistics_models())
    print(json.dumps(found))


if __name__ == '__main__':
    main()
