"""Settings and devices: what this process was given and has.

The ``contexts`` flag and the ``multigpu.*`` settings (``flags`` parses,
``settings`` registers them with Theano), the devices libgpuarray can open
(``devices``), the mesh of contexts taking part (``mesh``), whether MPI
started this process (``mpi_environment``), and the Session that owns the
state the process keeps between calls (``session``).

May import: ``theano_multigpu.errors`` and ``theano_multigpu.patch_targets``.
Theano and pygpu only inside functions that run once Theano is imported.
"""
