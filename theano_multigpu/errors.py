"""The exceptions theano_multigpu raises."""

__all__ = ['ConfigurationError', 'PlacementError', 'PlanError']


class ConfigurationError(ValueError):
    """The flags, the .theanorc or the machine cannot give a working setup.

    The message says what was expected, what was received and how to fix it.
    """


class PlacementError(RuntimeError):
    """A compiled function does not run where the plan says it should."""


class PlanError(ValueError):
    """The layer-wise plan cannot place the model on the contexts' memory,
    or the explicit layer map does not fit the model."""
