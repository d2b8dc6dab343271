"""The contexts flag, the multigpu.* settings, old CUDA flags, missing
pygpu and ``python -m theano_multigpu info``, each in a fresh Python.

Tests that open devices run on pocl's two OpenCL devices (opencl0:0,
opencl0:1) and are skipped, with the reason, where pocl is missing.
"""
import json
import re

import pytest

from conftest import needs_pocl, run_python

TWO_DEVICES = 'contexts=dev0->opencl0:0;dev1->opencl0:1'


def last_json(result):
    lines = result.stdout.strip().splitlines()
    assert lines, 'child printed nothing; stderr:\n' + result.stderr[-3000:]
    return json.loads(lines[-1])


def failure(home, code='import theano', **kwargs):
    """Run ``code`` expecting it to fail; return its stderr."""
    result = run_python(home, code, check=False, **kwargs)
    assert result.returncode != 0, 'expected a failure; stdout:\n' + result.stdout
    return result.stderr


def last_error_line(stderr):
    return stderr.strip().splitlines()[-1]


def no_unrecognised_flag_warning(stderr):
    return 'does not recognise' not in stderr


# Several names on one device (Theano registers only the first) ------------

@needs_pocl
def test_two_names_on_one_device_each_get_a_context(home):
    out = last_json(run_python(home, flags='contexts=dev0->opencl0:0;dev1->opencl0:0', code='''
        import json
        import numpy as np
        import theano
        from theano.gpuarray.type import get_context
        a = theano.shared(np.arange(3, dtype='float32'), target='dev0')
        b = theano.shared(np.ones(3, dtype='float32'), target='dev1')
        f = theano.function([], [a * 2, b + 1])
        print(json.dumps({
            'distinct': get_context('dev0') is not get_context('dev1'),
            'contexts': [a.type.context_name, b.type.context_name],
            'outputs': [v.tolist() for v in f()],
            'output_contexts': [o.owner.inputs[0].type.context_name
                                for o in f.maker.fgraph.outputs],
        }))
    '''))
    assert out['distinct'] is True
    assert out['contexts'] == ['dev0', 'dev1']
    assert out['outputs'] == [[0.0, 2.0, 4.0], [2.0, 2.0, 2.0]]
    assert out['output_contexts'] == ['dev0', 'dev1']


@needs_pocl
def test_contexts_flag_with_spaces_and_a_trailing_semicolon(home):
    # Theano's own parser refuses both ("Malformed context map: ")
    out = last_json(run_python(home, flags='contexts=dev0 -> opencl0:0; dev1->opencl0:1;', code='''
        import json, theano
        from theano.gpuarray.type import get_context
        print(json.dumps([theano.config.contexts,
                          get_context('dev0') is not get_context('dev1')]))
    '''))
    assert out == ['dev0->opencl0:0;dev1->opencl0:1', True]


# Bad contexts flags: clear errors naming the flag and the value -----------

@pytest.mark.parametrize('value, expected', [
    ('dev0->opencl0:0;dev1',
     "ConfigurationError: THEANO_FLAGS contexts expects 'name->device' entries "
     "separated by ';', e.g. 'dev0->cuda0;dev1->cuda1', but received "
     "contexts='dev0->opencl0:0;dev1' (entry 'dev1'); fix the entry"),
    ('dev0->opencl0:0;dev0->opencl0:1',
     "ConfigurationError: THEANO_FLAGS contexts names each context once, but received "
     "'dev0' twice in contexts='dev0->opencl0:0;dev0->opencl0:1'; rename one, "
     "e.g. 'dev0_b->opencl0:1'"),
    ('cuda0->opencl0:0', "received 'cuda0' in contexts='cuda0->opencl0:0'"),
    ('dev0->gpu0', "received 'gpu0' for 'dev0' in contexts='dev0->gpu0'; use e.g. 'dev0->cuda0'"),
])
def test_bad_contexts_flag(home, value, expected):
    stderr = failure(home, 'import keras', flags='contexts=' + value)
    assert expected in last_error_line(stderr)


@pytest.mark.parametrize('where', ['flags', 'theanorc'])
def test_bad_contexts_from_theano_flags_or_theanorc(home, where):
    flags = ''
    if where == 'flags':
        flags = 'contexts=dev0'
    else:
        (home / '.theanorc').write_text('[global]\ncontexts = dev0\n')
    assert "received contexts='dev0' (entry 'dev0')" in last_error_line(failure(home, flags=flags))


