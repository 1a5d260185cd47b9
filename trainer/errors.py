"""Errors a user can act on. Each message names the problem and the fix in one line."""


class DraftsmithError(Exception):
    """Base class: the CLI prints these as one line, without a traceback."""


class TargetError(DraftsmithError):
    """The target checkpoint cannot be used as given."""


class DrafterError(DraftsmithError):
    """A drafter checkpoint is malformed or does not fit the target."""
