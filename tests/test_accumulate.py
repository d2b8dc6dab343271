"""Micro-batches (multigpu.accumulate) chosen by the plan, and refused.

One child on two pocl contexts trains a model whose step does not fit a
budget, which ``auto`` then computes as micro-batches, against the same
model trained at once without the budget;
a layer output that both the loss and a later layer read, and an input's
gradient, as micro-batches and at once; then asks for what no number of
micro-batches can give.
"""
import re

import pytest

from conftest import TWO, needs_pocl, run_python

pytestmark = needs_pocl

AUTO = '''
    import sys
    import numpy as np
    import theano
    from keras.layers import BatchNormalization, Dense, Dropout
    from keras.models import Sequential
    from sklearn.datasets import load_digits
    from theano_multigpu.config import mesh
    from theano_multigpu.errors import ConfigurationError, PlanError
    from theano_multigpu.graph import peak_plan

    digits = load_digits()
    x = (digits.data / 16.).astype('float32')[:512]
    y = np.eye(10, dtype='float32')[digits.target][:512]

    def mlp(*extra):
        np.random.seed(0)
        model = Sequential([Dense(256, input_dim=64, activation='relu'), *extra,
                            Dense(256, activation='relu'), Dense(10, activation='softmax')])
        model.compile(loss='categorical_crossentropy', optimizer='adam',
                      metrics=['accuracy'])
        return model

    def steps(model, rows=512):
        return [model.train_on_batch(x[:rows], y[:rows]) for _ in range(2)]

    whole = mlp()
    whole_losses = steps(whole)
    planned = peak_plan.peaks_and_room(whole.model.train_function.function,
                                       [x, y, np.ones(len(x), 'float32')], mesh.current())
    peak = max(need for _, need, _ in planned)
    theano.config.multigpu.device_memory = str(int(0.8 * peak))
    sys.stderr.write('budget %d of %d\\n' % (int(0.8 * peak), peak))
    micro = mlp()
    micro_losses = steps(micro)
    print('losses', np.allclose(micro_losses, whole_losses, rtol=1e-4, atol=1e-6))
    print('weights', all(np.allclose(a, b, rtol=1e-4, atol=1e-6)
                         for a, b in zip(micro.get_weights(), whole.get_weights())))
    print('predict', np.allclose(micro.predict(x, batch_size=512),
                                 whole.predict(x, batch_size=512), rtol=1e-4, atol=1e-6))

    # Weights alone above the room: no number of micro-batches fits.
    theano.config.multigpu.device_memory = '1KiB'
    try:
        steps(micro, rows=500)
    except PlanError as error:
        print('none_fits', str(error).replace('\\n', ' | '))

    # A layer output the loss reads (an activity regulariser) that the next
    # layer reads too, Dropout (each micro-batch its rows of the whole
    # batch's mask), and the gradient of an input (a saliency map), each at
    # once and as 2 micro-batches per context.
    from keras import backend as K
    from keras.regularizers import activity_l2
    theano.config.multigpu.device_memory = ''
    found = {}
    for micro_batches in ('1', '2'):
        theano.config.multigpu.accumulate = micro_batches
        np.random.seed(1)
        model = Sequential([Dense(40, input_dim=64, activation='tanh',
                                  activity_regularizer=activity_l2(0.1)),
                            Dropout(0.25), Dense(10, activation='softmax')])
        model.compile(loss='categorical_crossentropy', optimizer='sgd')
        losses = [model.train_on_batch(x[:64], y[:64]) for _ in range(2)]
        saliency = K.function([model.input, K.learning_phase()],
                              K.gradients(K.sum(model.output[:, 0]), [model.input]))
        found[micro_batches] = (losses, model.get_weights(), saliency([x[:64], 0])[0])
    (losses_1, weights_1, saliency_1), (losses_2, weights_2, saliency_2) = found.values()
    print('regulariser', np.allclose(losses_2, losses_1, rtol=1e-4, atol=1e-6),
          all(np.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(weights_2, weights_1)))
    print('saliency', np.allclose(saliency_2, saliency_1, rtol=1e-4, atol=1e-6),
          np.abs(saliency_1).sum() > 0)

    # The rows of micro-batches meet in BatchNormalization's statistics.
    try:
        steps(mlp(BatchNormalization(mode=0)), rows=64)
    except ConfigurationError as error:
        print('meet', error)
'''