@needs_pocl
def test_missing_device_lists_the_devices_found(home):
    stderr = failure(home, 'import keras', flags='contexts=dev0->opencl0:0;dev1->opencl0:7')
    assert last_error_line(stderr) == (
        "theano_multigpu.errors.ConfigurationError: THEANO_FLAGS contexts maps 'dev1' "
        "to device 'opencl0:7', which does not exist here; devices found: opencl0:0, "
        "opencl0:1. Fix contexts='dev0->opencl0:0;dev1->opencl0:7'")


@needs_pocl
def test_missing_device_flag_lists_the_devices_found(home):
    stderr = failure(home, flags='device=opencl0:7')
    assert ('THEANO_FLAGS device=opencl0:7 names a device that does not exist here; '
            'devices found: opencl0:0, opencl0:1. Use one of them, or device=cpu') in stderr


# multigpu.* settings ---------------------------------------------------------

SETTINGS = '''
    import json, theano
    from theano_multigpu.config import mesh
    m = mesh.current()
    c = theano.config.multigpu
    print(json.dumps({'settings': [c.mode, c.contexts, c.master],
                      'mesh': [m.names, m.master, m.mode]}))
'''


@needs_pocl
def test_settings_from_theano_flags(home):
    result = run_python(home, SETTINGS, flags=TWO_DEVICES + ',multigpu.mode=batch,'
                        'multigpu.contexts=dev1+dev0,multigpu.master=dev1')
    out = last_json(result)
    assert out['settings'] == ['batch', 'dev1+dev0', 'dev1']
    assert out['mesh'] == [['dev1', 'dev0'], 'dev1', 'batch']
    assert no_unrecognised_flag_warning(result.stderr)


@needs_pocl
def test_settings_from_a_multigpu_section_of_theanorc(home):
    (home / '.theanorc').write_text(
        '[global]\n'
        'contexts = dev0->opencl0:0;dev1->opencl0:1\n'
        '\n'
        '[multigpu]\n'
        'mode = batch\n'
        'master = dev1\n')
    result = run_python(home, SETTINGS)
    out = last_json(result)
    assert out['settings'] == ['batch', '', 'dev1']
    assert out['mesh'] == [['dev0', 'dev1'], 'dev1', 'batch']
    assert no_unrecognised_flag_warning(result.stderr)


def test_theano_flags_win_over_theanorc(home):
    (home / '.theanorc').write_text('[multigpu]\nmode = layer\n')
    out = last_json(run_python(home, SETTINGS, flags='multigpu.mode=auto'))
    assert out['settings'] == ['auto', '', '']
    assert out['mesh'] == [[], None, 'single']


def test_settings_default_without_contexts(home):
    result = run_python(home, SETTINGS)
    assert last_json(result)['mesh'] == [[], None, 'single']
    assert no_unrecognised_flag_warning(result.stderr)


@pytest.mark.parametrize('where', ['flags', 'theanorc'])
def test_bad_mode_is_an_error(home, where):
    flags = ''
    if where == 'flags':
        flags = 'multigpu.mode=fast'
    else:
        (home / '.theanorc').write_text('[multigpu]\nmode = fast\n')
    stderr = failure(home, flags=flags)
    assert last_error_line(stderr).endswith(
        "multigpu.mode expects one of auto/batch/layer, but received 'fast'; "
        "e.g. THEANO_FLAGS='multigpu.mode=batch'")


@needs_pocl
def test_batch_mode_with_one_context_is_an_error_at_import(home):
    stderr = failure(home, flags='contexts=dev0->opencl0:0,multigpu.mode=batch')
    assert last_error_line(stderr).endswith(
        "multigpu.mode=batch (batch-wise) needs at least 2 contexts, but THEANO_FLAGS "
        "contexts='dev0->opencl0:0' defines 1 taking part; add one, e.g. "
        "contexts='dev0->cuda0;dev1->cuda1'")


@needs_pocl
def test_master_not_defined_is_an_error_at_import(home):
    stderr = failure(home, flags=TWO_DEVICES + ',multigpu.master=dev5')
    assert "multigpu.master expects one of the contexts taking part (dev0, dev1), " \
        "but received 'dev5'" in last_error_line(stderr)


def test_unknown_multigpu_flag_is_still_warned_about(home):
    result = run_python(home, 'import theano', flags='multigpu.speed=fast')
    assert 'Theano does not recognise this flag: multigpu.speed' in result.stderr


# Old CUDA backend flags -------------------------------------------------------

NOTICE = ("theano_multigpu: %s %s=%s is the old CUDA backend's flag, removed in "
          "Theano 1.0; using %s=%s instead (write that to silence this notice)")


