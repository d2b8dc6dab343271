"""``python -m theano_multigpu info``: versions, contexts, settings.

Exits non-zero, with the reason, when the configuration cannot work.
"""
import platform
import sys

from ..config.flags import format_bytes, parse_split_size
from ..config.settings import SETTINGS


__all__ = ['main', 'collect']


def _version(module_name):
    try:
        module = __import__(module_name)
    except Exception as error:  # report, do not fail, on a missing package
        return 'not available (%s)' % error.__class__.__name__
    return getattr(module, '__version__', 'unknown')


def collect():
    """Everything ``info`` prints, as a dict (imports Theano, not Keras)."""
    import numpy
    import theano
    from ..compat import compiled_scan
    from ..config import devices, mesh as mesh_module
    from ..config.mpi_environment import world_size
    facts = {
        'python': platform.python_version(),
        'numpy': numpy.__version__,
        'theano': theano.__version__,
        'keras': _keras_version(),
        'pygpu': _version('pygpu'),
        'libgpuarray api': _gpuarray_api(),
        'devices found': ', '.join(_devices_found()) or 'none',
        # Importing mpi4py alone does not start MPI (mpi4py.MPI does).
        'mpi4py': _version('mpi4py'),
    }
    mesh = mesh_module.current()
    contexts = []
    for name in mesh.names:
        total, free = devices.context_memory(name)
        device = mesh.devices[name]
        contexts.append({'name': name, 'device': device,
                         'kind': devices.device_kind(device),
                         'total_bytes': total, 'free_bytes': free,
                         'master': name == mesh.master})
    settings = {
        'device': theano.config.device,
        'floatX': theano.config.floatX,
        'contexts': theano.config.contexts,
    }
    # Every setting of the one table, in its order.
    for setting in SETTINGS:
        settings[setting.name] = setting.shown(
            getattr(theano.config.multigpu, setting.option))
    settings.update({
        'scan loop in use': compiled_scan.loop_description(),
        'effective mode': mesh.mode + _sharding(mesh),
        'MPI ranks': world_size(),
        'blas.ldflags': theano.config.blas.ldflags,
    })
    return {'versions': facts, 'contexts': contexts, 'settings': settings}


def _sharding(mesh):
    """How the effective mode places the weights, as info's line ends."""
    if not mesh.sharded:
        return ''
    import theano
    split = parse_split_size(theano.config.multigpu.shard_split)
    if split is None:
        return ', weights sharded'
    return ', weights sharded, those of %s or more split into blocks of rows' % format_bytes(split)


def _devices_found():
    from ..config import devices
    return devices.available_devices() if devices.have_pygpu() else []


def _keras_version():
    try:
        from importlib.metadata import version
        return version('keras')
    except Exception:
        return 'not installed'


def _gpuarray_api():
    try:
        import pygpu.gpuarray
        return '.'.join(str(v) for v in pygpu.gpuarray.api_version())
    except Exception:
        return 'not available'


def _mib(n):
    return '%.0f MiB' % (n / 2.0 ** 20)


def _no_contexts_line(device):
    from ..config import devices
    if not devices.have_pygpu():
        return ('(none: pygpu is not installed, so this is plain Theano on '
                'device=%s; for contexts: %s)' % (device, devices.PYGPU_INSTALL))
    return '(none: THEANO_FLAGS contexts is unset; Theano device=%s)' % device


def main():
    """Print the report; 0, or 2 with the reason when the configuration
    (flags, .theanorc, devices) cannot work."""
    try:
        facts = collect()
    except ValueError as error:  # ConfigurationError, or Theano's own flag checks
        print('theano_multigpu: configuration cannot work: %s' % error, file=sys.stderr)
        return 2
    print('theano_multigpu')
    print('versions:')
    for key, value in facts['versions'].items():
        print('  %-16s %s' % (key, value))
    print('contexts:')
    if not facts['contexts']:
        print('  ' + _no_contexts_line(facts['settings']['device']))
    for c in facts['contexts']:
        print('  %-8s %-12s %-7s total %-10s free %-10s%s'
              % (c['name'], c['device'], c['kind'], _mib(c['total_bytes']),
                 _mib(c['free_bytes']), '  (master)' if c['master'] else ''))
    print('settings:')
    width = max(len(key) for key in facts['settings'])
    for key, value in facts['settings'].items():
        print('  %-*s %s' % (width, key, value))
    return 0
