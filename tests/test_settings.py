"""Unit tests of the flag parsing, the settings table (and README's table and
theanorc.example written from it) and the mesh: pure functions, no Theano,
no Keras, no device.

``theano_multigpu/__init__`` turns the shim on when imported, which would
change this pytest process (KERAS_BACKEND, import hooks).  ``settings``,
``mesh`` and ``errors`` import neither Theano nor Keras, so they are loaded
here under a bare stand-in for the package and the stand-in is removed
again.
"""
import configparser as stdlib_configparser
import importlib
import importlib.util
import sys
import types

import pytest


def _load_pure_modules():
    spec = importlib.util.find_spec('theano_multigpu')
    saved = {name: module for name, module in sys.modules.items()
             if name == 'theano_multigpu' or name.startswith('theano_multigpu.')}
    for name in saved:
        del sys.modules[name]
    package = types.ModuleType('theano_multigpu')
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules['theano_multigpu'] = package
    try:
        return (importlib.import_module('theano_multigpu.config.flags'),
                importlib.import_module('theano_multigpu.config.settings'),
                importlib.import_module('theano_multigpu.config.settings_text'),
                importlib.import_module('theano_multigpu.config.mesh'),
                importlib.import_module('theano_multigpu.errors'))
    finally:
        for name in list(sys.modules):
            if name == 'theano_multigpu' or name.startswith('theano_multigpu.'):
                del sys.modules[name]
        sys.modules.update(saved)


flags, settings, settings_text, mesh, errors = _load_pure_modules()
ConfigurationError = errors.ConfigurationError
TWO = 'dev0->cuda0;dev1->cuda1'


# parse_contexts_flag ----------------------------------------------------

@pytest.mark.parametrize('value, expected', [
    ('', []),
    ('dev0->cuda0', [('dev0', 'cuda0')]),
    (TWO, [('dev0', 'cuda0'), ('dev1', 'cuda1')]),
    (' dev0 -> opencl0:0 ; dev1->opencl0:1 ;', [('dev0', 'opencl0:0'), ('dev1', 'opencl0:1')]),
    ('a->cuda;b_2->cuda', [('a', 'cuda'), ('b_2', 'cuda')]),
    # several names on one device are allowed (each gets its own context)
    ('dev0->opencl0:0;dev1->opencl0:0', [('dev0', 'opencl0:0'), ('dev1', 'opencl0:0')]),
])
def test_parse_contexts_flag_good(value, expected):
    assert settings.parse_contexts_flag(value) == expected


def test_format_contexts_is_the_canonical_form():
    pairs = settings.parse_contexts_flag(' dev0 -> cuda0 ;; dev1->cuda1;')
    assert settings.format_contexts(pairs) == TWO
    assert settings.parse_contexts_flag(settings.format_contexts(pairs)) == pairs


@pytest.mark.parametrize('value, entry', [
    ('dev0', 'dev0'),
    ('dev0->cuda0;dev1', 'dev1'),
    ('dev0->', 'dev0->'),
    ('->cuda0', '->cuda0'),
    ('dev0->cuda0->cuda1', 'dev0->cuda0->cuda1'),
    ('dev0=cuda0', 'dev0=cuda0'),
])
def test_parse_contexts_flag_malformed(value, entry):
    with pytest.raises(ConfigurationError) as info:
        settings.parse_contexts_flag(value)
    message = str(info.value)
    assert 'THEANO_FLAGS contexts' in message
    assert "'name->device'" in message          # what was expected
    assert repr(value) in message and repr(entry) in message  # what was received


@pytest.mark.parametrize('name', ['0dev', 'dev-0', 'dev 0'])
def test_parse_contexts_flag_bad_name(name):
    with pytest.raises(ConfigurationError, match='context name') as info:
        settings.parse_contexts_flag('%s->cuda0' % name)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize('name', ['cpu', 'cuda0', 'opencl_a'])
def test_parse_contexts_flag_refuses_names_theano_refuses(name):
    # Theano itself raises "Cannot use cuda0 as context name" later, without
    # saying which flag; the shim stops first, naming the flag.
    with pytest.raises(ConfigurationError, match="not 'cpu', 'cuda\\*' or 'opencl\\*'") as info:
        settings.parse_contexts_flag('%s->cuda0' % name)
    assert repr(name) in str(info.value)
    assert 'dev0->cuda0' in str(info.value)     # how to fix it


