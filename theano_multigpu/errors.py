"""The exceptions theano_multigpu raises."""

__all__ = ['ConfigurationError', 'PlacementError']


class ConfigurationError(ValueError):
    """The flags, the .theanorc or the machine cannot give a working setup.

    The message says what was expected, what was received and how to fix it.
    """


class PlacementError(RuntimeError):
    """A compiled function does not run where the plan says it should."""
