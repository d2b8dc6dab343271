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

A patch sets an attribute of Theano or Keras only through ``replace`` or
``wrap``, given the expectation of that attribute (or of its owner): they
check it, and that it is the expectation of what they set, before setting
it (tests/test_patches.py reads the package's source for any other
assignment into Theano or Keras).  A patch that checks more than a target
(the code it edits) raises ``refused``'s error, the one message of them all.

Every Expectation made is listed in ``EXPECTATIONS``: the tests check each
one against its real target and against a wrong one.
"""
import hashlib
import importlib
import inspect
import textwrap

from .errors import PatchTargetError

__all__ = ['Expectation', 'SourceDigest', 'Parameters', 'Attributes', 'CodeNames',
           'EXPECTATIONS', 'SUPPORTED', 'installed_version', 'source_digest', 'dotted_name',
           'refused', 'replace', 'wrap']

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
            raise refused(self.target, self.why, self.expected(), problem)
        self.passed = True
        return obj

    def subject(self, owner, name):
        """What ``check`` is given before ``owner.<name>`` is set: that
        attribute when it is the target, ``owner`` when the owner is (then
        ``name`` must be among what the expectation states of it).
        PatchTargetError when ``owner`` is not the target's (a Theano or
        Keras where it moved)."""
        found = dotted_name(owner)
        if found + '.' + name == self.target:
            if not hasattr(owner, name):
                raise refused(self.target, self.why, self.expected(),
                              '%s has no attribute %s' % (found, name))
            return getattr(owner, name)
        if found == self.target and self.states(name):
            return owner
        if found == self.target:
            raise ValueError('the expectation of %s states nothing of %r: declare one for '
                             '%s.%s before patching it' % (self.target, name, found, name))
        raise refused(self.target, self.why, self.expected(),
                      'the patch was given %s.%s' % (found, name))

    def states(self, name):
        """Whether this expectation of an owner covers setting its ``name``
        (an expectation of a function covers its own attributes)."""
        return True

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
    code that reads them.  ``optional``: attributes a patch replaces where
    the release has them (Keras 1.0.1 lacks some)."""

    def __init__(self, target, names, why, optional=()):
        super(Attributes, self).__init__(target, why)
        self.names = tuple(names)
        self.optional = tuple(optional)

    def expected(self):
        return 'the attributes %s' % ', '.join(self.names)

    def problem(self, obj):
        missing = [name for name in self.names if not hasattr(obj, name)]
        if missing:
            return 'it lacks %s' % ', '.join(missing)
        return None

    def states(self, name):
        return name in self.names + self.optional


class CodeNames(Expectation):
    """The target's code uses these names (globals, attributes or modules
    it imports, as its bytecode names them): for a patch that swaps what
    they name while the target runs, or that stands in for code that uses
    them.  Checked without the source, and the same across releases that
    kept the call."""

    def __init__(self, target, names, why):
        super(CodeNames, self).__init__(target, why)
        self.names = tuple(names)

    def expected(self):
        return 'code that uses %s' % ', '.join(self.names)

    def problem(self, obj):
        code = getattr(getattr(obj, '__func__', obj), '__code__', None)
        if code is None:
            return '%r has no code' % (obj,)
        used = set(_names_in(code))
        missing = [name for name in self.names if name not in used]
        if missing:
            return 'its code does not use %s' % ', '.join(missing)
        return None


def _names_in(code):
    """The names ``code`` and the functions nested in it use."""
    for name in code.co_names:
        yield name
    for constant in code.co_consts:
        if inspect.iscode(constant):
            for name in _names_in(constant):
                yield name


def dotted_name(obj):
    """'keras.models', 'theano.gof.op.Op', 'theano.gof.op.Op.make_c_thunk':
    where a module, a class or a function is defined."""
    if inspect.ismodule(obj):
        return obj.__name__
    return '%s.%s' % (getattr(obj, '__module__', '?'),
                      getattr(obj, '__qualname__', type(obj).__qualname__))


def refused(target, why, expected, problem):
    """The PatchTargetError of a patch of ``target`` (``why``: what it does
    there) that expects ``expected`` of the supported release and found
    ``problem``."""
    package = target.split('.')[0]
    release, fix = SUPPORTED.get(package, (package, 'a supported version'))
    return PatchTargetError(
        'theano_multigpu patches %s (%s) and expects %s\'s, with %s, but %s '
        'in %s. Its patch was written for %s alone: install it (%s), or '
        'report the version you need.'
        % (target, why, release, expected, problem, installed_version(package), release, fix))


def replace(expectation, owner, name, new):
    """Set ``owner.<name>`` to ``new`` once ``expectation``, of that
    attribute or of ``owner``, passed on it (``Expectation.subject``);
    returns the value replaced.  PatchTargetError before anything is set
    otherwise."""
    expectation.check(expectation.subject(owner, name))
    original = getattr(owner, name, None)
    setattr(owner, name, new)
    return original


def wrap(expectation, owner, name, wrapper):
    """Set ``owner.<name>`` to ``wrapper(<its value>)``, checked as by
    ``replace``; returns the value wrapped."""
    expectation.check(expectation.subject(owner, name))
    original = getattr(owner, name)
    setattr(owner, name, wrapper(original))
    return original
