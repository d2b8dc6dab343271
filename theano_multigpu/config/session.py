"""The state this process keeps from one call to the next, in one owner.

A Session holds the mesh (read from theano.config at its first use, see
``mesh.current``), the notices written once (``first_notice``), and the
state the upper layers keep, each as a part made at its first use
(``part``): the layer-wise plans and the shared variables the plans counted
(``graph.plan.Plans``), the bytes the transfers copied
(``graph.transfer.BytesMoved``).  ``reset()`` returns these to what a new
process starts with; what Theano itself registered (its contexts, its
compiled functions) and the MPI layer's state (the communicators, the
shared-memory window, the functions the ranks agreed on) stay.

Imports nothing: every layer may keep its state here.
"""

__all__ = ['Session', 'current_session']


class Session(object):
    """The state of one process (``current_session``)."""

    def __init__(self):
        self.reset()

    def reset(self):
        """Forget the mesh, the notices and every part: the next use reads
        the mesh from theano.config again, notices are written again, and
        the parts start empty."""
        self.mesh = None
        self._notices = set()
        self._parts = {}

    def first_notice(self, key):
        """True the first time ``key`` is asked for in this session: the
        notice it names is written once."""
        if key in self._notices:
            return False
        self._notices.add(key)
        return True

    def part(self, kind):
        """This session's instance of class ``kind`` (made with no
        arguments at the first call)."""
        if kind not in self._parts:
            self._parts[kind] = kind()
        return self._parts[kind]


_session = Session()


def current_session():
    """The Session of this process."""
    return _session
