"""The artifact store: build artifacts travel from the build host to the GPU host by content, via Redis.

A build host ``put``s the bytes it built (the cuda backend's binary, the sim backend's JSON) and hands on
the :class:`ArtifactRef` it gets back (sha256, size, the host it was built on); a GPU host ``get``s the
bytes by that reference. Nothing here compiles, and no host reads another host's files.

- **Redis**: ``croqq:artifact:<sha256>`` (see :mod:`croqq.delivery.keys`), written with SET NX, so the same
  content is stored once; a put of content already there sends no bytes, it only refreshes the TTL. The
  TTL, ``artifact_ttl_s`` (6 h), is refreshed on every put and get, so an artifact lives while its shape
  keeps using it. More than ``artifact_max_bytes`` (64 MiB) is refused with
  :class:`~croqq.errors.ArtifactTooLargeError`, which a backend reports as a failed build.
- **The local cache** (``artifact_cache_dir``, default ``<run dir>/artifacts``): a GPU host's copies, one
  file per sha256, read first and verified on every read; a copy that fails is discarded and fetched again.
- **Verified on arrival**: what Redis returns must have the reference's sha256 and size before it is used
  or cached. A corrupt value is deleted (so the next put stores it again) and, like a missing one, raises
  :class:`~croqq.errors.ArtifactMissingError`: the shape goes back to a build host to rebuild it.
- **Bytes counted** in ``croqq:stats``: ``artifact_bytes_put`` (stored) and ``artifact_bytes_got``
  (fetched from Redis), for per-iteration network figures.

Without a Redis client (single-host tools: ``croqq measure``, ``croqq kernels``, unit tests) the cache
folder is the whole store: put writes it, get reads it, verified the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import socket
import tempfile
from pathlib import Path

import redis
from pydantic import BaseModel, ConfigDict, Field
from redis.client import NEVER_DECODE

from croqq.delivery import keys
from croqq.errors import ArtifactMissingError, ArtifactTooLargeError
from croqq.settings import Settings

log = logging.getLogger(__name__)


class ArtifactRef(BaseModel):
    """What a build hands on instead of its bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    built_on: str = Field("", description="The build host's name (a label, never used to find the bytes).")

    @property
    def short(self) -> str:
        return self.sha256[:12]


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def _verified(ref: ArtifactRef, data: bytes) -> bool:
    return len(data) == ref.size and hashlib.sha256(data).hexdigest() == ref.sha256


class ArtifactStore:
    def __init__(self, settings: Settings, client: redis.Redis | None = None, host: str = "") -> None:
        self.client = client
        self.ttl_s = max(1, math.ceil(settings.artifact_ttl_s))
        self.max_bytes = settings.artifact_max_bytes
        self.cache_dir = settings.resolved_artifact_cache_dir()
        self.host = host or socket.gethostname()

    def put(self, data: bytes) -> ArtifactRef:
        """Store ``data`` (once per content) and return its reference; ArtifactTooLargeError over the cap."""
        if len(data) > self.max_bytes:
            raise ArtifactTooLargeError(
                f"the built artifact is {_mib(len(data))}, over the artifact store's cap of "
                f"{_mib(self.max_bytes)} (CROQQ_ARTIFACT_MAX_BYTES)"
            )
        ref = ArtifactRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data), built_on=self.host)
        if self.client is None:
            if self._local(ref) is None:
                self._cache(ref, data)
            return ref
        key = keys.artifact(ref.sha256)
        if not self.client.expire(key, self.ttl_s) and self.client.set(key, data, nx=True, ex=self.ttl_s):
            self.client.hincrby(keys.STATS, "artifact_bytes_put", len(data))
        return ref

    def get(self, ref: ArtifactRef) -> bytes:
        """The verified bytes: from the local cache, else from Redis (then cached)."""
        data = self._local(ref)
        if data is None:
            data = self._fetch(ref)
            self._cache(ref, data)
        return data

    def path(self, ref: ArtifactRef) -> Path:
        """The verified local file holding the artifact (fetched first when this host has none)."""
        self.get(ref)
        return self._file(ref)

    # -- internals ------------------------------------------------------------------------------------

    def _file(self, ref: ArtifactRef) -> Path:
        return self.cache_dir / ref.sha256

    def _local(self, ref: ArtifactRef) -> bytes | None:
        file = self._file(ref)
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            return None
        if not _verified(ref, data):
            log.warning("cached artifact %s at %s failed verification; discarded", ref.short, file)
            file.unlink(missing_ok=True)
            return None
        if self.client is not None:
            self.client.expire(keys.artifact(ref.sha256), self.ttl_s)
        return data

    def _fetch(self, ref: ArtifactRef) -> bytes:
        if self.client is None:
            raise ArtifactMissingError(
                f"artifact {ref.short} (built on {ref.built_on}) is not in {self.cache_dir} "
                "and there is no Redis to fetch it from"
            )
        key = keys.artifact(ref.sha256)
        data = self.client.execute_command("GETEX", key, "EX", self.ttl_s, **{NEVER_DECODE: []})
        if data is None:
            raise ArtifactMissingError(
                f"artifact {ref.short} (built on {ref.built_on}) is not in the artifact store: "
                "it expired or was never stored"
            )
        self.client.hincrby(keys.STATS, "artifact_bytes_got", len(data))
        if not _verified(ref, data):
            self.client.delete(key)
            raise ArtifactMissingError(
                f"artifact {ref.short} (built on {ref.built_on}) failed verification on arrival "
                f"({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:12]}); deleted from the store"
            )
        return data

    def _cache(self, ref: ArtifactRef, data: bytes) -> None:
        """Write a verified copy atomically (a reader never sees a partial file)."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=f".{ref.short}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, self._file(ref))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
