"""Devices and named contexts: what the machine has, and registering every
name of the ``contexts`` flag with a context of its own.

Theano registers only the first name given for a device string
(``init_dev`` keys contexts by device); ``register_missing_names`` gives the
others a context each, so one GPU or one pocl device can host several.
"""
import sys

from ..errors import ConfigurationError
from ..patch_targets import Attributes
from .flags import format_contexts
from .session import current_session

__all__ = ['have_pygpu', 'survey_devices', 'available_devices', 'check_devices_exist',
           'check_before_theano', 'register_missing_names', 'set_default_context',
           'default_is', 'context_memory', 'free_memory', 'device_kind']

PYGPU_INSTALL = ('apt-get install python3-pygpu libgpuarray-dev '
                 '(and make the virtual environment with --system-site-packages)')

INIT_DEV = Attributes('theano.gpuarray.init_dev', ('devmap',),
                      'its registry of opened devices is read, to open one device '
                      'under several names')


def have_pygpu():
    try:
        import pygpu  # noqa: F401
        import pygpu.gpuarray  # noqa: F401
    except ImportError:
        return False
    return True


def survey_devices():
    """(device strings that libgpuarray can open here, e.g. ['opencl0:0'];
    the drivers' messages where counting failed, e.g. ['cuda: Could not
    load "libcuda.so": ...']).  A driver that cannot count is reported, not
    taken for a driver without devices."""
    import pygpu.gpuarray as gpuarray
    found, problems = [], []
    try:
        found += ['cuda%d' % i for i in range(gpuarray.count_devices('cuda', 0))]
    except gpuarray.GpuArrayException as error:
        problems.append('cuda: %s' % _driver_message(error))
    try:
        for platform in range(gpuarray.count_platforms('opencl')):
            found += ['opencl%d:%d' % (platform, d)
                      for d in range(gpuarray.count_devices('opencl', platform))]
    except gpuarray.GpuArrayException as error:
        problems.append('opencl: %s' % _driver_message(error))
    return found, problems


def _driver_message(error):
    """libgpuarray's message (pygpu gives it as bytes)."""
    message = error.args[0] if len(error.args) == 1 else error
    if isinstance(message, bytes):
        return message.decode('utf-8', 'replace')
    return str(message)


def available_devices():
    """Device strings that libgpuarray can open here, e.g. ['opencl0:0']
    (``survey_devices`` gives the drivers' messages too)."""
    return survey_devices()[0]


def _found_text(found, problems, device):
    """'opencl0:0, opencl0:1' or 'none', with the messages of the driver
    of ``device`` (a device string) where it could not count."""
    text = ', '.join(found) or 'none'
    said = [p for p in problems if p.startswith(device_kind(device) + ': ')]
    if said:
        text += ' (the driver said: %s)' % '; '.join(said)
    return text


def _device_exists(device, found):
    if device == 'cuda':
        return any(d.startswith('cuda') for d in found)
    return device in found


def _warn_no_pygpu():
    if current_session().first_notice('no pygpu'):
        sys.stderr.write('theano_multigpu: pygpu is not installed, so this runs '
                         'as the plain Theano backend on one device; for GPU '
                         'contexts: %s\n' % PYGPU_INSTALL)


def _drop_contexts_flag(configparser):
    configparser.THEANO_FLAGS_DICT.pop('contexts', None)
    for cfg in (configparser.theano_cfg, configparser.theano_raw_cfg):
        if cfg.has_section('global'):
            cfg.remove_option('global', 'contexts')


def _device_flags(configparser):
    """[(flag, value)] for device/init_gpu_device flags that name a GPU."""
    named = []
    for flag in ('device', 'init_gpu_device'):
        try:
            value = configparser.fetch_val_for_key(flag).strip()
        except KeyError:
            continue
        if value.startswith(('cuda', 'opencl')):
            named.append((flag, value))
    return named


