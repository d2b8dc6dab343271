"""Turning the shim on, and leaving it off.

Every case is a fresh Python (``run_python``) with the installed start-up
hook: KERAS_BACKEND=theano_multigpu, ``python -m theano_multigpu run``,
``import theano_multigpu``, and the runs that must stay plain Keras-Theano.
The children print one JSON line.
"""
import json
import textwrap

import pytest

from conftest import run_python

ADAPTER = 'theano_multigpu.keras_adapter'
STOCK = 'keras.backend.theano_backend'

# What a script reports: the backend Keras answers, whose K.variable it
# calls, KERAS_BACKEND as the script sees it, and the same from a child
# Python that the script starts with the inherited environment.
REPORT = '''
import json, os, subprocess, sys
import keras.backend as K

CHILD = ("import collections, collections.abc, json, os; "
         "collections.Iterable = collections.abc.Iterable; "   # for stock Keras
         "import keras.backend as K; print(json.dumps("
         "[K.backend(), K.variable.__module__, os.environ.get('KERAS_BACKEND')]))")

def report(**extra):
    child = subprocess.run([sys.executable, '-c', CHILD], capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    print(json.dumps(dict(extra, backend=K.backend(), variable=K.variable.__module__,
                          env=os.environ.get('KERAS_BACKEND'),
                          child=json.loads(child.stdout.strip().splitlines()[-1]))))
'''

# Stock Keras 1.2.2 does not import on Python 3.11 (collections.Iterable);
# a plain run patches that itself, as a user of stock Keras-Theano must.
PLAIN_PRELUDE = '''
import collections, collections.abc
collections.Iterable = collections.abc.Iterable
'''
PLAIN_FLAGS = 'blas.ldflags='   # numpy 1.23 lost what Theano reads to find BLAS


def last_json(result):
    lines = result.stdout.strip().splitlines()
    assert lines, 'child printed nothing; stderr:\n' + result.stderr[-3000:]
    return json.loads(lines[-1])


def source(*parts):
    """The parts, each dedented on its own, joined."""
    return ''.join(textwrap.dedent(part) for part in parts)


def write_script(path, *parts):
    path.write_text(source(*parts))
    return str(path)


def test_keras_backend_variable_runs_an_unchanged_script(home):
    script = write_script(home / 'train.py', REPORT, '''
        from keras.models import Sequential
        from keras.layers import Dense
        import numpy as np
        model = Sequential([Dense(3, input_dim=4, activation='softmax')])
        model.compile('sgd', 'categorical_crossentropy')
        loss = model.train_on_batch(np.ones((2, 4), 'float32'), np.eye(3)[:2].astype('float32'))
        report(loss=float(loss))
    ''')
    result = run_python(home, args=[script])
    out = last_json(result)
    assert out['backend'] == 'theano'
    assert out['variable'] == ADAPTER
    assert out['env'] == 'theano_multigpu'
    assert out['loss'] > 0
    assert 'Using Theano backend.' in result.stderr
    # a Python the script starts is on the shim too
    assert out['child'] == ['theano', ADAPTER, 'theano_multigpu']


def test_run_command_passes_arguments_and_sets_the_backend(home):
    (home / 'scripts').mkdir()
    (home / 'scripts' / 'helper.py').write_text('VALUE = 42\n')
    script = write_script(home / 'scripts' / 'train.py', REPORT, '''
        import helper   # next to the script: sys.path[0] is the script's folder
        report(argv=sys.argv, name=__name__, helper=helper.VALUE)
    ''')
    result = run_python(home, backend=None, args=[
        '-m', 'theano_multigpu', 'run', script, 'one', '--two', '3', '-x'])
    out = last_json(result)
    assert out['argv'] == [script, 'one', '--two', '3', '-x']
    assert out['name'] == '__main__'
    assert out['helper'] == 42
    assert (out['backend'], out['variable'], out['env']) == ('theano', ADAPTER, 'theano_multigpu')
    assert out['child'] == ['theano', ADAPTER, 'theano_multigpu']