def test_lib_cnmem_becomes_gpuarray_preallocate(home):
    result = run_python(home, 'import theano; print(theano.config.gpuarray.preallocate)',
                        flags='device=cpu,lib.cnmem=1')
    assert result.stdout.split() == ['1.0']
    assert result.stderr.splitlines().count(
        NOTICE % ('THEANO_FLAGS', 'lib.cnmem', '1', 'gpuarray.preallocate', '1')) == 1
    assert no_unrecognised_flag_warning(result.stderr)


def test_lib_cnmem_from_theanorc(home):
    (home / '.theanorc').write_text('[lib]\ncnmem = 0.5\n')
    result = run_python(home, 'import theano; print(theano.config.gpuarray.preallocate)')
    assert result.stdout.split() == ['0.5']
    assert NOTICE % ('.theanorc [lib]', 'lib.cnmem', '0.5', 'gpuarray.preallocate', '0.5') \
        in result.stderr


@pytest.mark.parametrize('old, new', [('gpu', 'cuda'), ('gpu0', 'cuda0')])
def test_device_gpu_becomes_cuda(home, old, new):
    # No CUDA here: after the translation the device cannot open, and the
    # error says so instead of Theano's "old GPU back-end" message.
    stderr = failure(home, 'import keras', flags='device=' + old)
    assert stderr.splitlines().count(NOTICE % ('THEANO_FLAGS', 'device', old, 'device', new)) == 1
    assert 'old GPU back-end' not in stderr and 'old gpu back-end' not in stderr
    assert 'THEANO_FLAGS device=%s' % new in last_error_line(stderr)


def test_plain_theano_keeps_its_own_old_gpu_message(home):
    stderr = failure(home, backend='theano', flags='device=gpu0',
                     extra_env={'THEANO_MULTIGPU_COMPAT': '1'})
    assert 'You are tring to use the old GPU back-end' in stderr
    assert 'theano_multigpu:' not in stderr


# Without pygpu ------------------------------------------------------------------

@pytest.fixture
def no_pygpu(tmp_path):
    """A PYTHONPATH entry whose pygpu fails to import, as where it is absent."""
    path = tmp_path / 'no_pygpu'
    (path / 'pygpu').mkdir(parents=True)
    (path / 'pygpu' / '__init__.py').write_text(
        "raise ImportError('pygpu hidden by the test')\n")
    return {'PYTHONPATH': str(path)}


def test_no_pygpu_one_context_runs_as_plain_theano_with_one_warning(home, no_pygpu):
    result = run_python(home, extra_env=no_pygpu, flags='contexts=dev0->opencl0:0', code='''
        import json
        import numpy as np
        import keras.backend as K
        from keras.models import Sequential
        from keras.layers import Dense
        model = Sequential([Dense(3, input_dim=4, activation='softmax')])
        model.compile('sgd', 'categorical_crossentropy')
        loss = model.train_on_batch(np.ones((2, 4), 'float32'), np.eye(3)[:2].astype('float32'))
        print(json.dumps([K.backend(), K.variable.__module__,
                          type(model.layers[0].W).__name__, float(loss)]))
    ''')
    backend, module, weight_type, loss = last_json(result)
    assert (backend, module, weight_type) == ('theano', 'theano_multigpu.keras_adapter',
                                              'TensorSharedVariable')
    assert loss > 0
    lines = [line for line in result.stderr.splitlines()
             if line.strip() and line != 'Using Theano backend.'
             and 'theano.tensor.blas' not in line   # (machines without OpenBLAS)
             and 'theano.gof.cmodule' not in line]   # Theano's compile-cache notices
    assert lines == [
        'theano_multigpu: pygpu is not installed, so this runs as the plain Theano '
        'backend on one device; for GPU contexts: apt-get install python3-pygpu '
        'libgpuarray-dev (and make the virtual environment with --system-site-packages)']


def test_no_pygpu_without_contexts_says_nothing(home, no_pygpu):
    result = run_python(home, 'import keras', extra_env=no_pygpu)
    assert 'pygpu' not in result.stderr


def test_no_pygpu_two_contexts_say_what_to_install(home, no_pygpu):
    stderr = failure(home, 'import keras', extra_env=no_pygpu, flags=TWO_DEVICES)
    assert last_error_line(stderr) == (
        "theano_multigpu.errors.ConfigurationError: THEANO_FLAGS "
        "contexts='dev0->opencl0:0;dev1->opencl0:1' asks for 2 contexts, which needs "
        "pygpu (libgpuarray), but it is not installed; apt-get install python3-pygpu "
        "libgpuarray-dev (and make the virtual environment with --system-site-packages)")


