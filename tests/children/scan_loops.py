"""Child: every kind of recurrent layer, trained with Scan's compiled loop
and with its Python loop, from the same start; prints one JSON line.

One functional model holds SimpleRNN, GRU and LSTM (all three
``consume_less`` modes), a mask, ``go_backwards``, ``return_sequences``,
stacked layers, dropout inside the step, stateful layers and a
TimeDistributed Dense, so its train function is compiled once; the two
loops then run the same compiled function for three steps.  Every shared variable
(weights, optimizer state, random generator states, the stateful layers'
states) is put back between the two runs.

    python scan_loops.py        (under the parent's THEANO_FLAGS)
"""
import gc
import json

import numpy as np
import theano
from keras.layers import (GRU, LSTM, Dense, Flatten, Input, Masking, SimpleRNN,
                          TimeDistributed, merge)
from keras.models import Model

from theano_multigpu.compat import compiled_scan

from scan_calls import count_compiled_calls

BATCH, TIMESTEPS, FEATURES, STEPS = 12, 6, 5, 3


def build_model():
    sequence = Input(batch_shape=(BATCH, TIMESTEPS, FEATURES))
    masked = Masking(mask_value=0.)(sequence)
    simple = SimpleRNN(7, return_sequences=True)(sequence)
    simple = Flatten()(TimeDistributed(Dense(3))(simple))
    backwards = GRU(6, go_backwards=True, consume_less='mem')(masked)
    stacked = LSTM(6, return_sequences=True, go_backwards=True, consume_less='gpu')(masked)
    stacked = LSTM(5, consume_less='mem', dropout_W=0.2, dropout_U=0.3)(stacked)
    stateful_lstm = LSTM(5, stateful=True)(sequence)
    stateful_gru = GRU(4, stateful=True, return_sequences=True, consume_less='gpu')(sequence)
    stateful_gru = SimpleRNN(4, dropout_U=0.25)(stateful_gru)
    joined = merge([simple, backwards, stacked, stateful_lstm, stateful_gru], mode='concat')
    model = Model(sequence, Dense(3, activation='softmax')(joined))
    model.compile(loss='categorical_crossentropy', optimizer='adam')
    return model


def data():
    rng = np.random.RandomState(0)
    x = rng.randn(BATCH, TIMESTEPS, FEATURES).astype('float32')
    for row, padding in enumerate(rng.randint(0, 3, BATCH)):
        x[row, :padding] = 0.  # masked timesteps at the start
    y = np.eye(3, dtype='float32')[rng.randint(0, 3, BATCH)]
    return x, y


def shared_variables():
    return [v for v in gc.get_objects() if isinstance(v, theano.compile.SharedVariable)]


def main():
    counted = count_compiled_calls()
    description = compiled_scan.loop_description()

    model = build_model()
    x, y = data()
    model.train_on_batch(x, y)  # compiles, and creates the optimizer's state
    variables = shared_variables()
    start = [v.get_value() for v in variables]
    initial = model.get_weights()
    runs = {}
    for loop in ('compiled', 'python'):
        theano.config.multigpu.scan_loop = loop
        for variable, value in zip(variables, start):
            variable.set_value(value)
        counted['calls'] = 0
        losses = [float(model.train_on_batch(x, y)) for _ in range(STEPS)]
        runs[loop] = {'losses': losses, 'weights': model.get_weights(),
                      'calls': counted['calls']}
    arrays = list(zip(runs['compiled']['weights'], runs['python']['weights']))
    print('RESULT ' + json.dumps({
        'loop': description,
        'calls': {loop: run['calls'] for loop, run in runs.items()},
        'losses': {loop: run['losses'] for loop, run in runs.items()},
        'arrays': len(arrays),
        'unequal_arrays': sum(not np.array_equal(a, b) for a, b in arrays),
        'largest_difference': max(float(np.max(np.abs(a - b))) for a, b in arrays),
        'weights_moved': min(float(np.max(np.abs(a - b))) for a, b
                             in zip(runs['compiled']['weights'], initial)),
    }))


if __name__ == '__main__':
    main()