def test_parse_contexts_flag_duplicate_name():
    value = 'dev0->cuda0;dev0->cuda1'
    with pytest.raises(ConfigurationError, match='names each context once') as info:
        settings.parse_contexts_flag(value)
    message = str(info.value)
    assert "'dev0' twice" in message and repr(value) in message
    assert 'rename one' in message


@pytest.mark.parametrize('device', ['gpu0', 'gpu', 'cuda:0', 'opencl0', 'cpu', 'opencl:1'])
def test_parse_contexts_flag_bad_device(device):
    with pytest.raises(ConfigurationError, match="'cudaN' or 'openclP:D'") as info:
        settings.parse_contexts_flag('dev0->%s' % device)
    message = str(info.value)
    assert repr(device) in message and "'dev0->cuda0'" in message


# the other 'left->right' lists: multigpu.device_memory, multigpu.layer_map --

def test_arrow_entries_split_at_the_last_arrow_and_skip_empty_entries():
    assert list(flags.arrow_entries(' a -> b ;; 64MiB ;x->y->z')) == [
        ('a -> b', 'a', True, 'b'), ('64MiB', '', False, '64MiB'),
        ('x->y->z', 'x->y', True, 'z')]


@pytest.mark.parametrize('value, expected', [
    ('', {}), ('64MiB', {None: 64 << 20}), (' dev0 -> 1KiB ; dev1->2000 ', {'dev0': 1024, 'dev1': 2000}),
])
def test_parse_device_memory(value, expected):
    assert flags.parse_device_memory(value) == expected


@pytest.mark.parametrize('value', ['dev-0->64MiB', '->64MiB', 'dev0->lots'])
def test_parse_device_memory_refuses(value):
    with pytest.raises(ConfigurationError, match='multigpu.device_memory expects'):
        flags.parse_device_memory(value)


def test_parse_layer_map():
    assert flags.parse_layer_map(' dense_[12] -> dev0 ; dense_3->dev1;') == [
        ('dense_[12]', 'dev0'), ('dense_3', 'dev1')]


@pytest.mark.parametrize('value, entry', [
    ('dense_1', 'dense_1'), ('->dev0', '->dev0'), ('dense_1->dev-1', 'dense_1->dev-1')])
def test_parse_layer_map_refuses(value, entry):
    with pytest.raises(ConfigurationError, match="'pattern->context'") as info:
        flags.parse_layer_map(value)
    assert repr(entry) in str(info.value)


# parse_name_list ---------------------------------------------------------

@pytest.mark.parametrize('value, expected', [
    ('', []), ('dev0', ['dev0']), ('dev0;dev1', ['dev0', 'dev1']),
    ('dev0+dev1', ['dev0', 'dev1']), (' dev1 ; dev0 ', ['dev1', 'dev0']),
])
def test_parse_name_list(value, expected):
    assert settings.parse_name_list(value) == expected


# translate_legacy_value -------------------------------------------------

@pytest.mark.parametrize('flag, value, expected', [
    ('device', 'gpu', ('device', 'cuda')),
    ('device', 'gpu0', ('device', 'cuda0')),
    ('device', ' gpu3 ', ('device', 'cuda3')),
    ('init_gpu_device', 'gpu1', ('init_gpu_device', 'cuda1')),
    ('lib.cnmem', '1', ('gpuarray.preallocate', '1')),
    ('lib.cnmem', '0.8', ('gpuarray.preallocate', '0.8')),
    ('lib.cnmem', '0', ('gpuarray.preallocate', '0')),
])
def test_translate_legacy_value(flag, value, expected):
    assert settings.translate_legacy_value(flag, value) == expected


@pytest.mark.parametrize('flag, value', [
    ('device', 'cpu'), ('device', 'cuda0'), ('device', 'opencl0:0'),
    ('device', 'gpux'), ('init_gpu_device', ''), ('floatX', 'float32'),
])
def test_translate_legacy_value_leaves_other_values(flag, value):
    assert settings.translate_legacy_value(flag, value) is None


