"""theano_multigpu's settings as Theano config variables, and the old CUDA
backend's flags.

Everything here runs inside ``import theano``, right after
``theano.configparser`` has executed and before Theano reads its own flags
(see ``on_theano_configparser``): settings become Theano config variables
(``multigpu.*`` in THEANO_FLAGS or a ``[multigpu]`` section of .theanorc),
the old CUDA backend's flags are translated, and the ``contexts`` flag and
the devices are checked so that a bad one stops with a clear error.
"""
import functools
import re
import sys

from ..errors import ConfigurationError
from ..patch_targets import Attributes
from . import devices, mesh
from .flags import (BATCHNORM_MODES, CHECK_ACTIONS, MODES, NAME_RE, SAVE_ON, SCAN_LOOPS,
                    format_contexts, parse_contexts_flag, parse_device_memory, parse_layer_map,
                    parse_name_list, parse_seconds)

__all__ = ['LEGACY_FLAGS', 'translate_legacy_value', 'contexts_flag_value',
           'on_theano_configparser']

CONFIGPARSER = Attributes(
    'theano.configparser',
    ('THEANO_FLAGS_DICT', 'theano_cfg', 'theano_raw_cfg', 'fetch_val_for_key',
     'AddConfigVar', 'ConfigParam', 'BoolParam', 'config'),
    'settings are added to it and old flags rewritten in it before Theano reads them')

def _filter_with(parse):
    def check(value):
        parse(value)
        return value
    return check


def _filter_choice(flag, choices, example):
    """A filter accepting one of ``choices`` for setting ``flag``."""
    def check(value):
        if value not in choices:
            raise ConfigurationError(
                "%s expects one of %s, but received %r; e.g. THEANO_FLAGS='%s=%s'"
                % (flag, '/'.join(choices), value, flag, example))
        return value
    return check


_filter_mode = _filter_choice('multigpu.mode', MODES, 'batch')
_filter_check = _filter_choice('multigpu.check', CHECK_ACTIONS, 'error')
_filter_batchnorm = _filter_choice('multigpu.batchnorm', BATCHNORM_MODES, 'local')
_filter_scan_loop = _filter_choice('multigpu.scan_loop', SCAN_LOOPS, 'python')
_filter_save_on = _filter_choice('multigpu.save_on', SAVE_ON, 'all')
_filter_mpi_timeout = _filter_with(functools.partial(parse_seconds, 'multigpu.mpi_timeout'))


def _filter_names(flag):
    def check(value):
        for name in parse_name_list(value):
            if not NAME_RE.match(name):
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
        'The context that computes the loss and metrics, and holds the weights '
        'when they are not sharded (default: the first one taking part).',
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
        "Layer-wise and sharded batch-wise mode: the memory the plan may use on "
        "each context, e.g. "
        "'64MiB', or per context 'dev0->64MiB;dev1->1GiB' (default: the "
        "device's free memory).",
        Param('', filter=_filter_with(parse_device_memory)), in_c_key=False)
    add('multigpu.batchnorm',
        "Batch-wise mode (and layer-wise under MPI): BatchNormalization's "
        "statistics in training, 'sync' (of the whole batch, as on one device) or "
        "'local' (of each context's, or rank's, rows: no wait, other numbers).",
        Param('sync', filter=_filter_batchnorm), in_c_key=False)
    add('multigpu.shard',
        "Batch-wise mode over two or more contexts (of each MPI rank): each weight "
        "and its optimizer state live on one owner context, chosen to balance "
        "bytes, which sends the weight to the other contexts and sums their "
        "gradients (False: the master holds every weight and all optimizer "
        "state).  The same numbers either way.",
        configparser.BoolParam(True), in_c_key=False)
    add('multigpu.scan_loop',
        "Scan's loop (recurrent layers): 'compiled' (built with Cython at first "
        "use; the Python loop, with a warning, where it cannot be built) or "
        "'python'.  The same numbers either way.",
        Param('compiled', filter=_filter_scan_loop), in_c_key=False)
    add('multigpu.save_on',
        "Under MPI: which ranks write the files of save_weights, model.save, "
        "ModelCheckpoint and CSVLogger: '0' (rank 0; the others wait until its "
        "file is complete) or 'all' (each rank its own, for disks local to "
        "each machine).",
        Param('0', filter=_filter_save_on), in_c_key=False)
    add('multigpu.mpi_timeout',
        "Under MPI: how many seconds a rank waits in a collective (a training, "
        "test or prediction step, a save, the agreement before a function's "
        "first compile) for the other ranks to make the same call before it "
        "stops every rank with an error (a function's first step at each batch "
        "size waits without limit: a rank may be compiling); 'inf': no limit "
        "(MPI's blocking collectives).  Finite or not, the same on every rank.",
        Param('300', filter=_filter_mpi_timeout), in_c_key=False)
    add('multigpu.mpi_check_inputs',
        "Under MPI: each step, every rank checks that every rank was handed the "
        "same inputs, targets and sample weights (a digest of each travels with "
        "the gather), and a rank handed others stops every rank with an error; "
        "False: each rank trains on its share of the rows of its own batch.",
        configparser.BoolParam(True), in_c_key=False)
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
    CONFIGPARSER.check(configparser)
    _translate_legacy_flags(configparser)
    _register_settings(configparser)
    raw = contexts_flag_value(configparser)
    pairs = parse_contexts_flag(raw)
    if raw != format_contexts(pairs):
        configparser.THEANO_FLAGS_DICT['contexts'] = format_contexts(pairs)
    pairs = devices.check_before_theano(pairs, configparser)
    mesh.from_flags(format_contexts(pairs), *_settings_of(configparser))
