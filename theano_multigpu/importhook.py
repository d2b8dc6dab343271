"""Run callbacks just before and just after named modules execute.

The fixes and the backend switch must reach modules that the user imports
later and never edits (Theano, Keras).  A meta path finder wraps the loader of
each watched module; nothing is imported ahead of time.
"""
import importlib.abc
import importlib.util
import sys

__all__ = ['before_import', 'after_import']


class _WrappedLoader(importlib.abc.Loader):
    """Delegates to the real loader and runs the callbacks around it."""

    def __init__(self, loader, before, after):
        self._loader = loader
        self._before = before
        self._after = after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        for callback in self._before:
            callback(module)
        self._loader.exec_module(module)
        for callback in self._after:
            callback(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds watched modules through the rest of sys.meta_path."""

    def __init__(self):
        self.before = {}
        self.after = {}
        self._searching = set()

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.before and fullname not in self.after:
            return None
        if fullname in self._searching:
            return None
        self._searching.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._searching.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _WrappedLoader(spec.loader,
                                     self.before.pop(fullname, []),
                                     self.after.pop(fullname, []))
        return spec


_finder = _Finder()


def _install_finder():
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def before_import(name, callback):
    """Call ``callback(module)`` before module ``name`` executes.

    Raises RuntimeError when the module is already imported: it is too late.
    """
    if name in sys.modules:
        raise RuntimeError(
            'theano_multigpu must act before %r is imported, but it already '
            'is; import theano_multigpu (or set KERAS_BACKEND=theano_multigpu '
            'in the environment) before importing Keras or Theano' % name)
    _install_finder()
    _finder.before.setdefault(name, []).append(callback)


def after_import(name, callback):
    """Call ``callback(module)`` once module ``name`` has executed (now, if
    it already has)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    _install_finder()
    _finder.after.setdefault(name, []).append(callback)
