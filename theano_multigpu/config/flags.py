"""Parsing the flags' values: the ``contexts`` flag and the ``multigpu.*``
settings, as strings in, Python values out (and sizes back to text).

Pure functions: no Theano, no Keras, no device.
"""
import re

from ..errors import ConfigurationError

__all__ = ['MODES', 'CHECK_ACTIONS', 'BATCHNORM_MODES', 'SCAN_LOOPS', 'SAVE_ON', 'NAME_RE',
           'arrow_entries', 'parse_contexts_flag', 'parse_seconds',
           'format_contexts', 'parse_name_list', 'parse_size', 'parse_split_size',
           'parse_accumulate', 'format_bytes', 'parse_device_memory', 'parse_layer_map']

MODES = ('auto', 'batch', 'layer')
CHECK_ACTIONS = ('warn', 'error', 'off')
BATCHNORM_MODES = ('sync', 'local')
SCAN_LOOPS = ('compiled', 'python')
SAVE_ON = ('0', 'all')

_DEVICE_RE = re.compile(r'^(cuda\d*|opencl\d+:\d+)$')
NAME_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')


def _reserved_name(name):
    """Names Theano refuses as context names (they read as devices)."""
    return name == 'cpu' or name.startswith(('cuda', 'opencl'))


def arrow_entries(value):
    """The entries of a ';'-separated list of 'left->right' entries (the
    contexts flag, multigpu.device_memory, multigpu.layer_map): for each
    non-empty entry, (entry, left, arrow, right), split at its last '->' and
    stripped; ``arrow`` is False (and ``left`` empty) where it has none."""
    for entry in value.split(';'):
        entry = entry.strip()
        if entry:
            left, arrow, right = entry.rpartition('->')
            yield entry, left.strip(), bool(arrow), right.strip()


def parse_contexts_flag(value):
    """``'dev0->cuda0;dev1->cuda1'`` -> ``[('dev0', 'cuda0'), ('dev1', 'cuda1')]``.

    Spaces around names and devices and empty entries are allowed.  Raises
    ConfigurationError for a malformed entry, a bad name or device, or a
    name used twice.
    """
    pairs = []
    for entry, name, arrow, device in arrow_entries(value):
        if not arrow or not name or not device or '->' in name:
            raise ConfigurationError(
                "THEANO_FLAGS contexts expects 'name->device' entries separated "
                "by ';', e.g. 'dev0->cuda0;dev1->cuda1', but received "
                "contexts=%r (entry %r); fix the entry" % (value, entry))
        if not NAME_RE.match(name):
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


def parse_split_size(value):
    """multigpu.shard_split: ``'off'`` -> None (no weight is split); a size
    (``'64KiB'``, ``'0'``) -> its bytes."""
    if value.strip().lower() == 'off':
        return None
    if not _SIZE_RE.match(value.strip()):
        raise ConfigurationError(
            "multigpu.shard_split expects off or a size such as 64KiB, 1MiB or 0 (bytes), "
            "but received %r" % value)
    return parse_size(value, 'multigpu.shard_split')


def parse_accumulate(value):
    """multigpu.accumulate: ``'auto'`` -> 'auto'; ``'4'`` -> 4 (micro-batches
    per context, at least 1)."""
    text = str(value).strip().lower()
    if text == 'auto':
        return 'auto'
    if not text.isdigit() or int(text) < 1:
        raise ConfigurationError(
            "multigpu.accumulate expects auto or a number of micro-batches of at least 1 "
            "(1: none), e.g. THEANO_FLAGS='multigpu.accumulate=4', but received %r" % value)
    return int(text)


def parse_progress(value):
    """multigpu.progress: ``'off'`` -> None (no lines); ``'5'`` -> 5.0, the
    seconds a compile runs before its progress is printed (0: at once)."""
    text = str(value).strip().lower()
    if text == 'off':
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float('inf'):
        raise ConfigurationError(
            "multigpu.progress expects off or the seconds a compile runs before its progress "
            "is printed (0 or more), e.g. THEANO_FLAGS='multigpu.progress=10', but received %r"
            % value)
    return seconds


def format_bytes(n):
    """67108864 -> '64.0 MiB': the inverse of parse_size, for messages and reports."""
    for unit, size in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if n >= size:
            return '%.1f %s' % (n / size, unit)
    return '%d B' % n


def parse_device_memory(value):
    """``'64MiB'`` -> ``{None: bytes}`` (every context);
    ``'dev0->64MiB;dev1->1GiB'`` -> ``{'dev0': ..., 'dev1': ...}``; '' -> {}."""
    budgets = {}
    for _, name, arrow, size in arrow_entries(value):
        if arrow and not NAME_RE.match(name):
            raise ConfigurationError(
                "multigpu.device_memory expects a size for every context (64MiB) "
                "or 'name->size' entries separated by ';', but received %r" % value)
        budgets[name or None] = parse_size(size)
    return budgets


def parse_layer_map(value):
    """``'dense_[12]->dev0;dense_3->dev1'`` -> ``[('dense_[12]', 'dev0'), ...]``:
    layer-name patterns (shell style) and the context each goes to."""
    pairs = []
    for entry, pattern, arrow, name in arrow_entries(value):
        if not arrow or not pattern or not NAME_RE.match(name):
            raise ConfigurationError(
                "multigpu.layer_map expects 'pattern->context' entries separated by "
                "';', e.g. 'dense_[12]->dev0;dense_3->dev1', but received %r "
                "(entry %r)" % (value, entry))
        pairs.append((pattern, name))
    return pairs


def parse_seconds(flag, value):
    """A positive number of seconds, e.g. ``'300'`` or ``'2.5'``."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = None
    if seconds is None or not seconds > 0:
        raise ConfigurationError(
            "%s expects a positive number of seconds, e.g. THEANO_FLAGS='%s=300', but "
            "received %r" % (flag, flag, value))
    return seconds
