"""The shim is installed and a Keras script trains through it on the CPU."""
from conftest import run_python


def test_backend_answers_theano_and_entries_are_the_shims(home):
    out = run_python(home, '''
        import keras.backend as K
        print(K.backend(), K.variable.__module__)
    ''').stdout.split()
    assert out == ['theano', 'theano_multigpu.keras_adapter']
