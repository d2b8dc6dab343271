"""Child: builds small Sequential models from layer names and trains them,
one JSON request per line on stdin, one JSON answer per line on stdout.

    {"layers": ["dense", "centre", ...], "steps": 3}
    -> {"weights": [[...], ...], "losses": [...]}

The same request gives the same weights and data in every configuration
(numpy and Keras's generators are seeded from the request), so the tests
can compare one context with several.
"""
import json
import os
import sys

import numpy as np

# The weights every backend starts from: benchmarks/models.py, shared with the benchmarks.
sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'benchmarks'))
from models import set_random_weights  # noqa: E402

# name: the layer's code (``K`` is keras.backend); the batch's rows meet in
# the last four, which batch-wise mode computes over the whole batch.
LAYERS = {
    'dense': "Dense(6, activation='tanh')",
    'relu': "Dense(6, activation='relu')",
    'dropout': 'Dropout(0.3)',
    'noise': 'GaussianNoise(0.2)',
    'batchnorm': 'BatchNormalization()',
    'rowwise': 'Lambda(lambda x: 2 * x - K.mean(x, axis=1, keepdims=True))',
    'softplus': "Activation('softplus')",
    'centre': 'Lambda(lambda x: x - K.mean(x, axis=0, keepdims=True))',
    'similarity': 'Lambda(lambda x: K.dot(K.dot(x, K.transpose(x)), x) / 10)',
    'counted': "Lambda(lambda x: x * K.cast(K.shape(x)[0], 'float32') / 10)",
    'reversed': 'Lambda(lambda x: x[::-1])',
}
ROWS_MEET = ('centre', 'similarity', 'counted', 'reversed')


def train(layers, steps):
    import keras.backend as K
    from keras.layers import (Activation, BatchNormalization, Dense, Dropout, GaussianNoise,
                              Lambda)
    from keras.models import Sequential
    from keras.optimizers import SGD
    seed = sum(ord(c) for c in ''.join(layers)) + len(layers)
    np.random.seed(seed)   # Keras seeds its random streams from numpy's
    rng = np.random.RandomState(seed)
    names = dict(K=K, Activation=Activation, BatchNormalization=BatchNormalization,
                 Dense=Dense, Dropout=Dropout, GaussianNoise=GaussianNoise, Lambda=Lambda)
    model = Sequential([Dense(6, input_dim=5, activation='tanh')]
                       + [eval(LAYERS[name], names) for name in layers] + [Dense(3)])
    model.compile(loss='mse', optimizer=SGD(lr=0.05))
    set_random_weights(model, rng, 0.4)
    x = rng.rand(10, 5).astype('float32')
    y = rng.rand(10, 3).astype('float32')
    losses = [float(model.train_on_batch(x, y)) for _ in range(steps)]
    return {'losses': losses, 'weights': [w.tolist() for w in model.get_weights()]}


def main():
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(train(request['layers'], request['steps'])), flush=True)


if __name__ == '__main__':
    main()