def test_translate_legacy_value_cnmem_not_a_number():
    with pytest.raises(ConfigurationError, match='lib.cnmem') as info:
        settings.translate_legacy_value('lib.cnmem', 'lots')
    assert "'lots'" in str(info.value) and 'gpuarray.preallocate' in str(info.value)


class FakeConfigparser(object):
    """What _translate_legacy_flags uses of theano.configparser."""

    def __init__(self, flags, theanorc=''):
        self.THEANO_FLAGS_DICT = dict(flags)
        self.theano_cfg = stdlib_configparser.ConfigParser()
        self.theano_raw_cfg = stdlib_configparser.RawConfigParser()
        for cfg in (self.theano_cfg, self.theano_raw_cfg):
            cfg.read_string(theanorc)

    def fetch_val_for_key(self, key):
        if key in self.THEANO_FLAGS_DICT:
            return self.THEANO_FLAGS_DICT[key]
        section, option = key.rsplit('.', 1) if '.' in key else ('global', key)
        try:
            return self.theano_raw_cfg.get(section, option)
        except stdlib_configparser.Error:
            raise KeyError(key)


def test_legacy_flags_from_theano_flags(capsys):
    cp = FakeConfigparser({'device': 'gpu1', 'lib.cnmem': '0.5', 'floatX': 'float32'})
    settings._translate_legacy_flags(cp)
    assert cp.THEANO_FLAGS_DICT == {'device': 'cuda1', 'gpuarray.preallocate': '0.5',
                                    'floatX': 'float32'}
    notices = capsys.readouterr().err.splitlines()
    assert notices == [
        "theano_multigpu: THEANO_FLAGS device=gpu1 is the old CUDA backend's flag, "
        "removed in Theano 1.0; using device=cuda1 instead (write that to silence this notice)",
        "theano_multigpu: THEANO_FLAGS lib.cnmem=0.5 is the old CUDA backend's flag, "
        "removed in Theano 1.0; using gpuarray.preallocate=0.5 instead (write that to "
        "silence this notice)"]


def test_legacy_flags_from_theanorc(capsys):
    cp = FakeConfigparser({}, '[global]\ndevice = gpu\n[lib]\ncnmem = 1\n')
    settings._translate_legacy_flags(cp)
    assert cp.THEANO_FLAGS_DICT == {'device': 'cuda', 'gpuarray.preallocate': '1'}
    assert not cp.theano_raw_cfg.has_option('global', 'device')
    assert not cp.theano_cfg.has_option('lib', 'cnmem')
    err = capsys.readouterr().err
    assert '.theanorc [global] device=gpu' in err and '.theanorc [lib] lib.cnmem=1' in err


def test_legacy_flag_loses_to_the_new_flag_set_explicitly(capsys):
    cp = FakeConfigparser({'lib.cnmem': '1'}, '[gpuarray]\npreallocate = 0.25\n')
    settings._translate_legacy_flags(cp)
    assert 'lib.cnmem' not in cp.THEANO_FLAGS_DICT
    assert cp.fetch_val_for_key('gpuarray.preallocate') == '0.25'
    assert 'ignoring it, as gpuarray.preallocate is set too' in capsys.readouterr().err


def test_new_flags_pass_untouched(capsys):
    flags = {'device': 'cuda0', 'gpuarray.preallocate': '0.5'}
    cp = FakeConfigparser(flags)
    settings._translate_legacy_flags(cp)
    assert cp.THEANO_FLAGS_DICT == flags
    assert capsys.readouterr().err == ''


# the settings table and its checks ------------------------------------------

def check(name, value):
    return settings.SETTING[name].check(value)


@pytest.mark.parametrize('mode', settings.MODES)
def test_mode_check_accepts(mode):
    assert check('multigpu.mode', mode) == mode


def test_mode_check_refuses():
    with pytest.raises(ConfigurationError, match='multigpu.mode expects one of auto/batch/layer') as info:
        check('multigpu.mode', 'fast')
    assert "'fast'" in str(info.value) and 'multigpu.mode=batch' in str(info.value)


@pytest.mark.parametrize('value', ['sync', 'local'])
def test_batchnorm_check_accepts(value):
    assert check('multigpu.batchnorm', value) == value


