"""The mesh: which named contexts take part, which one is the master, and
the mode, read from Theano's config once Theano is imported."""
from ..errors import ConfigurationError
from .devices import default_is
from .flags import format_contexts, parse_contexts_flag, parse_name_list
from .session import current_session

__all__ = ['Mesh', 'current', 'from_flags', 'from_pairs']


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
        self.shard = False   # multigpu.shard, set by ``current``
        # True once Theano's default context (None) is the master's context.
        self.default_is_master = False

    def graph_name(self, name):
        """The context name to put in graphs for context ``name``.

        The master is written as Theano's default context (``None``) when
        that is the master's context: ops that Theano places by default
        (allocations, random streams, inputs) then land on the master under
        the same name as the weights, and no copy joins the two names.
        """
        if self.default_is_master and name == self.master:
            return None
        return name

    def names_by_graph_name(self):
        """{graph name: context name} of the mesh's contexts."""
        return dict((self.graph_name(name), name) for name in self.names)

    def first(self, count):
        """The mesh of the master and the next ``count - 1`` names."""
        names = [self.master] + [n for n in self.names if n != self.master][:count - 1]
        names = [n for n in self.names if n in names]   # keep the flag order
        smaller = Mesh(names, self.devices, self.master, self.mode)
        smaller.default_is_master = self.default_is_master
        smaller.shard = self.shard
        return smaller

    @property
    def sharded(self):
        """True when each weight has an owner context (multigpu.shard,
        batch-wise over two or more contexts)."""
        return self.shard and self.mode == 'batch' and len(self.names) >= 2

    @property
    def size(self):
        return max(1, len(self.names))

    def __repr__(self):
        return 'Mesh(names=%r, master=%r, mode=%r)' % (self.names, self.master, self.mode)


def _defined(contexts, count, what):
    """'THEANO_FLAGS contexts='dev0->cuda0' defines 1 (what)' or '... is unset'."""
    if not contexts.strip():
        return 'THEANO_FLAGS contexts is unset'
    return 'THEANO_FLAGS contexts=%r defines %s' % (contexts, what % count)


def from_flags(contexts, mode='auto', participants='', master=''):
    """Build and validate a Mesh from the flag values (strings): contexts,
    multigpu.mode, multigpu.contexts and multigpu.master."""
    return from_pairs(parse_contexts_flag(contexts), mode, participants, master)


def from_pairs(pairs, mode='auto', participants='', master=''):
    """``from_flags`` for a contexts flag already parsed into (name, device)
    pairs (``flags.parse_contexts_flag``, the flag's one parser)."""
    contexts = format_contexts(pairs)
    defined = [n for n, _ in pairs]
    names = parse_name_list(participants) or defined
    for name in names:
        if name not in defined:
            raise ConfigurationError(
                'multigpu.contexts expects names that the contexts flag defines, '
                'but received %r, and %s; use names from it, or set contexts, '
                "e.g. 'dev0->cuda0;dev1->cuda1'"
                % (name, _defined(contexts, ', '.join(defined), '%s')))
    if len(set(names)) != len(names):
        raise ConfigurationError(
            'multigpu.contexts expects each name once, but received %r; remove '
            'the repeated name' % participants)
    master = master.strip() or (names[0] if names else None)
    if master is not None and master not in names:
        raise ConfigurationError(
            'multigpu.master expects one of the contexts taking part (%s), but '
            'received %r; fix multigpu.master or multigpu.contexts'
            % (', '.join(names) or 'none: the contexts flag is unset', master))
    if mode == 'auto':
        mode = 'batch' if len(names) >= 2 else 'single'
    elif mode not in ('batch', 'layer'):
        raise ConfigurationError(
            "multigpu.mode expects one of auto/batch/layer, but received %r; "
            "e.g. THEANO_FLAGS='multigpu.mode=batch'" % mode)
    elif len(names) < 2:
        kind = 'batch-wise' if mode == 'batch' else 'layer-wise'
        raise ConfigurationError(
            "multigpu.mode=%s (%s) needs at least 2 contexts, but %s; add "
            "one, e.g. contexts='dev0->cuda0;dev1->cuda1'"
            % (mode, kind, _defined(contexts, len(names), '%d taking part')))
    return Mesh(names, dict(pairs), master, mode)


def current():
    """The mesh of this process (its session's), read from theano.config at
    its first use (imports Theano)."""
    session = current_session()
    if session.mesh is None:
        import theano
        config = theano.config
        built = from_flags(config.contexts, config.multigpu.mode,
                           config.multigpu.contexts, config.multigpu.master)
        built.shard = bool(config.multigpu.shard)
        # Where the contexts are registered already (a session reset after
        # start-up), as start-up found it.
        built.default_is_master = default_is(built.master)
        session.mesh = built
    return session.mesh
