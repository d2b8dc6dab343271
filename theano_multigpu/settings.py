"""theano_multigpu's settings, the ``contexts`` flag and old CUDA flags.

Everything here runs inside ``import theano``, right after
``theano.configparser`` has executed and before Theano reads its own flags
(see ``on_theano_configparser``): settings become Theano config variables
(``multigpu.*`` in THEANO_FLAGS or a ``[multigpu]`` section of .theanorc),
the old CUDA backend's flags are translated, and the ``contexts`` flag is
checked so that a bad one stops with a clear error.
"""
import re
import sys

from .errors import ConfigurationError

__all__ = ['MODES', 'parse_contexts_flag', 'parse_name_list',
           'translate_legacy_value', 'on_theano_configparser']

MODES = ('auto', 'batch', 'layer')

_DEVICE_RE = re.compile(r'^(cuda\d*|opencl\d+:\d+)$')
_NAME_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')


def parse_contexts_flag(value):
    """``'dev0->cuda0;dev1->cuda1'`` -> ``[('dev0', 'cuda0'), ('dev1', 'cuda1')]``.

    Raises ConfigurationError for a malformed entry or a name used twice.
    """
    pairs = []
    for entry in value.split(';'):
        entry = entry.strip()
        if not entry:
            continue
        parts = entry.split('->')
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise ConfigurationError(
                "THEANO_FLAGS contexts expects 'name->device' entries separated "
                "by ';', e.g. 'dev0->cuda0;dev1->cuda1', but received "
                "contexts=%r (entry %r); fix the entry" % (value, entry))
        name, device = parts[0].strip(), parts[1].strip()
        if not _NAME_RE.match(name):
            raise ConfigurationError(
                "THEANO_FLAGS contexts expects a context name made of letters, "
                "digits and '_' (e.g. 'dev0'), but received %r in contexts=%r"
                % (name, value))
        if not _DEVICE_RE.match(device):
            raise ConfigurationError(
                "THEANO_FLAGS contexts expects a device 'cudaN' or 'openclP:D', "
                "but received %r for %r in contexts=%r; use e.g. '%s->cuda0'"
                % (device, name, value, name))
        if name in [n for n, _ in pairs]:
            raise ConfigurationError(
                "THEANO_FLAGS contexts names each context once, but received "
                "%r twice in contexts=%r; rename one, e.g. '%s_b->%s'"
                % (name, value, name, device))
        pairs.append((name, device))
    return pairs


def parse_name_list(value):
    """``'dev0;dev1'`` (or spaces, or '+') -> ``['dev0', 'dev1']``."""
    return [n for n in re.split(r'[;+\s]+', value.strip()) if n]


def _filter_mode(value):
    if value not in MODES:
        raise ConfigurationError(
            "multigpu.mode expects one of %s, but received %r; e.g. "
            "THEANO_FLAGS='multigpu.mode=batch'" % ('/'.join(MODES), value))
    return value


def _filter_names(flag):
    def check(value):
        for name in parse_name_list(value):
            if not _NAME_RE.match(name):
                raise ConfigurationError(
                    "%s expects context names from the contexts flag, "
                    "separated by ';' or '+', but received %r" % (flag, value))
        return value
    return check


def _register_settings(configparser):
    """The package's settings, as Theano config variables."""
    add, Param = configparser.AddConfigVar, configparser.ConfigParam
    add('multigpu.mode',
        "How work is spread over the contexts: 'auto' (batch-wise with two or "
        "more contexts), 'batch' (data parallel) or 'layer' (model parallel).",
        Param('auto', filter=_filter_mode), in_c_key=False)
    add('multigpu.contexts',
        "Which context names take part, separated by ';' or '+' "
        "(default: all names of the contexts flag, in flag order).",
        Param('', filter=_filter_names('multigpu.contexts')), in_c_key=False)
    add('multigpu.master',
        'The context that holds the weights (default: the first one taking part).',
        Param('', filter=_filter_names('multigpu.master')), in_c_key=False)


# The old CUDA backend's flags, which Theano 1.0 removed: flag -> translation.
def translate_legacy_value(flag, value):
    """(new flag, new value) for an old CUDA backend flag, or None."""
    if flag in ('device', 'init_gpu_device'):
        match = re.match(r'^gpu(\d*)$', value.strip())
        if match:
            return flag, 'cuda' + match.group(1)
    if flag == 'lib.cnmem':
        return 'gpuarray.preallocate', value.strip()
    return None


def _translate_legacy_flags(configparser):
    flags = configparser.THEANO_FLAGS_DICT
    for flag in ('device', 'init_gpu_device', 'lib.cnmem'):
        source = 'THEANO_FLAGS'
        if flag in flags:
            value = flags[flag]
        else:
            section, option = flag.rsplit('.', 1) if '.' in flag else ('global', flag)
            try:
                value = configparser.theano_raw_cfg.get(section, option)
            except Exception:
                continue
            source = '.theanorc [%s]' % section
        translated = translate_legacy_value(flag, value)
        if translated is None:
            continue
        new_flag, new_value = translated
        flags.pop(flag, None)
        flags[new_flag] = new_value
        _remove_from_theanorc(configparser, flag)
        sys.stderr.write(
            'theano_multigpu: %s %s=%s is the old CUDA backend\'s, removed in '
            'Theano 1.0; using %s=%s (write that instead)\n'
            % (source, flag, value, new_flag, new_value))


def _remove_from_theanorc(configparser, flag):
    section, option = flag.rsplit('.', 1) if '.' in flag else ('global', flag)
    for cfg in (configparser.theano_cfg, configparser.theano_raw_cfg):
        if cfg.has_section(section):
            cfg.remove_option(section, option)


def contexts_flag_value(configparser):
    """The raw ``contexts`` flag, from THEANO_FLAGS or .theanorc ('' if unset)."""
    try:
        return configparser.fetch_val_for_key('contexts')
    except KeyError:
        return ''


def on_theano_configparser(configparser):
    """Called once theano.configparser has executed, inside ``import theano``."""
    _translate_legacy_flags(configparser)
    _register_settings(configparser)
    from . import devices
    devices.check_before_theano(parse_contexts_flag(contexts_flag_value(configparser)),
                                configparser)