def test_no_pygpu_device_flag_says_what_to_install(home, no_pygpu):
    stderr = failure(home, extra_env=no_pygpu, flags='device=cuda0')
    assert 'THEANO_FLAGS device=cuda0 asks for a GPU, which needs pygpu' in stderr
    assert 'apt-get install python3-pygpu' in stderr


# python -m theano_multigpu info ---------------------------------------------------

def info(home, **kwargs):
    return run_python(home, args=['-m', 'theano_multigpu', 'info'], backend=None,
                      check=False, **kwargs)


@needs_pocl
def test_info_on_two_contexts(home):
    result = info(home, flags=TWO_DEVICES + ',multigpu.master=dev1')
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for name in ('python', 'numpy', 'theano', 'keras', 'pygpu', 'libgpuarray api'):
        assert re.search(r'^  %s +\S' % name, out, re.M), name
    assert re.search(r'^  theano +1\.0\.5$', out, re.M)
    assert re.search(r'^  devices found +opencl0:0, opencl0:1$', out, re.M)
    contexts = re.findall(r'^  (dev\d) +(\S+) +(\S+) +total (\d+) MiB +free (\d+) MiB(.*)$',
                          out, re.M)
    assert [c[:3] for c in contexts] == [('dev0', 'opencl0:0', 'opencl'),
                                         ('dev1', 'opencl0:1', 'opencl')]
    for _, _, _, total, free, _ in contexts:
        assert 0 < int(free) <= int(total)
    assert [c[5].strip() for c in contexts] == ['', '(master)']
    assert re.search(r'^  contexts +dev0->opencl0:0;dev1->opencl0:1$', out, re.M)
    assert re.search(r'^  multigpu.mode +auto$', out, re.M)
    assert re.search(r'^  multigpu.master +dev1$', out, re.M)
    # By default weights of 64KiB or more are split into blocks of rows.
    assert re.search(r'^  effective mode +batch, weights sharded, those of 64\.0 KiB or more '
                     r'split into blocks of rows$', out, re.M), out
    assert re.search(r'^  multigpu.shard +True$', out, re.M)
    assert re.search(r'^  multigpu.shard_split +64KiB$', out, re.M)


def test_info_without_contexts(home):
    result = info(home)
    assert result.returncode == 0, result.stderr
    assert '(none: THEANO_FLAGS contexts is unset; Theano device=cpu)' in result.stdout
    assert re.search(r'^  effective mode +single$', result.stdout, re.M)
    assert re.search(r'^  scan loop in use +compiled \(Cython, .*theano_multigpu_scan_loop',
                     result.stdout, re.M), result.stdout


def test_info_says_which_scan_loop_runs_when_python_is_chosen(home):
    result = info(home, flags='multigpu.scan_loop=python')
    assert result.returncode == 0, result.stderr
    assert re.search(r'^  multigpu.scan_loop +python$', result.stdout, re.M)
    assert re.search(r'^  scan loop in use +Python \(multigpu.scan_loop=python\)$',
                     result.stdout, re.M)


def test_info_without_pygpu(home, no_pygpu):
    result = info(home, extra_env=no_pygpu, flags='contexts=dev0->opencl0:0')
    assert result.returncode == 0, result.stderr
    assert re.search(r'^  pygpu +not available \(ImportError\)$', result.stdout, re.M)
    assert '(none: pygpu is not installed' in result.stdout


@pytest.mark.parametrize('flags, reason', [
    ('multigpu.mode=fast', "multigpu.mode expects one of auto/batch/layer, but received 'fast'"),
    ('contexts=dev0', "received contexts='dev0' (entry 'dev0')"),
    ('multigpu.mode=batch', 'needs at least 2 contexts, but THEANO_FLAGS contexts is unset'),
    ('floatX=float99', 'Invalid value ("float99") for configuration variable "floatX"'),
    ('multigpu.scan_loop=c', "multigpu.scan_loop expects one of compiled/python, but received 'c'"),
])
def test_info_on_a_bad_configuration_exits_non_zero_with_the_reason(home, flags, reason):
    result = info(home, flags=flags)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        'theano_multigpu: configuration cannot work: ')
    assert reason in result.stderr
    assert 'Traceback' not in result.stderr


@needs_pocl
def test_info_on_a_missing_device(home):
    result = info(home, flags='contexts=dev0->opencl0:7')
    assert result.returncode == 2
    assert 'devices found: opencl0:0, opencl0:1' in result.stderr