def test_auto_computes_a_step_that_does_not_fit_as_micro_batches_with_its_numbers(home):
    """With a budget of 80% of the step's planned peak at 512 rows, ``auto``
    computes the step as micro-batches, says how many, and trains to the
    weights, losses and predictions of the step at once; so do an activity
    regulariser (a layer output the loss and the next layer read), Dropout
    and an input's gradient as 2 micro-batches; with a budget below the weights it
    stops with the plan and why micro-batches cannot help; with
    BatchNormalization's whole-batch statistics it stops, naming the layer,
    before compiling.  With multigpu.progress=0 each compile prints its
    phases on stderr, the last line their times."""
    result = run_python(home, AUTO, flags=TWO + ',multigpu.progress=0')
    lines = dict(line.split(' ', 1) for line in result.stdout.splitlines() if ' ' in line)
    chosen = [line for line in result.stderr.splitlines() if 'multigpu.accumulate=auto' in line
              and 'micro-batches' in line and 'does not fit at once' in line]
    assert len(chosen) == 1, result.stderr
    assert "Keras's train function: a batch of 512 rows does not fit at once on 2 " \
        'context(s); each computes its rows as ' in chosen[0], chosen
    micro_batches = int(chosen[0].rsplit(' as ', 1)[1].split()[0])
    assert micro_batches >= 2
    assert lines['losses'] == 'True' and lines['weights'] == 'True', result.stdout
    assert lines['predict'] == 'True', result.stdout
    assert lines['regulariser'] == 'True True', result.stdout
    assert lines['saliency'] == 'True True', result.stdout
    refused = lines['none_fits']
    assert refused.startswith("Keras's train function expects each context to hold"), refused
    assert 'multigpu.accumulate=auto: its planned peak at 2 micro-batches per context' \
        in refused, refused
    _assert_progress_lines(result.stderr)
    meet = lines['meet']
    assert meet.startswith('multigpu.accumulate: each batch would be computed as 2 '
                           'micro-batches per context'), meet
    assert 'batchnormalization_1 (BatchNormalization' in meet, meet
    assert 'multigpu.batchnorm=local' in meet, meet


def _assert_progress_lines(stderr):
    """Every compile's progress: each phase in its order, never more ops
    linked than the graph has, and a last line whose phases add up to its
    total; the refused compile's last line says it stopped."""
    train = [line for line in stderr.splitlines()
             if line.startswith('Compil') and "Keras's train function (" in line]
    phases = [line.split(': ', 1)[1].split(',')[0].split(':')[0] for line in train
              if ' s (' not in line and 'stopped' not in line]
    order = ['rewriting the graph for the contexts', 'taking the gradients',
             "Theano's optimiser", 'linking']
    assert [phases.index(p) for p in order] == sorted(phases.index(p) for p in order), train
    for linked, ops in re.findall(r'linking: ([\d,]+) of ([\d,]+) ops', '\n'.join(train)):
        assert int(linked.replace(',', '')) <= int(ops.replace(',', '')), train
    finished = [line for line in train if line.startswith("Compiled Keras's train function")]
    assert finished, train
    for line in finished:
        total, split = re.search(r' in ([\d.]+) s \((.*); \d+ C modules? built\)$', line).groups()
        seconds = dict((p.split()[0], float(p.split()[1])) for p in split.split(', '))
        assert sorted(seconds) == ['gradients', 'link', 'optimise', 'rewrite'], line
        # (each figure rounded to 0.1 s)
        assert abs(sum(seconds.values()) - float(total)) <= 0.05 * (len(seconds) + 1) + 1e-9, \
            line
    assert any(line.startswith('Compiled K.function from ') for line in stderr.splitlines()), \
        stderr
    stopped = [line for line in train if 'stopped after' in line]
    assert len(stopped) == 1 and stopped[0].endswith(': ConfigurationError'), train
