"""The exceptions theano_multigpu raises."""

__all__ = ['ConfigurationError', 'PlacementError', 'PlanError', 'PatchTargetError',
           'RowsMeetError', 'KernelBuildError', 'RanksApartError']


class ConfigurationError(ValueError):
    """The flags, the .theanorc or the machine cannot give a working setup.

    The message says what was expected, what was received and how to fix it.
    """


class PlacementError(RuntimeError):
    """A compiled function does not run where the plan says it should."""


class PlanError(ValueError):
    """The layer-wise plan cannot place the model on the contexts' memory,
    or the explicit layer map does not fit the model."""


class PatchTargetError(RuntimeError):
    """A function or class that theano_multigpu patches is not the one its
    patch was written for (another Theano or Keras version)."""


class RowsMeetError(ValueError):
    """Not raised: batch-wise mode computes the ops where the batch's rows
    meet over the whole batch.  Defined so that code that catches it
    imports."""


class KernelBuildError(RuntimeError):
    """A GPU kernel of a compiled function does not build on its device:
    the message names the op, the context and device, and the first lines
    of the compiler's log."""

    def __init__(self, message):
        super(KernelBuildError, self).__init__(message)
        self.message = message

    def __str__(self):
        # Theano adds the node it was compiling to ``args``; the message
        # names it already.
        return self.message


class RanksApartError(RuntimeError):
    """Under MPI, the ranks parted: a rank waited longer than
    ``multigpu.mpi_timeout`` for the others to make the same call, ran
    another function at the same step, or was handed another batch (every
    rank must make the same Keras calls with the same data)."""
