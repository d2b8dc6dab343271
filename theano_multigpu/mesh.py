"""The mesh: which named contexts take part, which one is the master, and
the mode, read from Theano's config once Theano is imported."""
from .errors import ConfigurationError
from .settings import parse_contexts_flag, parse_name_list

__all__ = ['Mesh', 'current', 'from_flags']


class Mesh(object):
    """Context names taking part (in order), their devices, master and mode.

    ``names`` is empty when no ``contexts`` flag is set: then Theano's
    ``device`` flag alone decides, as in plain Keras-Theano.
    """

    def __init__(self, names, devices, master, mode):
        self.names = list(names)
        self.devices = dict(devices)
        self.master = master
        self.mode = mode

    @property
    def size(self):
        return max(1, len(self.names))

    def __repr__(self):
        return 'Mesh(names=%r, master=%r, mode=%r)' % (self.names, self.master, self.mode)


def from_flags(contexts, mode='auto', participants='', master=''):
    """Build and validate a Mesh from the flag values (strings)."""
    pairs = parse_contexts_flag(contexts)
    defined = [n for n, _ in pairs]
    names = parse_name_list(participants) or defined
    for name in names:
        if name not in defined:
            raise ConfigurationError(
                'multigpu.contexts names %r, which THEANO_FLAGS contexts=%r does '
                'not define; use names from %s' % (name, contexts, defined or 'it'))
    if len(set(names)) != len(names):
        raise ConfigurationError(
            'multigpu.contexts names a context twice: received %r' % participants)
    master = master.strip() or (names[0] if names else None)
    if master is not None and master not in names:
        raise ConfigurationError(
            'multigpu.master=%r must be one of the contexts taking part, %s; '
            'fix multigpu.master or multigpu.contexts' % (master, names))
    if mode == 'auto':
        mode = 'batch' if len(names) >= 2 else 'single'
    elif len(names) < 2:
        raise ConfigurationError(
            "multigpu.mode=%s needs at least 2 contexts, but THEANO_FLAGS "
            "contexts=%r defines %d taking part; add one, e.g. 'dev1->cuda1'"
            % (mode, contexts, len(names)))
    return Mesh(names, dict(pairs), master, mode)


_current = None


def current():
    """The mesh of this process, from theano.config (imports Theano)."""
    global _current
    if _current is None:
        import theano
        config = theano.config
        _current = from_flags(config.contexts, config.multigpu.mode,
                              config.multigpu.contexts, config.multigpu.master)
    return _current
