"""What work needs from the process it runs in: the runtime's parts, as a protocol.

``croqq.processes.runtime.Runtime`` provides it and passes itself to every step, the GPU guard and
housekeeping; work names only this protocol, so it never imports the process layer above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import redis

    from croqq.backends._base import Backend, GpuContext
    from croqq.delivery.leases import StepLeases
    from croqq.delivery.ledger import Ledger
    from croqq.domain.manifest import Manifest
    from croqq.placement.assign import Placement
    from croqq.probes._base import GpuProbe
    from croqq.proposers._base import Proposer
    from croqq.settings import Settings
    from croqq.store.writer import ResultsWriter
    from croqq.work.intake import Intake


class GpuIdentity(Protocol):
    """The GPU this process serves and the owner token of its GPU lease."""

    @property
    def uuid(self) -> str: ...

    @property
    def owner(self) -> str: ...


class Completer(Protocol):
    """Runs submitted callables in order, in the background (a GPU step's result is recorded there)."""

    def submit(self, fn: Callable[[], object]) -> None: ...


class Runtime(Protocol):
    """One process's context, its parts created lazily (backend, proposer, probe and writer only in the
    roles that have them)."""

    settings: Settings
    owner: str  # this process's owner token (step leases, claims)

    @property
    def client(self) -> redis.Redis: ...

    @property
    def manifest(self) -> Manifest: ...

    @property
    def ledger(self) -> Ledger: ...

    @property
    def placement(self) -> Placement: ...

    @property
    def intake(self) -> Intake: ...

    @property
    def step_leases(self) -> StepLeases: ...

    @property
    def completer(self) -> Completer: ...

    @property
    def backend(self) -> Backend: ...

    @property
    def proposer(self) -> Proposer: ...

    @property
    def probe(self) -> GpuProbe: ...

    @property
    def gpu_identity(self) -> GpuIdentity: ...

    @property
    def gpu(self) -> GpuContext: ...

    @property
    def writer(self) -> ResultsWriter: ...

    def send_task(self, name: str, queue: str, max_age_s: float, args: list[Any] | None = None) -> None:
        """Send a task message that is useless once older than ``max_age_s`` (housekeeping's requests)."""
