"""Several processes (MPI): each rank trains on its share of every batch.

- ``world``: this process's communicator, rank and size (imports mpi4py);
- ``ops``: the collective ops inside a compiled function;
- ``transport``: summing arrays over the ranks (shared memory, Allreduce);
- ``data_parallel``: the gather across ranks and the gradient arithmetic;
- ``agreement``: the same model, weights and random state on every rank.

Imported only under MPI (``theano_multigpu.config.mpi_environment``).

May import: ``theano_multigpu.graph`` and every layer below it.
"""