def test_batchnorm_check_refuses():
    with pytest.raises(ConfigurationError,
                       match="multigpu.batchnorm expects one of sync/local, but received 'on'"):
        check('multigpu.batchnorm', 'on')


@pytest.mark.parametrize('value', ['0', 'all'])
def test_save_on_check_accepts(value):
    assert check('multigpu.save_on', value) == value


@pytest.mark.parametrize('value', ['300', '2.5', 'inf'])
def test_mpi_timeout_check_accepts(value):
    assert check('multigpu.mpi_timeout', value) == value


@pytest.mark.parametrize('value', ['0', '-1', 'soon', ''])
def test_mpi_timeout_check_refuses(value):
    with pytest.raises(ConfigurationError,
                       match='multigpu.mpi_timeout expects a positive number of seconds'):
        check('multigpu.mpi_timeout', value)


@pytest.mark.parametrize('name', ['multigpu.master', 'multigpu.contexts'])
def test_names_check_refuses(name):
    with pytest.raises(ConfigurationError, match=name) as info:
        check(name, 'dev-1')
    assert "'dev-1'" in str(info.value)


@pytest.mark.parametrize('name, value', [
    ('multigpu.layer_map', 'dense_1'), ('multigpu.device_memory', 'lots')])
def test_parsed_settings_refuse_what_their_parser_refuses(name, value):
    with pytest.raises(ConfigurationError, match=name):
        check(name, value)


def test_every_setting_has_a_default_its_check_accepts_and_its_texts():
    assert len(settings.SETTING) == len(settings.SETTINGS)
    for setting in settings.SETTINGS:
        assert setting.name.startswith('multigpu.') and setting.summary and setting.help
        if setting.kind == 'bool':
            assert setting.default in (True, False)
        else:
            assert setting.check(setting.default) == setting.default, setting.name
        assert setting.kind != 'choice' or setting.example in setting.choices, setting.name


def test_shown_says_what_an_empty_value_means():
    master = settings.SETTING['multigpu.master']
    assert (master.shown(''), master.shown('dev1')) == ('(first)', 'dev1')
    assert settings_text.shown_default(settings.SETTING['multigpu.report']) == 'False'


def _repository_file(name):
    import pathlib
    return (pathlib.Path(__file__).resolve().parent.parent / name).read_text()


FIX = 'run `python -m theano_multigpu settings --write` in the repository root'


def test_theanorc_example_is_written_from_the_table():
    assert _repository_file('theanorc.example') == settings_text.theanorc(), (
        'theanorc.example differs from the settings table '
        '(theano_multigpu/config/settings.py); ' + FIX)


def test_readme_settings_table_is_written_from_the_table():
    readme = _repository_file('README.rst')
    assert settings_text.readme_table(readme) == settings_text.rst_table(), (
        "README.rst's settings table differs from the settings table "
        '(theano_multigpu/config/settings.py); ' + FIX)
    assert settings_text.readme_with_table(readme) == readme


def test_every_setting_is_in_readme_and_theanorc_example():
    readme, theanorc = _repository_file('README.rst'), _repository_file('theanorc.example')
    for setting in settings.SETTINGS:
        assert '``%s``' % setting.name in readme
        assert '\n%s = ' % setting.option in theanorc or '\n%s =\n' % setting.option in theanorc


def test_readme_without_the_markers_says_what_is_missing():
    with pytest.raises(ConfigurationError, match='settings table between the lines'):
        settings_text.readme_table('no table here\n')


def test_write_rewrites_a_stale_table_and_theanorc(tmp_path):
    stale = 'Title\n=====\n\n%s\n\nold table\n\n%s\n\nMore.\n' % (
        settings_text.README_BEGIN, settings_text.README_END)
    (tmp_path / 'README.rst').write_text(stale)
    changed = settings_text.write(str(tmp_path))
    assert sorted(changed) == sorted(str(tmp_path / n) for n in ('README.rst', 'theanorc.example'))
    readme = (tmp_path / 'README.rst').read_text()
    assert 'old table' not in readme and readme.endswith('\nMore.\n')
    assert settings_text.readme_table(readme) == settings_text.rst_table()
    assert settings_text.write(str(tmp_path)) == []        # written once, then equal


