"""theano_multigpu's settings (``SETTINGS``, the one table of them) as Theano
config variables, and the old CUDA backend's flags.

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
                    format_contexts, parse_accumulate, parse_contexts_flag, parse_device_memory,
                    parse_layer_map, parse_name_list, parse_progress, parse_seconds,
                    parse_split_size)

__all__ = ['Setting', 'SETTINGS', 'SETTING', 'LEGACY_FLAGS', 'translate_legacy_value',
           'contexts_flag_value', 'on_theano_configparser']

CONFIGPARSER = Attributes(
    'theano.configparser',
    ('THEANO_FLAGS_DICT', 'theano_cfg', 'theano_raw_cfg', 'fetch_val_for_key',
     'AddConfigVar', 'ConfigParam', 'BoolParam', 'config'),
    'settings are added to it and old flags rewritten in it before Theano reads them')


class Setting(object):
    """One row of the settings table.

    ``kind`` is 'bool', 'choice' (one of ``choices``) or 'text' (checked by
    ``parse``); ``default`` is the text Theano parses; ``unset`` says what an
    empty value means (shown by ``info`` and in the README); ``summary`` is the
    README's line (reStructuredText), ``help`` the full text (Theano's doc,
    ``python -m theano_multigpu settings`` and theanorc.example).  ``fixes``:
    the compatibility fixes read it, so it exists with them alone too
    (THEANO_MULTIGPU_COMPAT=1).
    """

    def __init__(self, name, default, summary, help, kind='text', choices=(),
                 parse=None, example='', unset='', fixes=False):
        self.name = name
        self.default = default
        self.summary = summary
        self.help = help
        self.kind = kind
        self.choices = tuple(choices)
        self.parse = parse
        self.example = example
        self.unset = unset
        self.fixes = fixes

    @property
    def option(self):
        """The name inside the ``[multigpu]`` section of .theanorc."""
        return self.name.split('.', 1)[1]

    def check(self, value):
        """``value`` if this setting accepts it, else ConfigurationError."""
        if self.kind == 'choice' and value not in self.choices:
            raise ConfigurationError(
                "%s expects one of %s, but received %r; e.g. THEANO_FLAGS='%s=%s'"
                % (self.name, '/'.join(self.choices), value, self.name, self.example))
        if self.parse is not None:
            self.parse(value)
        return value

    def shown(self, value):
        """``value`` as ``info`` prints it: the meaning of an empty value."""
        return self.unset if value == '' and self.unset else value

    def __repr__(self):
        return 'Setting(%r, default=%r)' % (self.name, self.default)


def _context_names(flag):
    """A check of ``flag``'s value: context names separated by ';' or '+'."""
    def check(value):
        for name in parse_name_list(value):
            if not NAME_RE.match(name):
                raise ConfigurationError(
                    "%s expects context names from the contexts flag, "
                    "separated by ';' or '+', but received %r" % (flag, value))
    return check


def _ranks_per_machine(value):
    """A check of multigpu.mpi_ranks_per_machine: a whole number >= 0."""
    if not (value.isdigit() and value.isascii()):
        raise ConfigurationError(
            "multigpu.mpi_ranks_per_machine expects a whole number of ranks, 0 or more, "
            "but received %r; e.g. THEANO_FLAGS='multigpu.mpi_ranks_per_machine=2'" % value)


