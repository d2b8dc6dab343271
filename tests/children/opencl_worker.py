"""Child: builds a small functional Keras model from drawn dimensions and
trains it, one JSON request per line on stdin, one JSON answer per line on
stdout.

    {"rnn": "lstm", "units": 1, "steps": 1, "features": 1, "dense_in": 3,
     "dense_units": 1, "channels": 1, "side": 3, "filters": 2, "kernel": 3,
     "batch": 2, "train_steps": 3}
    -> {"losses": [...], "weights": [[...], ...], "predictions": [...]}

The model has a recurrent, a Dense and a convolution branch, joined and read
by Dense(1), so one compile covers the three.  The same request gives the
same weights and data in every configuration (seeded from the request).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'benchmarks'))
from models import set_random_weights  # noqa: E402


def build(spec):
    from keras.layers import GRU, LSTM, Convolution2D, Dense, Flatten, Input, SimpleRNN, merge
    from keras.models import Model
    from keras.optimizers import SGD
    recurrent = {'lstm': LSTM, 'gru': GRU, 'simple': SimpleRNN}[spec['rnn']]
    sequence = Input(shape=(spec['steps'], spec['features']))
    vector = Input(shape=(spec['dense_in'],))
    image = Input(shape=(spec['channels'], spec['side'], spec['side']))
    branches = [
        recurrent(spec['units'])(sequence),
        Dense(spec['dense_units'], activation='tanh')(vector),
        Flatten()(Convolution2D(spec['filters'], spec['kernel'], spec['kernel'],
                                border_mode='same', dim_ordering='th',
                                activation='tanh')(image))]
    model = Model(input=[sequence, vector, image], output=Dense(1)(merge(branches,
                                                                         mode='concat')))
    model.compile(loss='mse', optimizer=SGD(lr=0.1))
    return model


def train(spec):
    seed = sum(ord(c) for c in json.dumps(spec, sort_keys=True))
    np.random.seed(seed)
    rng = np.random.RandomState(seed)
    model = build(spec)
    set_random_weights(model, rng, 0.5)
    n = spec['batch']
    x = [rng.rand(n, spec['steps'], spec['features']).astype('float32'),
         rng.rand(n, spec['dense_in']).astype('float32'),
         rng.rand(n, spec['channels'], spec['side'], spec['side']).astype('float32')]
    y = rng.rand(n, 1).astype('float32')
    losses = [float(model.train_on_batch(x, y)) for _ in range(spec['train_steps'])]
    return {'losses': losses, 'weights': [w.tolist() for w in model.get_weights()],
            'predictions': model.predict(x, batch_size=n).tolist()}


def main():
    for line in sys.stdin:
        print(json.dumps(train(json.loads(line))), flush=True)


if __name__ == '__main__':
    main()
