"""What a patch of Theano or Keras expects of its target, checked before it
patches.

theano_multigpu changes a few functions and classes inside Theano 1.0.5 and
Keras 1.x (see ``compat``), and reads a few of their internals (Theano's
config parser, libgpuarray's context registry).  A patch written for one
version could give wrong graphs on another: a distribution's patched build,
a later release, an install without its ``.py`` files.  So each patch names
its target and what it expects of it (the digest of its source, its
parameters, or the attributes it uses) in an ``Expectation``, and calls
``check`` on the target before touching it.  A mismatch raises
PatchTargetError, naming the target, the version found, and what to do.

Every Expectation made is listed in ``EXPECTATIONS``: the tests check each
one against its real target and against a wrong one.
"""
import hashlib
import importlib
import inspect
import textwrap

from .errors import PatchTargetError

__all__ = ['Expectation', 'SourceDigest', 'Parameters', 'Attributes', 'EXPECTATIONS',
           'SUPPORTED', 'installed_version', 'source_digest']

# The releases the patches were written for, and how to get them.
SUPPORTED = {
    'theano': ('Theano 1.0.5', "pip install theano==1.0.5, from PyPI with its .py files"),
    'keras': ('Keras 1.0.1 to 1.2.2', "pip install 'keras>=1.0.1,<2'"),
    'pygpu': ('pygpu (libgpuarray) 0.7.x', 'apt-get install python3-pygpu libgpuarray-dev'),
}

EXPECTATIONS = []


def source_digest(obj):
    """The first 16 hex digits of the SHA-256 of ``obj``'s dedented source.
    Raises OSError or TypeError when the source cannot be read."""
    source = textwrap.dedent(inspect.getsource(obj))
    return hashlib.sha256(source.encode('utf8')).hexdigest()[:16]


def installed_version(package):
    """'theano 1.0.5': the installed distribution's version."""
    try:
        from importlib.metadata import version
        return '%s %s' % (package, version(package))
    except Exception:   # not installed as a distribution (e.g. on sys.path only)
        module = importlib.import_module(package)
        return '%s %s' % (package, getattr(module, '__version__', '(version unknown)'))


class Expectation(object):
    """What one patch expects of ``target``, a dotted path such as
    ``'theano.scan_module.scan_op.Scan.execute'``; ``why`` says what the
    patch does there."""

    def __init__(self, target, why):
        self.target = target
        self.package = target.split('.')[0]
        self.why = why
        self.passed = False   # True once the real target passed ``check``
        EXPECTATIONS.append(self)

    def resolve(self):
        """The target itself, imported by its dotted path."""
        parts = self.target.split('.')
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module('.'.join(parts[:cut]))
            except ImportError:
                continue
            for name in parts[cut:]:
                obj = getattr(obj, name)
            return obj
        raise ImportError('cannot import %s' % self.target)

    def check(self, obj):
        """``obj``, when it is what the patch expects; else PatchTargetError."""
        problem = self.problem(obj)
        if problem is not None:
            release, fix = SUPPORTED.get(self.package, (self.package, 'a supported version'))
            raise PatchTargetError(
                'theano_multigpu patches %s (%s) and expects %s\'s, with %s, but %s '
                'in %s. Its patch was written for %s alone: install it (%s), or '
                'report the version you need.'
                % (self.target, self.why, release, self.expected(), problem,
                   installed_version(self.package), release, fix))
        self.passed = True
        return obj

    def expected(self):
        raise NotImplementedError

    def problem(self, obj):
        """What is wrong with ``obj``, or None."""
        raise NotImplementedError


class SourceDigest(Expectation):
    """The target's source has a known digest (``source_digest``): for a
    patch that rewrites or replaces code, where any change matters."""

    def __init__(self, target, digest, why):
        super(SourceDigest, self).__init__(target, why)
        self.digest = digest

    def expected(self):
        return 'source digest %s' % self.digest

    def problem(self, obj):
        try:
            found = source_digest(obj)
        except (OSError, TypeError) as error:
            return ('its source cannot be read (%s: an install without .py files?)'
                    % error.__class__.__name__)
        if found != self.digest:
            return 'found source digest %s' % found
        return None


class Parameters(Expectation):
    """The target is called with these parameter names, in this order: for
    a patch that wraps a function and passes its arguments on."""

    def __init__(self, target, names, why):
        super(Parameters, self).__init__(target, why)
        self.names = tuple(names)

    def expected(self):
        return 'parameters (%s)' % ', '.join(self.names)

    def problem(self, obj):
        try:
            found = tuple(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            return '%r has no signature' % (obj,)
        if found != self.names:
            return 'found parameters (%s)' % ', '.join(found)
        return None


class Attributes(Expectation):
    """The target has these attributes: for a patch that replaces them, or
    code that reads them."""

    def __init__(self, target, names, why):
        super(Attributes, self).__init__(target, why)
        self.names = tuple(names)

    def expected(self):
        return 'the attributes %s' % ', '.join(self.names)

    def problem(self, obj):
        missing = [name for name in self.names if not hasattr(obj, name)]
        if missing:
            return 'it lacks %s' % ', '.join(missing)
        return None
