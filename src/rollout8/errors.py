"""Exception types. Each is turned into one clear line (and a non-zero exit) at the CLI edge."""


class Rollout8Error(Exception):
    """Base class: a problem the user can fix; the message says what and how."""

    exit_code = 2


class LockError(Rollout8Error):
    """The version lock is malformed or disagrees with a file that must follow it."""


class SpecError(Rollout8Error):
    """A run spec (configs/runs/*.yaml) is invalid; the message names the field."""


class PatchError(Rollout8Error):
    """A patch does not apply (upstream drifted) or the target is not what it expects."""


class ModelError(Rollout8Error):
    """A model directory is missing files or does not have the expected layout."""


class CheckFailed(Rollout8Error):
    """A check found problems (already reported line by line)."""

    exit_code = 1
