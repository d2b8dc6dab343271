"""Child: builds a small functional Keras model from drawn dimensions, or
one of the NAMED models of Keras scripts' patterns, and trains it, one JSON
request per line on stdin, one JSON answer per line on stdout.

    {"rnn": "lstm", "units": 1, "steps": 1, "features": 1, "dense_in": 3,
     "dense_units": 1, "channels": 1, "side": 3, "filters": 2, "kernel": 3,
     "batch": 2, "train_steps": 3}
    -> {"losses": [...], "weights": [[...], ...], "predictions": [...]}

    {"named": "word_dropout", "train_steps": 3}  -> the same answer

The drawn model has a recurrent, a Dense and a convolution branch, joined
and read by Dense(1), so one compile covers the three.  The same request
gives the same weights and data in every configuration (seeded from the
request).
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


def word_dropout(rng):
    """Keras's word dropout (Embedding's ``dropout``: a draw over the
    vocabulary) read by an LSTM and by a Convolution1D."""
    from keras.layers import LSTM, Convolution1D, Dense, Embedding, Flatten, Input, merge
    from keras.models import Model
    words = Input(shape=(6,), dtype='int32')
    embedded = Embedding(50, 8, input_length=6, dropout=0.2)(words)
    joined = merge([LSTM(4)(embedded), Flatten()(Convolution1D(3, 2)(embedded))],
                   mode='concat')
    model = Model(input=words, output=Dense(1, activation='sigmoid')(joined))
    model.compile(loss='binary_crossentropy', optimizer='adam')
    return model, rng.randint(0, 50, (12, 6)).astype('int32'), rng.randint(0, 2, (12, 1))


def deconvolution_fixed_batch(rng):
    """A Deconvolution2D, whose output_shape carries the batch size (Keras
    1 requires it), on an input of a fixed batch_shape, then Flatten."""
    from keras.layers import Convolution2D, Deconvolution2D, Dense, Flatten, Input
    from keras.models import Model
    batch = 8
    image = Input(batch_shape=(batch, 2, 5, 5))
    grown = Deconvolution2D(3, 3, 3, output_shape=(batch, 3, 7, 7), border_mode='valid',
                            dim_ordering='th')(image)
    features = Flatten()(Convolution2D(2, 3, 3, dim_ordering='th', activation='tanh')(grown))
    model = Model(image, Dense(1)(features))
    model.compile(loss='mse', optimizer='sgd')
    return (model, rng.rand(batch, 2, 5, 5).astype('float32'),
            rng.rand(batch, 1).astype('float32'))


def conv_lstm_fixed_batch(rng):
    """ConvLSTM2D on an input of a fixed batch_input_shape (its loop's
    convolutions carry the batch size), then Flatten."""
    from keras.layers import ConvLSTM2D, Dense, Flatten
    from keras.models import Sequential
    batch = 6
    model = Sequential([ConvLSTM2D(2, 3, 3, batch_input_shape=(batch, 2, 1, 4, 4),
                                   border_mode='same', dim_ordering='th'),
                        Flatten(), Dense(1)])
    model.compile(loss='mse', optimizer='sgd')
    return (model, rng.rand(batch, 2, 1, 4, 4).astype('float32'),
            rng.rand(batch, 1).astype('float32'))


NAMED = {'word_dropout': word_dropout, 'deconvolution_fixed_batch': deconvolution_fixed_batch,
         'conv_lstm_fixed_batch': conv_lstm_fixed_batch}


def drawn(spec, rng):
    model = build(spec)
    n = spec['batch']
    x = [rng.rand(n, spec['steps'], spec['features']).astype('float32'),
         rng.rand(n, spec['dense_in']).astype('float32'),
         rng.rand(n, spec['channels'], spec['side'], spec['side']).astype('float32')]
    return model, x, rng.rand(n, 1).astype('float32')


def train(spec):
    seed = sum(ord(c) for c in json.dumps(spec, sort_keys=True))
    np.random.seed(seed)   # Keras seeds its random streams from numpy's
    rng = np.random.RandomState(seed)
    model, x, y = NAMED[spec['named']](rng) if 'named' in spec else drawn(spec, rng)
    set_random_weights(model, rng, 0.5)
    n = len(y)
    losses = [float(model.train_on_batch(x, y)) for _ in range(spec['train_steps'])]
    return {'losses': losses, 'weights': [w.tolist() for w in model.get_weights()],
            'predictions': model.predict(x, batch_size=n).tolist()}


def main():
    for line in sys.stdin:
        print(json.dumps(train(json.loads(line))), flush=True)


if __name__ == '__main__':
    main()
