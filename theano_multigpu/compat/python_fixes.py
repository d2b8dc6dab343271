"""Names that Python 3.10 and 3.11 removed and Theano or Keras 1.x still use."""
import collections
import collections.abc
import inspect

__all__ = ['install']

ArgSpec = collections.namedtuple('ArgSpec', 'args varargs keywords defaults')


def getargspec(func):
    """``inspect.getargspec`` as Python 3.10 had it, from getfullargspec."""
    spec = inspect.getfullargspec(func)
    return ArgSpec(spec.args, spec.varargs, spec.varkw, spec.defaults)


def install():
    """Restore ``collections.Iterable`` and friends, ``inspect.getargspec``."""
    for name in collections.abc.__all__:
        if not hasattr(collections, name):
            setattr(collections, name, getattr(collections.abc, name))
    if not hasattr(inspect, 'getargspec'):
        inspect.getargspec = getargspec
