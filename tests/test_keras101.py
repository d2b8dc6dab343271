"""Keras 1.0.1, the oldest supported release, trains and saves on Python 3.11.

tools/setup.sh installs it into .cache/keras-1.0.1 (the venv keeps Keras
1.2.2); the child Python finds it first through PYTHONPATH.
"""
import json
import os
import textwrap

import pytest

from conftest import KERAS_101, requires, run_python

pytestmark = requires(
    os.path.isfile(os.path.join(KERAS_101, 'keras', '__init__.py')),
    'needs Keras 1.0.1 in .cache/keras-1.0.1: run tools/setup.sh')

CONFIGS = {
    'shim': dict(backend='theano_multigpu', extra_env={}),
    'compat': dict(backend='theano', extra_env={'THEANO_MULTIGPU_COMPAT': '1'}),
}

SMOKE_RUN = '''
import json
import numpy as np
import keras
assert keras.__version__ == '1.0.1', keras.__version__
from keras.models import Sequential, model_from_yaml
from keras.layers import Dense
from keras.optimizers import Adam
from sklearn.datasets import load_digits
data = load_digits()
x = (data.data[:400] / 16.0).astype('float32')
y = np.eye(10, dtype='float32')[data.target[:400]]

def mlp(seed):
    np.random.seed(seed)
    return Sequential([Dense(32, input_dim=64, activation='relu'),
                       Dense(10, activation='softmax')])

model = mlp(0)
model.compile(Adam(lr=0.01), 'categorical_crossentropy', metrics=['accuracy'])
history = model.fit(x, y, nb_epoch=4, batch_size=50, verbose=0)
loss, accuracy = model.evaluate(x, y, verbose=0)
model.save_weights('w.h5', overwrite=True)
fresh = mlp(1)
differed = any(not np.array_equal(a, b) for a, b in zip(model.get_weights(), fresh.get_weights()))
fresh.load_weights('w.h5')
fresh.compile('adam', 'categorical_crossentropy')  # 1.0.1 predicts only when compiled
rebuilt = model_from_yaml(model.to_yaml())
print(json.dumps({
    'version': keras.__version__, 'backend_module': keras.backend.variable.__module__,
    'losses': history.history['loss'], 'loss': float(loss), 'accuracy': float(accuracy),
    'differed': differed,
    'same': all(np.array_equal(a, b) for a, b in zip(model.get_weights(), fresh.get_weights())),
    'same_prediction': bool(np.array_equal(model.predict(x), fresh.predict(x))),
    'yaml_layers': [type(l).__name__ for l in rebuilt.layers],
}))
'''


@pytest.mark.parametrize('config', ['compat', 'shim'])
def test_keras_101_mlp_fits_evaluates_and_round_trips_weights(home, config):
    env = dict(CONFIGS[config]['extra_env'], PYTHONPATH=KERAS_101)
    result = run_python(home, textwrap.dedent(SMOKE_RUN),
                        backend=CONFIGS[config]['backend'], extra_env=env)
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out['version'] == '1.0.1'
    if config == 'shim':
        assert out['backend_module'] == 'theano_multigpu.keras_adapter'
    losses = out['losses']
    assert losses[-1] < 0.8 * losses[0], losses
    assert out['accuracy'] > 0.5   # ten classes: chance is 0.1
    assert out['differed'] is True
    assert out['same'] is True
    assert out['same_prediction'] is True
    assert out['yaml_layers'] == ['Dense', 'Dense']
    config_file = json.loads((home / '.keras' / 'keras.json').read_text())
    assert config_file['backend'] == 'theano'
