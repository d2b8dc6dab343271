"""Lines on stderr while a function compiles (``multigpu.progress``).

Theano compiles each function before its first step, the shim's rewrite
first, and prints nothing: with a replica of the model per context, a
real model takes minutes.  Once a compile has run ``multigpu.progress``
seconds, a line says which function, on how many contexts, how large its
graph is, the phase (rewriting the graph, taking the gradients, Theano's
optimiser, linking its ops) and the time so far; while linking, how many
ops are linked and how many C modules were built.  A line comes at each
new phase, and every few seconds while the counts move; the last says
the total and the time of each phase.  Under MPI, rank 0 alone prints.
"""
import sys
import threading
import time

from ..compat import compile_watch
from ..config.mpi_environment import launched_by_mpi

__all__ = ['CompileProgress', 'compiling']

PHASES = ('rewrite', 'gradients', 'optimise', 'link')
# Seconds between two lines, at least; and at most, while nothing changes.
MIN_INTERVAL = 1.0
QUIET_AT_MOST = 30.0


class CompileProgress(object):
    """The progress of one function's compile on ``contexts`` contexts (0:
    Theano's device), told by the shim (its phases) and by Theano
    (``compile_watch``: ops linked, C modules built); printed to ``stream``
    from ``after`` seconds on (None: never).  ``seconds``: each phase's
    time, once finished."""

    def __init__(self, title, contexts, after, stream=None):
        self.title, self.contexts, self.after = title, contexts, after
        self.stream = stream if stream is not None else sys.stderr
        if self.stream is None:   # (python script.py 2>&-)
            after = self.after = None
        self.start = time.monotonic()
        self.phase, self.phase_start, self.seconds = None, self.start, {}
        self.nodes = self.ops = self._count_nodes = None
        self._phases_shown = set()
        self.linked_ops = self.modules = 0
        self.printed = None   # the last line printed
        self._shown, self._shown_at = None, 0.0   # the state it showed, and when
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._ticker = None
        if after is not None:
            self._ticker = threading.Thread(target=self._tick, daemon=True,
                                            name='theano_multigpu compile progress')
            self._ticker.start()

    # The shim's phases.
    def rewriting(self):
        self._enter('rewrite')

    def optimising(self, count_nodes):
        """Theano's optimiser starts on a graph of ``count_nodes()`` nodes
        (called once, when a line first shows the size)."""
        self._count_nodes = count_nodes
        self._enter('optimise')

    # compile_watch's watcher.
    def entering(self, phase):
        before = self.phase
        self._enter(phase)
        return before

    def linking(self, ops):
        self.ops, self.linked_ops = ops, 0
        self._enter('link')

    def linked(self):
        self.linked_ops += 1

    def module_built(self):
        self.modules += 1

    def finished(self, failed=None):
        """The compile is over (``failed``: the exception that ended it):
        the last line, if any was printed."""
        self._enter(None)
        self._done.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self.printed is None or self.after is None:
                return
            if failed is None:
                self._write(self._summary())
            else:
                self._write('Compiling %s stopped after %.1f s: %s'
                            % (self._what(), time.monotonic() - self.start, type(failed).__name__))

    def _enter(self, phase):
        with self._lock:
            now = time.monotonic()
            if self.phase is not None:
                self.seconds[self.phase] = (self.seconds.get(self.phase, 0.0)
                                            + now - self.phase_start)
            self.phase, self.phase_start = phase, now
        self._show()

    def _tick(self):
        wait = self.after
        while not self._done.wait(wait) and self.after is not None:
            self._show()
            wait = max(self.after or 0, MIN_INTERVAL)

    def _show(self):
        """Print the current line where the compile has run long enough,
        in a phase, and the phase is new, or its counts moved (the lines
        ``after`` seconds apart, or a tenth of the time so far where that
        is longer), or nothing was printed for ``QUIET_AT_MOST`` seconds."""
        now = time.monotonic()
        with self._lock:   # (the ticker's thread and the compile's)
            if self.after is None or self.phase is None or now - self.start < self.after:
                return
            state = (self.phase, self.linked_ops, self.modules)
            since = now - self._shown_at
            gap = max(self.after, MIN_INTERVAL, (now - self.start) / 10)
            # A phase shows at once the first time (the gradients come back
            # to the rewrite once per loss and micro-batch).
            if (self.phase not in self._phases_shown
                    or (state != self._shown and since >= gap)
                    or since >= max(gap, QUIET_AT_MOST)):
                self._phases_shown.add(self.phase)
                self._shown, self._shown_at = state, now
                self._write(self._line())

    def _write(self, line):
        """Print ``line``; where stderr cannot take it (closed, a broken
        pipe), print nothing more: the compile goes on."""
        try:
            self.stream.write(line + '\n')
            self.stream.flush()
        except (OSError, ValueError, AttributeError):
            self.after = None
            return
        self.printed = line

    def _what(self):
        if self.nodes is None and self._count_nodes is not None:
            self.nodes, self._count_nodes = self._count_nodes(), None
        about = []
        if self.contexts:
            about.append('%d context%s' % (self.contexts, '' if self.contexts == 1 else 's'))
        if self.nodes is not None:
            about.append('%s nodes' % format(self.nodes, ','))
        return self.title + (' (%s)' % ', '.join(about) if about else '')

    def _line(self):
        phase = self.phase
        if phase == 'rewrite':
            doing = 'rewriting the graph for the contexts'
        elif phase == 'gradients':
            doing = 'taking the gradients'
        elif phase == 'optimise':
            doing = "Theano's optimiser"
        else:
            doing = 'linking: %s of %s ops, %d C module%s built' % (
                format(self.linked_ops, ','), format(self.ops or 0, ','), self.modules,
                '' if self.modules == 1 else 's')
        return 'Compiling %s: %s, %d s' % (self._what(), doing, time.monotonic() - self.start)

    def _summary(self):
        split = ', '.join('%s %.1f s' % (p, self.seconds[p]) for p in PHASES if p in self.seconds)
        return 'Compiled %s in %.1f s (%s; %d C module%s built)' % (
            self._what(), sum(self.seconds.values()), split, self.modules,
            '' if self.modules == 1 else 's')


def _prints():
    """Rank 0 prints (and a process outside MPI)."""
    if not launched_by_mpi():
        return True
    from ..mpi import world
    return world.world()[1] == 0


class compiling(object):
    """``with compiling(title, contexts) as progress:`` the compile inside
    is watched, and its progress printed as multigpu.progress says."""

    def __init__(self, title, contexts, stream=None):
        import theano
        from ..config.flags import parse_progress
        after = parse_progress(theano.config.multigpu.progress) if _prints() else None
        self.progress = CompileProgress(title, contexts, after, stream)
        self._watching = compile_watch.watching(self.progress)

    def __enter__(self):
        self._watching.__enter__()
        return self.progress

    def __exit__(self, kind, error, trace):
        try:
            self.progress.finished(error)
        finally:
            self._watching.__exit__(kind, error, trace)
        return False
