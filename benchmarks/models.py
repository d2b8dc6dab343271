"""The four Keras 1.x models that the parity tests and the benchmarks share.

    from models import MODELS, build
    case = build('cnn', size='test')        # after Keras is importable
    case.model.train_on_batch(case.x, case.y)

Everything is deterministic given ``seed``: the data and the initial weights
(set with ``set_weights``, so Keras's own initialisers do not matter).  The
module imports Keras only inside ``build``: importing it is free, and any
backend (stock Keras-Theano or theano_multigpu) can run the same code.

``size='test'`` gives tiny models (fast to compile and train, for the
parity tests); ``size='bench'`` gives models whose step takes milliseconds on
the CPU, so that a per-step overhead shows against real work.
"""
import collections

import numpy as np

__all__ = ['MODELS', 'DEEP_MODELS', 'BN_MODELS', 'WHOLE_BATCH_MODELS', 'EXAMPLE_MODELS',
           'SIZES', 'Case', 'build', 'set_random_weights']

MODELS = ('mlp', 'cnn', 'lstm', 'functional')
# Deeper models, for layer-wise mode (several layers to spread).
DEEP_MODELS = ('deep_mlp', 'deep_cnn')
# With BatchNormalization, for its synchronised and local statistics.
BN_MODELS = ('cnn_bn',)
# The mlp with one layer whose ops make the batch's rows meet, computed
# over the whole batch: centring (a mean over the rows) and in-batch
# attention (every row scored against every other).
WHOLE_BATCH_MODELS = ('mlp_centred', 'mlp_attention')
# Keras's own examples (examples/): their model and data, at their batch.
EXAMPLE_MODELS = ('stateful_lstm',)

# Per size: batch and the dimensions of each model.
SIZES = {
    'test': dict(batch=16, mlp=(8, 16, 3), cnn=(1, 8, 4, 3), lstm=(5, 4, 7, 3),
                 functional=(4, 3, 5), deep_mlp=(8, 16, 8, 3), deep_cnn=(1, 12, 4, 8, 3),
                 cnn_bn=(1, 8, 4, 8, 3)),
    'bench': dict(batch=64, mlp=(64, 256, 10), cnn=(1, 28, 16, 10), lstm=(20, 16, 64, 10),
                  functional=(32, 16, 64), deep_mlp=(64, 256, 8, 10),
                  deep_cnn=(1, 28, 32, 64, 10), cnn_bn=(1, 28, 16, 32, 10)),
}

Case = collections.namedtuple('Case', 'name model x y')


def set_random_weights(model, rng, scale):
    """Set every weight of ``model`` to ``scale`` x N(0, 1) draws from
    ``rng``, then each BatchNormalization's running std to a positive value
    (a variance is positive): the same weights on every backend."""
    model.set_weights([(rng.randn(*w.shape) * scale).astype('float32')
                       for w in model.get_weights()])
    for layer in model.layers:
        if hasattr(layer, 'running_std'):
            layer.running_std.set_value(np.abs(layer.running_std.get_value()) + 0.5)


def _onehot(rng, n, classes):
    return np.eye(classes, dtype='float32')[rng.randint(0, classes, n)]


def _whole_batch_layers(name):
    """The layer ``name`` (an mlp of WHOLE_BATCH_MODELS) adds."""
    import keras.backend as K
    from keras.layers import Lambda
    if name == 'mlp_centred':
        return [Lambda(lambda h: h - K.mean(h, axis=0), name='centre')]
    if name == 'mlp_attention':
        return [Lambda(lambda h: K.dot(K.softmax(K.dot(h, K.transpose(h)) / 16), h),
                       name='attention')]
    return []


