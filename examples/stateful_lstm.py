"""Keras 1.2.2's examples/stateful_lstm.py: two stateful LSTMs learn to
predict a damped cosine, one timestep at a time, 2000 batches an epoch.

The model, the data and the training loop are Keras's; only the number of
epochs is an option (Keras's example trains 25), and the script prints each
epoch's loss instead of plotting.  Run it on any backend:
    KERAS_BACKEND=theano_multigpu python examples/stateful_lstm.py --epochs 1
"""
from __future__ import print_function

import argparse
import time

import numpy as np

from keras.models import Sequential
from keras.layers import Dense, LSTM

# Keras's: steps of the LSTM, samples a batch, steps ahead to predict.
TSTEPS = 1
BATCH_SIZE = 25
LAHEAD = 1


def gen_cosine_amp(amp=100, period=1000, x0=0, xn=50000, step=1, k=0.0001):
    """A damped cosine of shape (xn - x0, 1, 1): Keras's data."""
    cos = np.zeros(((xn - x0) * step, 1, 1))
    for i in range(len(cos)):
        idx = x0 + i * step
        cos[i, 0, 0] = amp * np.cos(2 * np.pi * idx / period)
        cos[i, 0, 0] = cos[i, 0, 0] * np.exp(-k * idx)
    return cos


def build_model():
    model = Sequential()
    model.add(LSTM(50, batch_input_shape=(BATCH_SIZE, TSTEPS, 1), return_sequences=True,
                   stateful=True))
    model.add(LSTM(50, return_sequences=False, stateful=True))
    model.add(Dense(1))
    model.compile(loss='mse', optimizer='rmsprop')
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--epochs', type=int, default=25, help="epochs (Keras's: 25)")
    parser.add_argument('--samples', type=int, default=50000,
                        help="samples of the cosine (Keras's: 50000; a multiple of 25)")
    args = parser.parse_args()
    cos = gen_cosine_amp(xn=args.samples)
    expected_output = np.zeros((len(cos), 1))
    for i in range(len(cos) - LAHEAD):
        expected_output[i, 0] = np.mean(cos[i + 1:i + LAHEAD + 1])
    model = build_model()
    for i in range(args.epochs):
        start = time.time()
        history = model.fit(cos, expected_output, batch_size=BATCH_SIZE, verbose=0,
                            nb_epoch=1, shuffle=False)
        model.reset_states()
        print('epoch %d/%d: loss %.4f, %.1f s' % (i + 1, args.epochs,
                                                  history.history['loss'][-1],
                                                  time.time() - start), flush=True)
    predicted_output = model.predict(cos, batch_size=BATCH_SIZE)
    print('prediction: mean squared error %.4f'
          % float(np.mean((predicted_output - expected_output) ** 2)))


if __name__ == '__main__':
    main()
