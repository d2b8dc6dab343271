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

__all__ = ['MODES', 'parse_contexts_flag', 'format_contexts', 'parse_name_list',
           'parse_size', 'parse_device_memory', 'parse_layer_map',
           'translate_legacy_value', 'on_theano_configparser']

MODES = ('auto', 'batch', 'layer')
CHECK_ACTIONS = ('warn', 'error', 'off')

_DEVICE_RE = re.compile(r'^(cuda\d*|opencl\d+:\d+)$')
_NAME_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')


def _reserved_name(name):
    """Names Theano refuses as context names (they read as devices)."""
    return name == 'cpu' or name.startswith(('cuda', 'opencl'))


def parse_contexts_flag(value):
    """``'dev0->cuda0;dev1->cuda1'`` -> ``[('dev0', 'cuda0'), ('dev1', 'cuda1')]``.

    Spaces around names and devices and empty entries are allowed.  Raises
    ConfigurationError for a malformed entry, a bad name or device, or a
    name used twice.
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
        if _reserved_name(name):
            raise ConfigurationError(
                "THEANO_FLAGS contexts expects context names that do not read "
                "as devices (not 'cpu', 'cuda*' or 'opencl*'), but received %r "
                "in contexts=%r; use e.g. 'dev0->%s'" % (name, value, device))
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


def format_contexts(pairs):
    """The inverse of parse_contexts_flag: ``'dev0->cuda0;dev1->cuda1'``."""
    return ';'.join('%s->%s' % pair for pair in pairs)


def parse_name_list(value):
    """``'dev0;dev1'`` (or spaces, or '+') -> ``['dev0', 'dev1']``."""
    return [n for n in re.split(r'[;+\s]+', value.strip()) if n]


_SIZE_RE = re.compile(r'^(\d+(?:\.\d*)?)\s*([KMGT]i?B|B)?$', re.IGNORECASE)
_UNITS = {'b': 1, 'kb': 10 ** 3, 'mb': 10 ** 6, 'gb': 10 ** 9, 'tb': 10 ** 12,
          'kib': 1 << 10, 'mib': 1 << 20, 'gib': 1 << 30, 'tib': 1 << 40}


def parse_size(value, flag='multigpu.device_memory'):
    """``'64MiB'`` -> 67108864; a plain number is bytes."""
    match = _SIZE_RE.match(value.strip())
    if not match:
        raise ConfigurationError(
            "%s expects a size such as 64MiB, 1.5GiB or 1000000 (bytes), but "
            "received %r" % (flag, value))
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or 'b').lower()])


def parse_device_memory(value):
    """``'64MiB'`` -> ``{None: bytes}`` (every context);
    ``'dev0->64MiB;dev1->1GiB'`` -> ``{'dev0': ..., 'dev1': ...}``; '' -> {}."""
    budgets = {}
    for entry in value.split(';'):
        entry = entry.strip()
        if not entry:
            continue
        name, arrow, size = entry.rpartition('->')
        if arrow and not _NAME_RE.match(name.strip()):
            raise ConfigurationError(
                "multigpu.device_memory expects a size for every context (64MiB) "
                "or 'name->size' entries separated by ';', but received %r" % value)
        budgets[name.strip() or None] = parse_size(size)
    return budgets


def parse_layer_map(value):
    """``'dense_[12]->dev0;dense_3->dev1'`` -> ``[('dense_[12]', 'dev0'), ...]``:
    layer-name patterns (shell style) and the context each goes to."""
    pairs = []
    for entry in value.split(';'):
        entry = entry.strip()
        if not entry:
            continue
        pattern, arrow, name = entry.rpartition('->')
        if not arrow or not pattern.strip() or not _NAME_RE.match(name.strip()):
            raise ConfigurationError(
                "multigpu.layer_map expects 'pattern->context' entries separated by "
                "';', e.g. 'dense_[12]->dev0;dense_3->dev1', but received %r "
                "(entry %r)" % (value, entry))
        pairs.append((pattern.strip(), name.strip()))
    return pairs


def _filter_with(parse):
    def check(value):
        parse(value)
        return value
    return check


def _filter_mode(value):
    if value not in MODES:
        raise ConfigurationError(
            "multigpu.mode expects one of %s, but received %r; e.g. "
            "THEANO_FLAGS='multigpu.mode=batch'" % ('/'.join(MODES), value))
    return value


def _filter_check(value):
    if value not in CHECK_ACTIONS:
        raise ConfigurationError(
            "multigpu.check expects one of %s, but received %r; e.g. "
            "THEANO_FLAGS='multigpu.check=error'" % ('/'.join(CHECK_ACTIONS), value))
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
    add('multigpu.check',
        "What to do when a compiled function's heavy ops do not run on the "
        "context that holds their data: 'warn', 'error' or 'off'.",
        Param('warn', filter=_filter_check), in_c_key=False)
    add('multigpu.report',
        'Print the placement report of each function at its first call.',
        configparser.BoolParam(False), in_c_key=False)
    add('multigpu.layer_map',
        "Layer-wise mode: which context holds which layers, as layer-name "
        "patterns, e.g. 'dense_[12]->dev0;dense_3->dev1' (default: a plan "
        "balanced by memory).",
        Param('', filter=_filter_with(parse_layer_map)), in_c_key=False)
    add('multigpu.device_memory',
        "Layer-wise mode: the memory the plan may use on each context, e.g. "
        "'64MiB', or per context 'dev0->64MiB;dev1->1GiB' (default: the "
        "device's free memory).",
        Param('', filter=_filter_with(parse_device_memory)), in_c_key=False)
    add('multigpu.mpi_shared_memory',
        'Under MPI: ranks on one machine sum their gradients in shared memory '
        '(an MPI-3 window), and one rank per machine with MPI Allreduce; False: '
        'every rank with MPI Allreduce.',
        configparser.BoolParam(True), in_c_key=False)


# The old CUDA backend's flags, which Theano 1.0 removed.
LEGACY_FLAGS = ('device', 'init_gpu_device', 'lib.cnmem')


def translate_legacy_value(flag, value):
    """(new flag, new value) for an old CUDA backend flag, or None.

    ``device=gpu`` / ``gpuN`` -> ``cuda`` / ``cudaN`` (also init_gpu_device);
    ``lib.cnmem=X`` -> ``gpuarray.preallocate=X`` (both: 0 off, up to 1 a
    fraction of the GPU's memory, above 1 MiB).
    """
    value = value.strip()
    if flag in ('device', 'init_gpu_device'):
        match = re.match(r'^gpu(\d*)$', value)
        if match:
            return flag, 'cuda' + match.group(1)
        return None
    if flag == 'lib.cnmem':
        try:
            float(value)
        except ValueError:
            raise ConfigurationError(
                "lib.cnmem (the old CUDA backend's, read as gpuarray.preallocate) "
                "expects a number, e.g. lib.cnmem=0.8, but received %r; write "
                "gpuarray.preallocate=0.8 instead" % value)
        return 'gpuarray.preallocate', value
    return None


def _split_flag(flag):
    return flag.rsplit('.', 1) if '.' in flag else ('global', flag)


def _legacy_value(configparser, flag):
    """(value, where it was given) of ``flag``, or (None, None)."""
    if flag in configparser.THEANO_FLAGS_DICT:
        return configparser.THEANO_FLAGS_DICT[flag], 'THEANO_FLAGS'
    section, option = _split_flag(flag)
    try:
        return configparser.theano_raw_cfg.get(section, option), '.theanorc [%s]' % section
    except Exception:  # no such section or option
        return None, None


def _is_set(configparser, flag):
    try:
        configparser.fetch_val_for_key(flag)
    except KeyError:
        return False
    return True


def _translate_legacy_flags(configparser):
    """Rewrite the old CUDA flags in place, with a one-line notice each.
    A new flag set explicitly wins over the old one it replaces."""
    for flag in LEGACY_FLAGS:
        value, source = _legacy_value(configparser, flag)
        if value is None:
            continue
        translated = translate_legacy_value(flag, value)
        if translated is None:
            continue
        new_flag, new_value = translated
        keep_new = new_flag != flag and _is_set(configparser, new_flag)
        configparser.THEANO_FLAGS_DICT.pop(flag, None)
        _remove_from_theanorc(configparser, flag)
        if keep_new:
            sys.stderr.write(
                "theano_multigpu: %s %s=%s is the old CUDA backend's flag, removed "
                "in Theano 1.0; ignoring it, as %s is set too\n"
                % (source, flag, value, new_flag))
            continue
        configparser.THEANO_FLAGS_DICT[new_flag] = new_value
        sys.stderr.write(
            "theano_multigpu: %s %s=%s is the old CUDA backend's flag, removed in "
            "Theano 1.0; using %s=%s instead (write that to silence this notice)\n"
            % (source, flag, value, new_flag, new_value))


def _remove_from_theanorc(configparser, flag):
    section, option = _split_flag(flag)
    for cfg in (configparser.theano_cfg, configparser.theano_raw_cfg):
        if cfg.has_section(section):
            cfg.remove_option(section, option)


def contexts_flag_value(configparser):
    """The raw ``contexts`` flag, from THEANO_FLAGS or .theanorc ('' if unset)."""
    try:
        return configparser.fetch_val_for_key('contexts')
    except KeyError:
        return ''


def _settings_of(configparser):
    multigpu = configparser.config.multigpu
    return multigpu.mode, multigpu.contexts, multigpu.master


def on_theano_configparser(configparser):
    """Called once theano.configparser has executed, inside ``import theano``.

    Translates old CUDA flags, registers the multigpu.* settings, checks the
    contexts flag, the settings and the devices (raising ConfigurationError
    before Theano tries them), and writes the contexts flag back in the form
    Theano parses (no spaces, no empty entries).
    """
    from . import devices, mesh
    _translate_legacy_flags(configparser)
    _register_settings(configparser)
    raw = contexts_flag_value(configparser)
    pairs = parse_contexts_flag(raw)
    if raw != format_contexts(pairs):
        configparser.THEANO_FLAGS_DICT['contexts'] = format_contexts(pairs)
    pairs = devices.check_before_theano(pairs, configparser)
    mesh.from_flags(format_contexts(pairs), *_settings_of(configparser))