def test_run_command_passes_the_exit_status(home):
    script = write_script(home / 'fail.py', 'import sys\nsys.exit(3)\n')
    assert run_python(home, backend=None, check=False,
                      args=['-m', 'theano_multigpu', 'run', script]).returncode == 3


def test_run_command_with_a_missing_script(home):
    result = run_python(home, backend=None, check=False,
                        args=['-m', 'theano_multigpu', 'run', 'missing.py'])
    assert result.returncode == 2
    assert "expected a Python script, but received 'missing.py'" in result.stderr
    assert 'Traceback' not in result.stderr


def test_run_command_also_where_compat_only_is_set(home):
    script = write_script(home / 'train.py', REPORT, 'report()\n')
    out = last_json(run_python(home, backend='theano', extra_env={'THEANO_MULTIGPU_COMPAT': '1'},
                               args=['-m', 'theano_multigpu', 'run', script]))
    assert (out['backend'], out['variable'], out['env']) == ('theano', ADAPTER, 'theano_multigpu')


def test_import_before_keras_activates(home):
    out = last_json(run_python(home, backend=None, code=source('''
        import theano_multigpu
    ''', REPORT, '''
        report()
    ''')))
    assert (out['backend'], out['variable'], out['env']) == ('theano', ADAPTER, 'theano_multigpu')
    assert out['child'] == ['theano', ADAPTER, 'theano_multigpu']


@pytest.mark.parametrize('first', ['keras', 'theano'])
def test_import_after_keras_or_theano_is_a_clear_error(home, first):
    result = run_python(home, backend='theano', flags=PLAIN_FLAGS, check=False, code=source(PLAIN_PRELUDE, '''
        import os
        import %s
        try:
            import theano_multigpu
        except RuntimeError as error:
            print('RuntimeError: %%s' %% error)
        print('KERAS_BACKEND=%%s' %% os.environ.get('KERAS_BACKEND'))
    ''' % first))
    assert result.returncode == 0, result.stderr
    assert ("RuntimeError: theano_multigpu must be imported before Keras and Theano, "
            "but %r is already imported; put `import theano_multigpu` before "
            "`import %s`" % (first, first)) in result.stdout
    assert 'KERAS_BACKEND=theano' in result.stdout.splitlines()   # nothing was changed


def test_plain_theano_backend_is_not_on_the_shim(home):
    out = last_json(run_python(home, backend='theano', flags=PLAIN_FLAGS,
                               code=source(PLAIN_PRELUDE, REPORT, '''
        report(shim=[m for m in sys.modules if m.startswith('theano_multigpu')],
               multigpu_settings=hasattr(__import__('theano').config, 'multigpu'))
    ''')))
    assert (out['backend'], out['variable'], out['env']) == ('theano', STOCK, 'theano')
    assert out['shim'] == []
    assert out['multigpu_settings'] is False
    assert out['child'] == ['theano', STOCK, 'theano']


def test_compat_only_is_not_on_the_shim(home):
    out = last_json(run_python(home, backend='theano', extra_env={'THEANO_MULTIGPU_COMPAT': '1'},
                               code=source(REPORT, 'report()\n')))
    assert (out['backend'], out['variable'], out['env']) == ('theano', STOCK, 'theano')
    assert out['child'] == ['theano', STOCK, 'theano']


@pytest.mark.parametrize('backend', [None, 'theano', 'tensorflow'])
def test_start_up_imports_nothing_unless_asked(home, backend):
    out = last_json(run_python(home, backend=backend, code='''
        import json, sys
        print(json.dumps(sorted(m for m in sys.modules
                                if m.split('.')[0] in ('theano', 'keras', 'theano_multigpu'))))
    '''))
    assert out == []


def test_start_up_on_the_shim_imports_neither_theano_nor_keras(home):
    # (compat blocks theano.scan_module.scan_perform_ext with a None entry)
    out = last_json(run_python(home, code='''
        import json, sys
        print(json.dumps(sorted(name for name, module in sys.modules.items()
                                if module is not None
                                and name.split('.')[0] in ('theano', 'keras'))))
    '''))
    assert out == []
