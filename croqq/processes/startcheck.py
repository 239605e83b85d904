"""The health check a GPU worker runs on its GPU after taking the lease and before it takes any work.

Nothing may initialize CUDA or NVML in a GPU worker's main process (the prefork parent its pool children
fork from), so the probe runs in a short-lived child interpreter, ``python -m croqq.processes.startcheck``:
it reads the settings and the GPU's UUID from stdin as one JSON object (secrets written out: a pipe to our
own child is no log), reads the GPU once through the configured probe, writes the problems it found as one
JSON list of strings on stdout and exits 0. Anything else, or no answer within ``timeout_s``, counts as
unhealthy: a probe that cannot see a GPU's state never calls it healthy.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from pydantic import SecretStr

from croqq.settings import Settings

log = logging.getLogger(__name__)

START_CHECK_TIMEOUT_S = 60.0


def start_problems(settings: Settings, uuid: str, timeout_s: float = START_CHECK_TIMEOUT_S) -> list[str]:
    """Why the GPU must not take work now (empty: healthy), as judged by a probe in a child process."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__],
            input=_request(settings, uuid),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [f"the health check did not answer within {timeout_s:g}s"]
    problems = _parse(done.stdout) if done.returncode == 0 else None
    if problems is None:
        why = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        log.warning("the health check of GPU %s failed (exit %s): %s", uuid, done.returncode, why)
        return [f"the health check failed: {why}"]
    return problems


def _request(settings: Settings, uuid: str) -> bytes:
    data = settings.model_dump(mode="json")
    for name, value in settings:
        if isinstance(value, SecretStr):
            data[name] = value.get_secret_value()
    return json.dumps({"settings": data, "uuid": uuid}).encode()


def _parse(stdout: bytes) -> list[str] | None:
    """The child's answer (its last line), or None if it is not a JSON list of strings."""
    lines = stdout.decode(errors="replace").strip().splitlines()
    try:
        problems = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    if not isinstance(problems, list) or not all(isinstance(p, str) for p in problems):
        return None
    return problems


def _probe_problems(settings: Settings, uuid: str) -> list[str]:
    """In the child: one health reading of the GPU (the simulated probe's faults live in Redis)."""
    from croqq.delivery.redis_client import connect
    from croqq.probes import make_probe

    probe = make_probe(settings, connect(settings))
    try:
        return probe.health(uuid).problems
    finally:
        probe.close()


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    settings, uuid = Settings(**request["settings"]), str(request["uuid"])
    try:
        problems = _probe_problems(settings, uuid)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(problems))
    return 0


if __name__ == "__main__":
    sys.exit(main())
