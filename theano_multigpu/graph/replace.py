"""Rewriting a graph to read other variables, without copying it.

``theano.clone(outputs, replace=...)`` copies every replacement's whole
graph, once per replacement.  A rewrite that builds each layer on the
rewritten layers before it (layer-wise mode, and batch-wise mode's
synchronised batch normalisation, whose whole-batch statistics every later
layer of every replica reads) therefore copied the model once per layer it
reads, and again per branch: a graph that doubled or quadrupled with each
such layer, which Theano's merge optimisation then spent minutes folding
back, or which ran out of Python's recursion depth or of memory first.
"""
__all__ = ['replaced', 'Rebuilder']


def replaced(outputs, replace):
    """``outputs`` computed with each key of ``replace`` read as its value
    (see Rebuilder, which does it and can go on)."""
    return Rebuilder(replace)(outputs)


class Rebuilder(object):
    """One rewritten version of a graph, built as far as asked and no
    further, and extended by later calls: each node is rebuilt once, however
    many calls read it, so a rewrite that asks for its graph piece by piece
    (a replica's layers, then what reads their whole batch) builds no node
    twice.

    Only the nodes that read a key or a rebuilt node's output, or whose op
    ``rebuilt_op`` changes, are rebuilt; the values are used as they are
    (their own graphs are not searched for keys), and the other nodes are
    shared with the original graph.  Types may change (a value on a context for a host
    tensor): a rebuilt node is made anew where they do.  A key may be one
    output of a node whose other outputs are read (BatchNormalization's
    normalised tensor and its statistics): the key reads its value, the
    others the rebuilt node's.
    """

    def __init__(self, replace=None, rebuilt_op=None):
        # id(original variable): (the original, kept alive so its id is not
        # reused; what the rewritten graph reads for it)
        self._read_as = {}
        # rebuilt_op(op): the op a node applies in the rewritten graph (the
        # same op, or a copy without what the rewrite made untrue: a node
        # whose op changes is rebuilt, whatever it reads).
        self._rebuilt_op = rebuilt_op
        for key, value in (replace or {}).items():
            self.add(key, value)

    def add(self, key, value):
        """Read ``key`` as ``value`` from now on; nothing read so far may
        have read ``key`` (its readers would keep the old value)."""
        if id(key) in self._read_as:
            raise ValueError('a rewrite replaced %s after the rewritten graph read it '
                             '(as %s); please report this with the model'
                             % (key, self._read_as[id(key)][1]))
        self._read_as[id(key)] = (key, value)

    def has(self, variable):
        """Whether the rewritten graph reads ``variable`` as something
        already: a key, or a variable it has built."""
        return id(variable) in self._read_as

    def __call__(self, outputs):
        """The rewritten version of each of ``outputs``."""
        for node in self._unbuilt_nodes(outputs):
            for variable in node.inputs:   # a graph input read as itself: no key from now on
                if variable.owner is None:
                    self._read_as.setdefault(id(variable), (variable, variable))
            inputs = [self._read(v) for v in node.inputs]
            op = self._rebuilt_op(node.op) if self._rebuilt_op else node.op
            new = node
            if op is not node.op:
                new = _applied(op, node, inputs)
            elif any(a is not b for a, b in zip(inputs, node.inputs)):
                new = node.clone_with_new_inputs(inputs, strict=False)
            for old, rebuilt in zip(node.outputs, new.outputs):
                self._read_as.setdefault(id(old), (old, rebuilt))
        return [self._read(v) for v in outputs]

    def _read(self, variable):
        entry = self._read_as.get(id(variable))
        return variable if entry is None else entry[1]

    def _unbuilt_nodes(self, outputs):
        """The nodes between what is read already and ``outputs``, each
        after the nodes it reads (an iterative depth-first walk: a deep
        model must not meet Python's recursion limit)."""
        def unbuilt_owner(variable):
            if variable.owner is None or id(variable) in self._read_as:
                return None
            return variable.owner
        order, visited = [], set()
        stack = [(node, False) for node in map(unbuilt_owner, reversed(list(outputs)))
                 if node is not None]
        while stack:
            node, inputs_done = stack.pop()
            if inputs_done:
                order.append(node)
                continue
            if id(node) in visited:
                continue
            visited.add(id(node))
            stack.append((node, True))
            for variable in reversed(node.inputs):
                owner = unbuilt_owner(variable)
                if owner is not None and id(owner) not in visited:
                    stack.append((owner, False))
        return order


def _applied(op, node, inputs):
    """``op`` applied to ``inputs`` in place of ``node``: its tag, and its
    outputs' names and creation traces, are ``node``'s (as
    ``clone_with_new_inputs`` keeps them)."""
    import copy
    new = op.make_node(*inputs)
    new.tag = copy.copy(node.tag).__update__(new.tag)
    for old, output in zip(node.outputs, new.outputs):
        output.name = old.name
        trace = getattr(old.tag, 'trace', None)
        if trace:
            output.tag.trace = trace
    return new