def build(name, size='test', seed=1234, batch=None, dims=None):
    """A compiled model, its inputs and its targets (``Case``).

    ``name`` is one of MODELS.  The same (name, size, seed, batch, dims)
    gives the same weights and data on every backend; ``dims`` replaces
    the size's dimensions of the model (SIZES), e.g. (64, 1024, 10) for an
    mlp with 1024 units per hidden layer.
    """
    from keras.layers import (LSTM, BatchNormalization, Convolution2D, Dense, Flatten, Input,
                              MaxPooling2D, merge)
    from keras.models import Model, Sequential
    from keras.optimizers import SGD, Adam, RMSprop

    known = MODELS + DEEP_MODELS + BN_MODELS + WHOLE_BATCH_MODELS + EXAMPLE_MODELS
    if name not in known:
        raise ValueError('build expects a model name from %s, but received %r'
                         % (known, name))
    rng = np.random.RandomState(seed)
    if name == 'stateful_lstm':   # one batch of the example, whatever the size
        return _example(name, rng)
    dims = dict(SIZES[size], **({name: tuple(dims)} if dims is not None else {}))
    n = batch or dims['batch']
    if name in ('mlp',) + WHOLE_BATCH_MODELS:
        inputs, hidden, classes = dims['mlp']
        model = Sequential([Dense(hidden, input_dim=inputs, activation='relu')]
                           + _whole_batch_layers(name)
                           + [Dense(hidden, activation='tanh'),
                              Dense(classes, activation='softmax')])
        model.compile(loss='categorical_crossentropy', metrics=['accuracy'],
                      optimizer=SGD(lr=0.05, momentum=0.9, nesterov=True))
        x = rng.rand(n, inputs).astype('float32')
        y = _onehot(rng, n, classes)
    elif name == 'cnn':
        channels, side, filters, classes = dims['cnn']
        model = Sequential([
            Convolution2D(filters, 3, 3, input_shape=(channels, side, side),
                          activation='relu', dim_ordering='th'),
            MaxPooling2D((2, 2), dim_ordering='th'),
            Flatten(),
            Dense(classes, activation='softmax')])
        model.compile(loss='categorical_crossentropy', metrics=['accuracy'],
                      optimizer=Adam(lr=0.01))
        x = rng.rand(n, channels, side, side).astype('float32')
        y = _onehot(rng, n, classes)
    elif name == 'deep_mlp':
        inputs, hidden, depth, classes = dims['deep_mlp']
        layers = [Dense(hidden, input_dim=inputs, activation='relu')]
        layers += [Dense(hidden, activation='relu') for _ in range(depth - 1)]
        model = Sequential(layers + [Dense(classes, activation='softmax')])
        model.compile(loss='categorical_crossentropy', optimizer=Adam(lr=0.001))
        x = rng.rand(n, inputs).astype('float32')
        y = _onehot(rng, n, classes)
    elif name == 'deep_cnn':
        channels, side, narrow, wide, classes = dims['deep_cnn']
        conv = dict(activation='relu', dim_ordering='th', border_mode='same')
        model = Sequential([
            Convolution2D(narrow, 3, 3, input_shape=(channels, side, side), **conv),
            Convolution2D(narrow, 3, 3, **conv),
            MaxPooling2D((2, 2), dim_ordering='th'),
            Convolution2D(wide, 3, 3, **conv),
            Convolution2D(wide, 3, 3, **conv),
            MaxPooling2D((2, 2), dim_ordering='th'),
            Flatten(),
            Dense(wide, activation='relu'),
            Dense(classes, activation='softmax')])
        model.compile(loss='categorical_crossentropy', optimizer=Adam(lr=0.001))
        x = rng.rand(n, channels, side, side).astype('float32')
        y = _onehot(rng, n, classes)
    elif name == 'cnn_bn':
        channels, side, narrow, wide, classes = dims['cnn_bn']
        conv = dict(activation='relu', dim_ordering='th', border_mode='same', bias=False)
        model = Sequential([
            Convolution2D(narrow, 3, 3, input_shape=(channels, side, side), **conv),
            BatchNormalization(axis=1),
            MaxPooling2D((2, 2), dim_ordering='th'),
            Convolution2D(wide, 3, 3, **conv),
            BatchNormalization(axis=1),
            MaxPooling2D((2, 2), dim_ordering='th'),
            Flatten(),
            Dense(classes, activation='softmax')])
        model.compile(loss='categorical_crossentropy', optimizer=Adam(lr=0.001))
        x = rng.rand(n, channels, side, side).astype('float32')
        y = _onehot(rng, n, classes)
    elif name == 'lstm':
        steps, features, units, classes = dims['lstm']
        model = Sequential([LSTM(units, input_shape=(steps, features)),
                            Dense(classes, activation='softmax')])
        model.compile(loss='categorical_crossentropy', optimizer=RMSprop(lr=0.01))
        x = rng.rand(n, steps, features).astype('float32')
        y = _onehot(rng, n, classes)
    else:  # functional: two inputs, two outputs, loss weights
        size_a, size_b, hidden = dims['functional']
        a, b = Input(shape=(size_a,), name='in_a'), Input(shape=(size_b,), name='in_b')
        joined = merge([Dense(hidden, activation='tanh')(a),
                        Dense(hidden, activation='tanh')(b)], mode='concat')
        out1 = Dense(2, activation='softmax', name='out1')(joined)
        out2 = Dense(1, name='out2')(joined)
        model = Model(input=[a, b], output=[out1, out2])
        model.compile(loss=['categorical_crossentropy', 'mse'], loss_weights=[1.0, 0.5],
                      optimizer=SGD(lr=0.05, momentum=0.5), metrics=['accuracy'])
        x = [rng.rand(n, size_a).astype('float32'), rng.rand(n, size_b).astype('float32')]
        y = [_onehot(rng, n, 2), rng.rand(n, 1).astype('float32')]
    set_random_weights(model, rng, 0.2)
    return Case(name, model, x, y)


def _example(name, rng):
    """examples/<name>.py's model and its first batch of data."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        'examples', name + '.py')
    spec = importlib.util.spec_from_file_location('example_' + name, path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = example.build_model()
    x = example.gen_cosine_amp(xn=example.BATCH_SIZE).astype('float32')
    y = np.roll(x[:, 0], -1, axis=0)
    set_random_weights(model, rng, 0.2)
    return Case(name, model, x, y)
