"""Registering graph rewrites of theano_multigpu in Theano's optimizer
database, at positions stated relative to Theano's own passes.

Theano runs the passes of ``theano.compile.optdb`` in order of position
(canonicalize 1, stabilize 1.5, the GPU lifting 'gpuarray_opt' 48.5, the
destroy handler 49.5, in-place passes from 60).  A rewrite of ours must run
at a given point of that sequence, e.g. just before the GPU lifting.  So
each is registered at an offset from a named pass of Theano's, and only if
no other pass of Theano's sits between the two: a Theano whose passes
differ raises PatchTargetError instead of running the rewrite elsewhere.
"""
from ..patch_targets import refused

__all__ = ['register_optimizer', 'position_after']

PREFIX = 'multigpu_'


def position_after(optdb_positions, anchor, offset, name):
    """The position ``offset`` away from pass ``anchor``, checked: the
    anchor exists and no pass of Theano's lies between the two."""
    why = 'the graph rewrite %r is registered right %s its pass %r' % (
        name, 'after' if offset > 0 else 'before', anchor)
    if anchor not in optdb_positions:
        raise refused('theano.compile.optdb', why, 'a pass named %r' % anchor,
                      'it has no pass of that name')
    position = optdb_positions[anchor] + offset
    low, high = sorted((optdb_positions[anchor], position))
    between = sorted(other for other, at in optdb_positions.items()
                     if low < at < high and not other.startswith(PREFIX))
    if between:
        raise refused('theano.compile.optdb', why,
                      'no pass of its own between %r (at %s) and %s'
                      % (anchor, optdb_positions[anchor], position),
                      'the pass(es) %s lie between the two, so it would not run where '
                      'it must' % ', '.join(between))
    return position


def register_optimizer(name, local_optimizer, anchor, offset):
    """Register ``local_optimizer`` (a theano.gof local optimizer) as the
    pass ``'multigpu_' + name``, ``offset`` away from Theano's ``anchor``,
    in fast_run and fast_compile."""
    import theano
    from theano import gof
    optdb = theano.compile.optdb
    full_name = PREFIX + name
    position = position_after(optdb.__position__, anchor, offset, full_name)
    optdb.register(full_name, gof.TopoOptimizer(local_optimizer), position,
                   'fast_run', 'fast_compile', 'multigpu')
