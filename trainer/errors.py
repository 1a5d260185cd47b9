"""Errors a user can act on. Each message names the problem and the fix in one line.

Every error carries a stable `code` (lowercase, for machines: the job's `error.code`, the CLI's exit
message, alerting rules); subclasses set their own.
"""


class DraftsmithError(Exception):
    """Base class: the CLI prints these as one line, without a traceback."""

    code = "invalid_request"


class TargetError(DraftsmithError):
    """The target checkpoint cannot be used as given."""

    code = "target_invalid"


class DrafterError(DraftsmithError):
    """A drafter checkpoint is malformed or does not fit the target."""

    code = "drafter_invalid"


class StageInterrupted(DraftsmithError):
    """A stage stopped early because its caller asked it to (a cancelled job). Its progress is saved:
    generation keeps finished shards, training writes a checkpoint first, so the stage resumes."""

    code = "interrupted"
