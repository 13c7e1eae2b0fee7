"""Exception types. Each is turned into one clear line (and a non-zero exit) at the CLI edge."""


class Rollout8Error(Exception):
    """Base class: a problem the user can fix; the message says what and how."""

    exit_code = 2


class LockError(Rollout8Error):
    """The version lock is malformed or disagrees with a file that must follow it."""


class IndexUnreachable(Rollout8Error):
    """A package index could not be asked (network, proxy, TLS trust, an index without the API asked for): the
    message names the index and what to set."""


class SpecError(Rollout8Error):
    """A run spec (configs/runs/*.yaml) is invalid; the message names the field."""


class PatchError(Rollout8Error):
    """A patch does not apply (upstream drifted) or the target is not what it expects."""


class ModelError(Rollout8Error):
    """A model directory is missing files or does not have the expected layout."""


class CheckFailed(Rollout8Error):
    """A check found problems (already reported line by line)."""

    exit_code = 1
    keeps_output = True  # its report is the output (verify-quant --json): a failed run does not remove it


class ChecksRefused(CheckFailed):
    """`rollout8 check`'s rules refused the spec before a command wrote its output: nothing it made is kept."""

    keeps_output = False


class WriteError(Rollout8Error):
    """An output could not be written (no space, read-only, permission, ...): the message names the output path
    and the cause, and says what to do; never the input's fault, never a bug (fileutil.write_failure builds it)."""

    def __init__(self, path: object, cause: str, hint: str) -> None:
        super().__init__(f"cannot write {path}: {cause}; {hint}")
        self.path = path
        self.cause = cause
