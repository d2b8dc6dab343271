"""For the children: count the calls of Scan's compiled loop."""


def count_compiled_calls():
    """{'calls': 0}, counting from now the compiled loop's calls (which must
    be available: the assertion names why it is not)."""
    from theano_multigpu.compat import compiled_scan
    compiled = compiled_scan.compiled_execute()
    assert compiled is not None, compiled_scan.loop_description()
    counter = {'calls': 0}

    def counting(*args):
        counter['calls'] += 1
        return compiled(*args)
    compiled_scan._loaded['execute'] = counting
    return counter