def test_a_command_in_backquotes_stays_on_one_line():
    lines = settings_text._wrap('word ' * 10 + '`python -m theano_multigpu report train.py` and more',
                                40, '# ')
    assert '# `python -m theano_multigpu report train.py`' in lines
    assert all(len(line) <= 40 for line in lines if '`' not in line)


def test_listing_names_every_setting_with_its_default():
    lines = settings_text.listing().splitlines()
    for setting in settings.SETTINGS:
        assert '%s (default: %s)' % (setting.name, settings_text.shown_default(setting)) in lines


# mesh.from_flags -------------------------------------------------------------

def test_mesh_without_contexts_is_single():
    m = mesh.from_flags('')
    assert (m.names, m.master, m.mode, m.size) == ([], None, 'single', 1)


def test_mesh_one_context_is_single_on_it():
    m = mesh.from_flags('dev0->cuda0')
    assert (m.names, m.master, m.mode, m.devices) == (['dev0'], 'dev0', 'single', {'dev0': 'cuda0'})


def test_mesh_two_contexts_default_to_batch_with_the_first_as_master():
    m = mesh.from_flags(TWO)
    assert (m.names, m.master, m.mode, m.size) == (['dev0', 'dev1'], 'dev0', 'batch', 2)


def test_mesh_participants_master_and_mode():
    m = mesh.from_flags('a->cuda0;b->cuda1;c->cuda2', mode='layer', participants='c+a', master='a')
    assert (m.names, m.master, m.mode) == (['c', 'a'], 'a', 'layer')
    assert mesh.from_flags('a->cuda0;b->cuda1;c->cuda2', participants='c;b').master == 'c'


def test_mesh_participant_not_defined():
    with pytest.raises(ConfigurationError, match='multigpu.contexts expects names') as info:
        mesh.from_flags(TWO, participants='dev0+dev7')
    message = str(info.value)
    assert "'dev7'" in message and repr(TWO) in message and 'dev0, dev1' in message


def test_mesh_participant_without_contexts_flag():
    with pytest.raises(ConfigurationError, match='contexts is unset'):
        mesh.from_flags('', participants='dev0')


def test_mesh_participant_twice():
    with pytest.raises(ConfigurationError, match='each name once') as info:
        mesh.from_flags(TWO, participants='dev0;dev0')
    assert "'dev0;dev0'" in str(info.value)


def test_mesh_master_not_taking_part():
    with pytest.raises(ConfigurationError, match='multigpu.master expects one of') as info:
        mesh.from_flags('a->cuda0;b->cuda1;c->cuda2', participants='a+b', master='c')
    assert "'c'" in str(info.value) and '(a, b)' in str(info.value)


def test_mesh_master_without_contexts_flag():
    with pytest.raises(ConfigurationError, match='contexts flag is unset'):
        mesh.from_flags('', master='dev0')


@pytest.mark.parametrize('mode, kind', [('batch', 'batch-wise'), ('layer', 'layer-wise')])
def test_mesh_mode_needs_two_contexts(mode, kind):
    with pytest.raises(ConfigurationError) as info:
        mesh.from_flags('dev0->cuda0', mode=mode)
    assert str(info.value) == (
        "multigpu.mode=%s (%s) needs at least 2 contexts, but THEANO_FLAGS "
        "contexts='dev0->cuda0' defines 1 taking part; add one, e.g. "
        "contexts='dev0->cuda0;dev1->cuda1'" % (mode, kind))


def test_mesh_batch_counts_only_contexts_taking_part():
    with pytest.raises(ConfigurationError, match='defines 1 taking part'):
        mesh.from_flags(TWO, mode='batch', participants='dev1')


def test_mesh_batch_without_contexts_flag():
    with pytest.raises(ConfigurationError, match='needs at least 2 contexts, but THEANO_FLAGS contexts is unset'):
        mesh.from_flags('', mode='batch')


def test_mesh_unknown_mode():
    with pytest.raises(ConfigurationError, match="received 'fast'"):
        mesh.from_flags(TWO, mode='fast')


def test_mesh_bad_contexts_flag():
    with pytest.raises(ConfigurationError, match="'name->device'"):
        mesh.from_flags('dev0:cuda0')

