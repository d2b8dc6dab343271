"""Keras 1.x on today's packages (keras.json, PyYAML 6, h5py 3), and its
recurrent layers with one unit on Theano."""
import contextlib
import functools
import json
import os

from .. import importhook
from ..patch_targets import CodeNames, Parameters, wrap

__all__ = ['install', 'keras_config_path', 'yaml_loader_class', 'write_theano_keras_json']

# The wrappers swap yaml.load and h5py.File while the target runs: it must
# call them through their modules.
MODEL_FROM_YAML = CodeNames('keras.models.model_from_yaml', ('yaml', 'load'),
                            'wrapped: the yaml.load it calls reads safely')
LOAD_MODEL = CodeNames('keras.models.load_model', ('h5py', 'File'),   # not in Keras 1.0.1
                       'wrapped: the h5py.File it opens reads h5py 3 files as h5py 2')
LOAD_WEIGHTS = CodeNames('keras.engine.topology.Container.load_weights', ('h5py', 'File'),
                         'wrapped: the h5py.File it opens reads h5py 3 files as h5py 2')
# Not in Keras 1.0.1: the group they are given reads as h5py 2's.
HDF5_GROUP_LOADERS = dict((name, Parameters(
    'keras.engine.topology.Container.' + name, ('self', 'f'),
    'wrapped: the h5py group it is given reads strings as bytes'))
    for name in ('load_weights_from_hdf5_group', 'load_weights_from_hdf5_group_by_name'))
RECURRENT_INITIAL_STATES = Parameters(
    'keras.layers.recurrent.Recurrent.get_initial_states', ('self', 'x'),
    "wrapped: the initial states' unit axes are not broadcastable")


def keras_config_path():
    """Where Keras 1.x reads keras.json (it falls back to /tmp when HOME is
    not writable)."""
    base = os.path.expanduser('~')
    if not os.access(base, os.W_OK):
        base = '/tmp'
    return os.path.join(base, '.keras', 'keras.json')


def write_theano_keras_json(module=None):
    """A first Keras import writes keras.json with the TensorFlow backend and
    'tf' dimension ordering; write the Theano defaults first instead.

    An existing file is left alone.  The file appears whole or not at all
    (written aside, then linked), so processes started together (mpirun)
    never read half of one.
    """
    path = keras_config_path()
    if os.path.exists(path):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    config = {'floatx': 'float32', 'epsilon': 1e-07,
              'backend': 'theano', 'image_dim_ordering': 'th'}
    partial = '%s.%d.tmp' % (path, os.getpid())
    with open(partial, 'w') as f:
        f.write(json.dumps(config, indent=4) + '\n')
    try:
        os.link(partial, path)  # fails if another process was first
    except FileExistsError:
        pass
    except OSError:  # a file system without hard links
        os.replace(partial, path)
        return
    os.remove(partial)


def yaml_loader_class():
    """yaml.SafeLoader plus ``!!python/tuple``: no tag builds other Python
    objects or runs code."""
    import yaml

    class YamlLoader(yaml.SafeLoader):
        """Safe loader that also reads the tuples Keras's to_yaml writes."""

    YamlLoader.add_constructor(
        'tag:yaml.org,2002:python/tuple',
        lambda loader, node: tuple(loader.construct_sequence(node)))
    return YamlLoader


@contextlib.contextmanager
def _replaced(module, name, replacement):
    original = getattr(module, name)
    setattr(module, name, replacement(original))
    try:
        yield
    finally:
        setattr(module, name, original)


def _safe_yaml_load(original, loader):
    def load(stream, Loader=None):
        return original(stream, Loader=loader)
    return load


