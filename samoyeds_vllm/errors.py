"""The errors this package raises for bad input: the CLI prints their message alone, without a traceback."""


class SamoyedsError(Exception):
    """Bad input from the user (a path, a shape, a checkpoint); the message says what and where."""


class PatternError(SamoyedsError, ValueError):
    """A tensor's shape or contents do not fit a sparsity pattern."""


class CheckpointError(SamoyedsError):
    """A checkpoint is missing, unreadable, corrupted, already converted or of an unsupported kind."""
