"""One rooted error tree.

Infrastructure faults raise; a failing *candidate* (compile error, wrong answer, crash, hang) is data,
recorded as an outcome, never an exception. The subclass says whether trying again can help.
"""


class CroqqError(Exception):
    """Root of every error croqq raises on purpose."""


class RetryableError(CroqqError):
    """A transient infrastructure fault: the same step may succeed if run again (elsewhere)."""


class TerminalError(CroqqError):
    """Retrying cannot help: bad input, bad configuration, a broken invariant."""


class ConfigError(TerminalError):
    """A setting, manifest or command-line argument is wrong; the message says how to fix it."""


class InvalidRecordError(TerminalError):
    """A file in the results repo or a message payload does not match its schema."""


class StoreGapError(InvalidRecordError):
    """A STORE whose iteration would leave a gap after the repo's last one: the live loop is ahead of git."""


class IllegalTransitionError(TerminalError):
    """The shape FSM received an event that its current state does not accept."""


class LeaseHeldError(ConfigError):
    """A singleton (the writer, beat, a GPU) is already held by another live process: starting a second
    one is a deployment mistake (exit 2; supervisors do not restart it)."""


class HostError(CroqqError):
    """This host cannot run the step (a missing compiler, a broken local setup), whatever the shape: the
    step goes back to its queue for another host, and this worker stops taking work (reported in
    ``croqq status``) until it is fixed and restarted. The shape is not at fault and is never parked."""


class DeferredError(CroqqError):
    """The step cannot run yet (its agent is backed off, the agent budget is spent): it goes back to its
    queue after a short pause. Not a failure: the shape waits, it is never parked for this."""

    def __init__(self, message: str, wait_s: float = 5.0) -> None:
        super().__init__(message)
        self.wait_s = wait_s


class DiskFullError(DeferredError):
    """A disk this host writes to is full (the results repo, a build folder): nothing half-written is
    left, the step goes back to its queue after ``wait_s`` and retries, an alarm (``disk_full``) says
    what to free, and the shape is never blamed. ``path``: the full folder."""

    def __init__(self, message: str, path: str, wait_s: float = 5.0) -> None:
        super().__init__(message, wait_s)
        self.path = path


class RepoCorruptError(DeferredError):
    """The results repo is damaged (an unreadable object or ref): the writer commits nothing on top of it.
    A STORE waits (back to its queue, never counted against its shape) until the repo is repaired
    (``croqq repo repair``); the message is one line naming the object or ref."""


class StaleStepError(CroqqError):
    """A step message or result belongs to an older epoch or an already finished step; drop it."""


class GpuUnavailableError(RetryableError):
    """The GPU failed its health check or its lease was lost; the step must run elsewhere or later."""


class GpuLeaseLostError(RetryableError):
    """This worker no longer holds its GPU's lease; the step must go back to the queue untouched."""


class ArtifactMissingError(CroqqError):
    """A built artifact a GPU step needs is not in the artifact store (it expired, or was never stored)
    or failed verification on arrival. Not the shape's fault and not a reason to compile on the GPU host:
    the step's result clears the loop's reference to it (``ArtifactLost``), so a build host rebuilds it.
    ``artifact`` is the backend's artifact string the step was handed ('' when not known yet)."""

    def __init__(self, message: str, artifact: str = "") -> None:
        super().__init__(message)
        self.artifact = artifact


class ArtifactTooLargeError(CroqqError):
    """A build produced more bytes than the artifact store accepts (``artifact_max_bytes``); the backend
    turns it into a failed build outcome with this message."""