# The one table of the package's settings: Theano's config variables are
# registered from it, ``info`` prints it, and README.rst's settings table and
# theanorc.example are written from it (``python -m theano_multigpu settings
# --write``; tests/test_settings.py fails when they differ).
SETTINGS = (
    Setting(
        'multigpu.mode', 'auto', kind='choice', choices=MODES, example='batch',
        summary="``auto`` (batch-wise with two or more contexts), ``batch`` or "
                "``layer``",
        help="How work is spread over the contexts.  auto: batch-wise with two "
             "or more contexts, else one context.  batch: data parallel (each "
             "context takes a slice of every batch).  layer: model parallel "
             "(each context holds some of the layers)."),
    Setting(
        'multigpu.contexts', '', parse=_context_names('multigpu.contexts'),
        unset='(all)',
        summary="names taking part, separated by ``;`` or ``+``, e.g. "
                "``dev1+dev0``",
        help="Which names of the contexts flag take part, separated by ';' or "
             "'+', e.g. dev1+dev0 (default: all, in flag order)."),
    Setting(
        'multigpu.master', '', parse=_context_names('multigpu.master'),
        unset='(first)',
        summary="the context that computes the loss and metrics (and holds the "
                "weights, unsharded)",
        help="The context that computes the loss and metrics, and holds the "
             "weights when they are not sharded (default: the first one taking "
             "part)."),
    Setting(
        'multigpu.shard', True, kind='bool',
        summary="batch-wise: each weight and its optimizer state live on one "
                "owner context; ``False``: the master holds them all",
        help="Batch-wise mode over two or more contexts (of each MPI rank): "
             "each weight and its optimizer state live on one owner context, "
             "chosen to balance bytes (counting random generators' states on "
             "the master); the owner sends the weight to the other contexts, "
             "sums their gradients and updates it.  False: the master holds "
             "every weight and all optimizer state.  The same numbers either "
             "way."),
    Setting(
        'multigpu.shard_split', '64KiB', parse=parse_split_size, example='0',
        summary="sharded batch-wise: a weight of at least this size is split "
                "into one block of rows per context (``64KiB``, ``0``: every "
                "weight that can be); ``off``: each weight has one owner",
        help="Sharded batch-wise mode: a weight of at least this size (e.g. "
             "64KiB; 0: every weight) that a function trains, with at least as "
             "many rows as there are contexts and optimizer state of its shape, "
             "is split along its first axis into one block of rows per context, "
             "and its optimizer state with it, when the first function that "
             "reads it compiles (a predict before the fit splits the trainable "
             "weights by size and rows alone).  "
             "Each step every context gathers the whole weight from the "
             "blocks, sends each block its gradient and updates its own block: "
             "every context holds 1/N of the weight and its state, and sends "
             "and receives "
             "2(N-1)/N of the weight's bytes.  A weight whose update reads "
             "across its rows (a custom constraint with a dot or a sort) keeps "
             "one owner (split before by predict, it is updated whole on the "
             "master), as do smaller weights.  off: every weight has one "
             "owner.  The same numbers either way."),
    Setting(
        'multigpu.accumulate', 'auto', parse=parse_accumulate, example='4',
        summary="batch-wise: each context computes its rows as K micro-batches, "
                "one after the other, and one update applies their summed "
                "gradients; ``auto``: the smallest K whose peak fits, where one "
                "step's does not; ``1``: never",
        help="Batch-wise mode in one process: each context computes its rows of "
             "the batch as K micro-batches, one after the other, and one update "
             "applies their summed gradients: the same numbers as one step at the "
             "whole batch, with the activations of one micro-batch at a time (the "
             "forward runs twice: once for the loss, once again for each "
             "micro-batch's backward).  auto: K is 1 while a call's planned peak "
             "fits (see multigpu.device_memory), else the smallest K that fits, "
             "said on stderr and in the report's title.  A number sets K (at most "
             "the rows per context); 1 turns it off.  Refused where the rows of "
             "micro-batches meet inside the layers (BatchNormalization with "
             "multigpu.batchnorm=sync, an op over the whole batch) and under MPI "
             "(where auto stays at 1).  "
             "With multigpu.batchnorm=local each micro-batch normalises with its "
             "own rows' statistics: numbers that change with K."),
    Setting(
        'multigpu.check', 'warn', kind='choice', choices=CHECK_ACTIONS,
        example='error',
        summary="what to do when a compiled function's heavy ops do not run "
                "where their data is: ``warn``, ``error`` or ``off``",
        help="After compiling, heavy ops (dot, convolution, pooling, softmax, "
             "scan) must run on the context that holds their data: warn, error "
             "(PlacementError) or off."),
    Setting(
        'multigpu.measure_peak', False, kind='bool',
        summary="measure the bytes each context holds at every op of each "
                "call (slower steps); the report shows the peak",
        help="Compile each function with Theano's Python VM and a callback that "
             "adds up, after every op, the bytes of the arrays the function "
             "holds on each context (inputs, weights, every value not yet "
             "freed) and keeps the most seen: the step's measured peak per "
             "context, in the placement report's 'peak run' column.  The steps run "
             "slower: a mode to measure with, not to train with."),
    Setting(
        'multigpu.report', False, kind='bool',
        summary="print each function's placement report at its first call",
        help="Print each function's placement report (share of the batch, heavy "
             "ops, resident bytes, bytes moved) at its first call; also: "
             "`python -m theano_multigpu report train.py`."),
    Setting(
        'multigpu.progress', '5', parse=parse_progress, example='off',
        summary="once a function's compile has run this many seconds, lines on "
                "stderr say its phase, ops linked, C modules built and the time; "
                "``off``: none",
        help="Once a function's compile has run this many seconds (0: at once), "
             "lines on stderr say which function (Keras's train, test or predict "
             "function, or the script's K.function), on how many contexts, the "
             "size of its graph, the phase (the shim's rewrite, the gradients, "
             "Theano's optimiser, linking its ops: how many are linked and how "
             "many C modules were built) and the time so far; the last line says the "
             "total and each phase's time.  Under MPI, rank 0 alone prints.  "
             "off: no lines."),
    Setting(
        'multigpu.layer_map', '', parse=parse_layer_map, unset='(balanced plan)',
        summary="layer-wise: layer-name patterns and their contexts, "
                "``dense_[12]->dev0;dense_3->dev1``",
        help="Layer-wise mode: which context holds which layers, as layer-name "
             "patterns (shell style), e.g. dense_[12]->dev0;dense_3->dev1 "
             "(default: a plan balanced by memory).  Unmatched layers follow "
             "the layer before."),
    Setting(
        'multigpu.device_memory', '', parse=parse_device_memory,
        unset='(free memory)',
        summary="layer-wise and sharded batch-wise: the memory the plan may use "
                "per context, ``64MiB``, or per name ``dev0->64MiB;dev1->1GiB``",
        help="Layer-wise and sharded batch-wise mode: the memory the plan may "
             "use on each context (default: the device's free memory), e.g. "
             "64MiB, or per context dev0->64MiB;dev1->1GiB.  A plan that does "
             "not fit stops before compiling.  In every batch-wise and "
             "layer-wise mode it also caps the step's planned peak (default: "
             "the device's memory): a call whose peak does not fit stops "
             "before it runs."),
    Setting(
        'multigpu.batchnorm', 'sync', kind='choice', choices=BATCHNORM_MODES,
        example='local',
        summary="BatchNormalization's statistics in training: of the whole "
                "batch (``sync``, as one device) or of each context's rows "
                "(``local``)",
        help="Batch-wise mode (and layer-wise under MPI): BatchNormalization's "
             "statistics in training.  sync: of the whole batch, as on one "
             "device (each layer waits for every context's rows); local: of "
             "each context's, or rank's, rows (no wait, other numbers).  Keras "
             "before 1.2 computes the statistics with K.mean: sync computes "
             "them over the whole batch."),
    Setting(
        'multigpu.mpi_shared_memory', True, kind='bool',
        summary="under MPI: ranks on one machine sum gradients in shared "
                "memory; ``False``: MPI Allreduce alone",
        help="Under MPI (mpirun): ranks on one machine sum their gradients in "
             "shared memory (an MPI-3 window) and one rank per machine joins "
             "MPI Allreduce.  False: every rank uses MPI Allreduce (for an MPI "
             "without MPI-3 shared windows, or a small /dev/shm)."),
    Setting(
        'multigpu.mpi_ranks_per_machine', '0', parse=_ranks_per_machine,
        summary="under MPI: ``0``: the ranks sharing memory sum as one machine; "
                "``N``: each block of N ranks sums as a machine of its own",
        help="Under MPI, with mpi_shared_memory: which ranks sum their "
             "gradients together in shared memory before one rank of each such "
             "group (a machine) joins MPI Allreduce with the others.  0: all "
             "the ranks of a machine (those MPI finds sharing memory).  N: "
             "blocks of N consecutive ranks of a machine (its rank there // N), each "
             "summed as a machine of its own: runs the path between machines "
             "on one (to test a multi-machine job before it runs on several), "
             "or keeps each group within one CPU socket.  The same on every "
             "rank (checked before compiling)."),
    Setting(
        'multigpu.save_on', '0', kind='choice', choices=SAVE_ON, example='all',
        summary="under MPI: rank ``0`` writes the files of saves (the others "
                "wait for it) or ``all`` ranks (disks of their own)",
        help="Under MPI: which ranks write the files of save_weights, "
             "model.save, ModelCheckpoint and CSVLogger.  0: rank 0, and every "
             "rank returns once its file is complete (a load right after a "
             "save reads it); all: every rank writes its own (each machine "
             "with a disk of its own and one rank)."),
    Setting(
        'multigpu.mpi_timeout', '300',
        parse=functools.partial(parse_seconds, 'multigpu.mpi_timeout'),
        summary="under MPI: seconds a rank waits for the others in a step, a "
                "save or before a compile, then stops every rank; ``inf``: no "
                "limit",
        help="Under MPI: seconds a rank waits in a collective (a training, "
             "test or prediction step, a save, the agreement before a "
             "function's first compile) for the other ranks to make the same "
             "call; then every rank stops with an error naming the call.  A "
             "function's first step at each batch size, and the wait for ranks "
             "still compiling a function, have no limit (a rank may be "
             "compiling).  inf: no limit (MPI's blocking collectives).  Finite "
             "or not, the same on every rank (checked before compiling, with "
             "mpi_check_inputs, mpi_shared_memory, mpi_ranks_per_machine, "
             "batchnorm, the mode and the number of contexts)."),
    Setting(
        'multigpu.mpi_check_inputs', True, kind='bool',
        summary="under MPI: every step, check that every rank was handed the "
                "same batch; ``False``: each rank trains on its share of its "
                "own batch",
        help="Under MPI: every step, the ranks check that they were handed the "
             "same inputs, targets and sample weights (a digest of each travels "
             "with the step's gather); a rank handed others stops every rank "
             "with an error.  False: each rank trains on its share of the rows "
             "of its own batch, with its own targets."),
    Setting(
        'multigpu.scan_loop', 'compiled', kind='choice', choices=SCAN_LOOPS,
        example='python', fixes=True,
        summary="recurrent layers: Scan's loop, ``compiled`` (built at first "
                "use) or ``python``; the same numbers either way",
        help="Recurrent layers: Scan's loop.  compiled: built with Cython at "
             "the first scan (once, into Theano's compile cache; where it "
             "cannot be built, the Python loop runs after one warning); "
             "python: Theano's loop in Python.  The same numbers either way."),
    Setting(
        'multigpu.scan_reuse', False, kind='bool', example='True', fixes=True,
        summary="recurrent layers: the backward loop reads the products "
                "h(t-1) . U the forward loop computed (kept, one per step) "
                "instead of computing them again; for one context per process",
        help="Recurrent layers: when a scan's gradient is taken, the matrix "
             "products of its step that depend on its states (an LSTM's four "
             "h(t-1) . U) are kept from the forward loop, one per step, and "
             "the backward loop reads them instead of computing them again "
             "(more memory: the kept products).  For one context per process "
             "for now: with several, Theano merged two replicas' backward "
             "loops onto one context."),
    Setting(
        'multigpu.precompiled_headers', True, kind='bool', example='False',
        fixes=True,
        summary="Theano's C modules read a recurring block of ``#include`` lines "
                "from a precompiled header (g++ takes about half the time at -O0, "
                "three quarters at -O3); ``False``: as Theano wrote them",
        help="Theano's C modules: a block of #include lines that starts four "
             "modules or more is precompiled once (a .gch of 40 to 50 MB in the "
             "compiledir) and read from there: g++ takes about half the time at "
             "-O0, three quarters at Theano's -O3.  The same code either way.  "
             "False: every module compiles as Theano wrote it."),
)

SETTING = {setting.name: setting for setting in SETTINGS}


def _register_settings(configparser, settings=SETTINGS):
    """``settings`` as Theano config variables, but for those that are
    already (the fixes' own, registered first)."""
    section = getattr(configparser.config, 'multigpu', None)
    registered = set(vars(type(section))) if section is not None else set()
    for setting in settings:
        if setting.option in registered:
            continue
        if setting.kind == 'bool':
            param = configparser.BoolParam(setting.default)
        else:
            param = configparser.ConfigParam(setting.default, filter=setting.check)
        configparser.AddConfigVar(setting.name, setting.help, param, in_c_key=False)


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


def register_settings_of_the_fixes(configparser):
    """Called once theano.configparser has executed: the settings the
    compatibility fixes read, with the fixes alone too."""
    CONFIGPARSER.check(configparser)
    _register_settings(configparser, [setting for setting in SETTINGS if setting.fixes])


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
    mesh.from_pairs(pairs, *_settings_of(configparser))