def check_before_theano(pairs, configparser):
    """Stop early, with the devices found, when the contexts or the device
    flag cannot work.  Returns the contexts kept: without pygpu, a single
    context is dropped (plain Theano on the CPU, with one warning)."""
    gpu_flags = _device_flags(configparser)
    if not have_pygpu():
        if len(pairs) > 1:
            raise ConfigurationError(
                'THEANO_FLAGS contexts=%r asks for %d contexts, which needs pygpu '
                '(libgpuarray), but it is not installed; %s'
                % (format_contexts(pairs), len(pairs), PYGPU_INSTALL))
        for flag, value in gpu_flags:
            raise ConfigurationError(
                'THEANO_FLAGS %s=%s asks for a GPU, which needs pygpu '
                '(libgpuarray), but it is not installed; %s, or use %s=cpu'
                % (flag, value, PYGPU_INSTALL, flag))
        if pairs:
            _warn_no_pygpu()
            _drop_contexts_flag(configparser)
        return []
    if not pairs and not gpu_flags:
        return pairs
    found, problems = survey_devices()
    check_devices_exist(pairs, gpu_flags, found, problems)
    return pairs


def check_devices_exist(pairs, gpu_flags, found, problems):
    """Raise ConfigurationError, with the devices ``found`` and the message
    of the missing device's driver where it could not count (``problems``,
    see ``survey_devices``), when a context of ``pairs`` or a device flag
    of ``gpu_flags`` ([(flag, value)]) names a device that is not found."""
    for name, device in pairs:
        if not _device_exists(device, found):
            raise ConfigurationError(
                'THEANO_FLAGS contexts maps %r to device %r, which does not exist '
                'here; devices found: %s. Fix contexts=%r'
                % (name, device, _found_text(found, problems, device), format_contexts(pairs)))
    for flag, value in gpu_flags:
        if not _device_exists(value, found):
            raise ConfigurationError(
                'THEANO_FLAGS %s=%s names a device that does not exist here; '
                'devices found: %s. Use one of them, or %s=cpu'
                % (flag, value, _found_text(found, problems, value), flag))


def register_missing_names(gpuarray, pairs):
    """Give every name of ``pairs`` a context, also names whose device
    another name already opened."""
    from theano.gpuarray.type import ContextNotDefined, get_context
    devmap = INIT_DEV.check(gpuarray.init_dev).devmap
    for name, device in pairs:
        try:
            get_context(name)
            continue
        except ContextNotDefined:
            pass
        earlier = devmap.pop(device, None)
        try:
            gpuarray.init_dev(device, name)
        except Exception as error:
            raise ConfigurationError(
                'THEANO_FLAGS contexts maps %r to %r, but libgpuarray could not '
                'open it: %s' % (name, device, error)) from error
        finally:
            if earlier is not None:
                devmap[device] = earlier


def set_default_context(name):
    """Make context ``name`` Theano's default (as ``device=`` would): ops
    whose inputs name no context, like the random generator's, go there."""
    from theano.gpuarray.type import ContextNotDefined, get_context, reg_context
    try:
        default = get_context(None)
    except ContextNotDefined:
        reg_context(None, get_context(name))
        return True
    return default is get_context(name)


def default_is(name):
    """True when Theano's default context (None) is the context registered
    as ``name``; False where either is not registered, or Theano's
    gpuarray is not imported yet."""
    gpuarray_type = sys.modules.get('theano.gpuarray.type')
    if name is None or gpuarray_type is None:
        return False
    try:
        return gpuarray_type.get_context(None) is gpuarray_type.get_context(name)
    except gpuarray_type.ContextNotDefined:
        return False


def device_kind(device):
    return 'cuda' if device.startswith('cuda') else 'opencl'


def context_memory(name):
    """(total bytes, free bytes) of the context registered as ``name``."""
    from theano.gpuarray.type import get_context
    context = get_context(name)
    return int(context.total_gmem), int(context.free_gmem)


def free_memory(context):
    """The free bytes of pygpu context ``context`` as its driver reports
    them, or None where the driver has no figure (libgpuarray's
    UnsupportedException).  The driver's other errors are raised."""
    return _reported(context, 'free_gmem')


def total_memory(context):
    """The bytes of pygpu context ``context``'s device as its driver
    reports them, or None (see ``free_memory``)."""
    return _reported(context, 'total_gmem')


def _reported(context, attribute):
    from pygpu.gpuarray import UnsupportedException
    try:
        return int(getattr(context, attribute))
    except UnsupportedException:
        return None