def _with_safe_yaml(func):
    """Run ``func`` with ``yaml.load`` safe and PyYAML-6 compatible: Keras
    1.x calls it without a Loader.  No YAML can construct Python objects."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        import yaml
        loader = yaml_loader_class()
        with _replaced(yaml, 'load', lambda original: _safe_yaml_load(original, loader)):
            return func(*args, **kwargs)
    return wrapper


def _as_bytes(value):
    """h5py 3 reads string attributes as str; Keras 1.x decodes bytes."""
    import numpy as np
    if isinstance(value, str):
        return value.encode('utf8')
    if isinstance(value, np.ndarray) and value.dtype == object:
        return np.array([_as_bytes(v) for v in value.tolist()])
    return value


class _BytesAttrs(object):
    """An h5py attribute manager whose string values read as bytes."""

    def __init__(self, attrs):
        self._attrs = attrs

    def __getitem__(self, key):
        return _as_bytes(self._attrs[key])

    def get(self, key, default=None):
        return self[key] if key in self._attrs else default

    def __contains__(self, key):
        return key in self._attrs

    def __iter__(self):
        return iter(self._attrs)

    def __getattr__(self, name):
        return getattr(self._attrs, name)


class _BytesGroup(object):
    """An h5py file or group as h5py 2 showed it to Keras 1.x."""

    def __new__(cls, group):
        if isinstance(group, _BytesGroup):
            return group
        self = object.__new__(cls)
        self._group = group
        return self

    @property
    def attrs(self):
        return _BytesAttrs(self._group.attrs)

    def __getitem__(self, key):
        import h5py
        item = self._group[key]
        return _BytesGroup(item) if isinstance(item, h5py.Group) else item

    def __contains__(self, key):
        return key in self._group

    def __iter__(self):
        return iter(self._group)

    def __getattr__(self, name):
        return getattr(self._group, name)


def _with_h5py2_strings(func):
    """Run ``func`` with files it opens reading strings as bytes.

    ``h5py.File`` is replaced while ``func`` runs (Keras imports h5py inside
    the function), so another thread opening a file then gets the proxy too.
    """
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        import h5py
        opener = lambda original: (lambda *a, **k: _BytesGroup(original(*a, **k)))
        with _replaced(h5py, 'File', opener):
            return func(*args, **kwargs)
    return wrapper


def _with_h5py2_group(method):
    """Run ``method(self, group)`` with ``group`` reading strings as bytes
    (also for a group the caller opened with h5py)."""
    @functools.wraps(method)
    def wrapper(self, group, *args, **kwargs):
        return method(self, _BytesGroup(group), *args, **kwargs)
    return wrapper


def _fix_models(models):
    wrap(MODEL_FROM_YAML, models, 'model_from_yaml', _with_safe_yaml)
    if hasattr(models, 'load_model'):
        wrap(LOAD_MODEL, models, 'load_model', _with_h5py2_strings)


def _fix_topology(topology):
    container = topology.Container
    wrap(LOAD_WEIGHTS, container, 'load_weights', _with_h5py2_strings)
    for name, expectation in sorted(HDF5_GROUP_LOADERS.items()):
        if name in vars(container):
            wrap(expectation, container, name, _with_h5py2_group)


def _fix_recurrent(recurrent):
    """A recurrent layer with one unit (``LSTM(1)``, ``GRU(1)``) failed to
    build on Theano in Keras 1.1 to 1.2.2: its initial state, tiled from a
    (samples, 1) column, is broadcastable along the units, the states its
    step returns are not, and Theano's scan refuses the mismatch ("The
    broadcast pattern of the output of scan ... is inconsistent").  Rule:
    an initial state is broadcastable along the samples at most."""
    def not_broadcastable(get_initial_states):
        @functools.wraps(get_initial_states)
        def unit_axes_not_broadcastable(self, x):
            from theano import tensor
            return [tensor.unbroadcast(state, *range(1, state.ndim))
                    for state in get_initial_states(self, x)]
        return unit_axes_not_broadcastable
    wrap(RECURRENT_INITIAL_STATES, recurrent.Recurrent, 'get_initial_states',
         not_broadcastable)


def install():
    importhook.before_import('keras.backend', write_theano_keras_json)
    importhook.after_import('keras.engine.topology', _fix_topology)
    importhook.after_import('keras.models', _fix_models)
    importhook.after_import('keras.layers.recurrent', _fix_recurrent)
