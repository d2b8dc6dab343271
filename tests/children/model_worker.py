"""Child: builds small Sequential models from layer names and trains them,
one JSON request per line on stdin, one JSON answer per line on stdout.

    {"layers": ["dense", "centre", ...], "steps": 3}
    -> {"weights": [[...], ...], "losses": [...]}  or  {"refused": "message"}

The same request gives the same weights and data in every configuration
(numpy and Keras's generators are seeded from the request), so the tests
can compare one context with several.  ``refused``: RowsMeetError's message.
"""
import json
import os
import sys

import numpy as np

# The weights every backend starts from: benchmarks/models.py, shared with the benchmarks.
sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'benchmarks'))
from models import set_random_weights  # noqa: E402

# name: the layer's code (``K`` is keras.backend); rows meet in the last two.
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
}
ROWS_MEET = ('centre', 'similarity')


def train(layers, steps):
    import keras.backend as K
    from keras.layers import (Activation, BatchNormalization, Dense, Dropout, GaussianNoise,
                              Lambda)
    from keras.models import Sequential
    from keras.optimizers import SGD
    from theano_multigpu.errors import RowsMeetError
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
    try:
        losses = [float(model.train_on_batch(x, y)) for _ in range(steps)]
    except RowsMeetError as error:
        return {'refused': str(error)}
    return {'losses': losses, 'weights': [w.tolist() for w in model.get_weights()]}


def main():
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(train(request['layers'], request['steps'])), flush=True)


if __name__ == '__main__':
    main()
