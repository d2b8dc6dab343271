"""How a batch's rows are shared: one rule for replicas and for MPI ranks.

Pure arithmetic, on numbers or on symbolic Theano integers alike.
"""

__all__ = ['slice_bounds']


def slice_bounds(batch_size, parts):
    """[(start, stop)] of each of ``parts`` shares of ``batch_size`` rows:
    contiguous, in order, differing by at most one row; some are empty when
    there are fewer rows than parts.  Symbolic when ``batch_size`` is."""
    return [((i * batch_size) // parts, ((i + 1) * batch_size) // parts)
            for i in range(parts)]
