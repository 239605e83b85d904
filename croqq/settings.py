"""All settings: one pydantic-settings model, environment prefix ``CROQQ_``.

Defaults work on a laptop: simulated GPUs when NVML finds none, a results repo under ``.croqq/``,
an embedded Redis started by ``croqq up`` when no broker URL is configured.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from croqq import patience
from croqq.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parent.parent


AGENT_NAMES = ("claude", "codex", "opencode", "cursor", "gemini", "aider", "scripted", "command")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CROQQ_", extra="forbid", validate_default=True)

    # -- broker / state ---------------------------------------------------------------------------
    broker_url: str = Field(
        "",
        description="redis://, rediss:// or unix:// URL of the Redis that is broker and live state. "
        "Empty: the local run folder's embedded Redis (started by `croqq up`).",
    )
    redis_password: SecretStr | None = Field(None, description="Password, if not inside broker_url.")
    redis_ssl_cert_reqs: Literal["required", "optional", "none"] = "required"
    run_dir: Path = Field(Path(".croqq"), description="Local folder for the embedded Redis, pids and logs.")
    progress_every_s: float = Field(
        10.0,
        gt=0,
        description="`croqq up` and `croqq status --watch` without a terminal (a pipe, CI, nohup): one "
        "progress line this often; `croqq up` also appends it to <run dir>/logs/progress.log.",
    )
    health_dir: Path | None = Field(
        None,
        description="Where each long-running process writes its heartbeat file for `croqq health` "
        "(default <run dir>/health). A folder of this host: the check runs where the process runs.",
    )

    # -- results repo -----------------------------------------------------------------------------
    results_repo: Path = Field(Path(".croqq/results"), description="Git repo the writer commits into.")
    results_branch: str = "main"
    results_remote: str = Field("", description="Remote URL or name to push to; empty: no push.")
    push_every_s: float = Field(30.0, ge=0, description="Push at most this often (0: after each commit).")
    sync_worktree: bool = Field(
        True, description="Also write files into the results repo's working tree and index (non-bare repos)."
    )
    git_fsync: bool = Field(
        True,
        description="fsync each commit's pack, the moved branch ref and their folders before a STORE is "
        "acknowledged. Off trades power-loss safety (the last acknowledged commits can vanish, the branch "
        "ref can be left empty) for speed.",
    )
    manifest: Path = Field(PROJECT_ROOT / "kernels" / "manifest.json")
    build_dir: Path = Field(
        Path(""), description="Where a build host compiles candidates (default <run dir>/build)."
    )
    disk_reserve_bytes: int = Field(
        64 << 20,
        ge=0,
        description="The writer does not commit, and a build host does not compile, while less than this "
        "is free on the results repo's or the build folder's disk (alarm disk_full); 0: no check.",
    )
    disk_retry_s: float = Field(
        5.0, gt=0, description="A STORE or build held up by a full disk retries this often."
    )
    kernels_dir: Path = Field(
        PROJECT_ROOT, description="Root that the manifest's include_dirs are relative to."
    )
    artifact_ttl_s: float = Field(
        6 * 3600.0, gt=0, description="Built artifacts live this long in Redis (refreshed on every put/get)."
    )
    artifact_max_bytes: int = Field(
        64 << 20, ge=1, description="The largest artifact a build may store; a bigger one fails the build."
    )
    artifact_cache_dir: Path = Field(
        Path(""),
        description="A GPU host's verified copies of fetched artifacts (default: <run dir>/artifacts).",
    )

    # -- backends ---------------------------------------------------------------------------------
    backend: Literal["sim", "cuda", "replay"] = "sim"
    replay_cache: Path | None = Field(
        None, description="backend=replay: the Kernel Tuner cache file (JSON, optionally gzipped) it replays."
    )
    replay_repeats: int = Field(
        7, ge=1, description="backend=replay: timed repeats per measurement, drawn from the recorded ones."
    )
    cublaslt: str = Field(
        "",
        description="backend=cuda: the path of libcublasLt.so (the harness's reference and cuBLAS timing) "
        "where the loader does not find it (a CUDA install without the .so link, a wheel's nvidia/cu13/lib).",
    )
    probe: Literal["auto", "nvml", "sim"] = "auto"
    sim_gpus: int = Field(8, ge=1, le=64, description="Simulated GPUs per host when NVML finds none.")
    sim_gpu_type: str = "sm90_Simulated_H100_SXM"
    sim_machine: str = Field(
        "",
        description="The simulated machine in its GPUs' UUIDs (GPU-sim-<machine>-<i>; default: the host "
        "name). Like a real GPU's UUID it stays when the worker comes back under another host name.",
    )
    time_scale: float = Field(0.0, ge=0, description="Multiplier on simulated step durations (0: instant).")
    sim_ideate_s: float = Field(60.0, description="The simulated agent's think time (its median).")
    sim_ideate_sigma: float = Field(
        0.0, ge=0, description="Lognormal spread of the simulated think time (0: always sim_ideate_s)."
    )
    sim_implement_s: float = 20.0
    sim_measure_s: float = Field(
        10.0, description="The simulated GPU time of one kernel's measurement (a batch of k: k times)."
    )
    sim_profile_s: float = 15.0
    sim_compile: Literal["model", "nvcc"] = Field(
        "model", description="nvcc: the sim backend really compiles each candidate for sm_90a."
    )
    proposer: Literal["model", "search", "agent"] = Field(
        "model",
        description="model: model-guided knob search (croqq.proposers.model); search: an engineer's local "
        "search (croqq.proposers.search); agent: a coding agent (CROQQ_AGENT).",
    )
    transfer: bool = Field(
        True,
        description="Neighbour transfer: a shape that starts or stalls is first offered the best kernels of "
        "its nearest advanced neighbours (same GPU type, family, dtype), re-targeted to it and measured "
        "on it; an agent's context.json lists them. Off: every shape learns alone.",
    )
    agent: str = Field(
        "scripted",
        description="The agent preset for proposer=agent; a comma list (claude,codex) spreads an iteration's "
        "candidates over those agents, round-robin.",
    )
    agent_command: str = Field(
        "", description="agent=command: the command line (split like a shell, run without one)."
    )
    agent_model: str = Field("", description="Model name passed to the agent CLI (empty: its default).")
    agent_env: str = Field(
        "", description="Extra environment variable names handed to the agent (comma-separated)."
    )
    agent_jail: Literal["auto", "bwrap", "unshare", "none"] = Field(
        "auto",
        description="Mount-namespace jail (only the workspace writable): auto is bwrap where it works, else "
        "unshare (croqq builds the same view), else none (said at start-up and raised as an alarm).",
    )
    agent_network: Literal["preset", "none", "host"] = Field(
        "preset",
        description="The agent's network (jailed only): none, host, or its preset's (scripted: none).",
    )
    agent_cpu_s: int = Field(900, ge=0, description="CPU seconds per agent process (RLIMIT_CPU; 0: none).")
    agent_memory_mb: int = Field(
        4096, ge=0, description="Memory of one agent run, MiB (its cgroup, else RLIMIT_AS; 0: none)."
    )
    agent_max_procs: int = Field(
        512,
        ge=0,
        description="Processes and threads of one agent run (its cgroup, else RLIMIT_NPROC; 0: none).",
    )
    agent_max_file_mb: int = Field(256, ge=0, description="Largest file an agent may write, MiB (0: none).")
    agent_max_output_bytes: int = Field(4 << 20, ge=1024, description="Agent stdout/stderr kept.")
    agent_max_source_bytes: int = Field(1 << 20, ge=1024, description="Largest candidate accepted.")
    agent_backoff_after: int = Field(3, ge=1, description="Consecutive agent failures before back-off.")
    agent_backoff_s: float = Field(30.0, ge=0, description="First back-off; doubles up to the max.")
    agent_backoff_max_s: float = Field(600.0, ge=0)
    dsl: str | None = Field(
        None,
        description="The kernel family submissions tune (manifest 'dsls'); unset: each mode's "
        "(manifest modes.<mode>.dsl: cutlass from the current best, cuda from scratch).",
    )

    # -- scheduling -------------------------------------------------------------------------------
    pipeline_depth: int = Field(
        4, ge=1, le=256, description="Active shapes per GPU: the fixed depth, or the adaptive one's start."
    )
    pipeline_depth_mode: Literal["adaptive", "fixed"] = Field(
        "adaptive",
        description="adaptive: each GPU's depth follows the step times it observes (croqq.placement.depth); "
        "fixed: pipeline_depth shapes on every GPU.",
    )
    pipeline_depth_max: int = Field(
        64, ge=1, le=256, description="Adaptive: the most shapes a GPU may hold (the memory limit)."
    )
    pipeline_headroom: float = Field(
        1.5, ge=1.0, le=4.0, description="Adaptive: depth = headroom x (1 + off-GPU time / GPU time)."
    )
    candidates: int = Field(
        1,
        ge=1,
        le=8,  # croqq.domain.fsm.MAX_CANDIDATES (a base module imports no layer)
        description="Candidates one iteration gathers, when `croqq submit --candidates` gives none.",
    )
    profile_every: int = Field(
        10, ge=1, description="PROFILE every N iterations (plus iter 1, KEEPs, stalls)."
    )
    noise_margin: float = Field(
        0.015, ge=0, lt=1, description="Relative win needed before a KEEP is confirmed."
    )
    store_group: int = Field(
        16,
        ge=1,
        le=256,
        description="The most STOREs the writer commits together: woken, it drains every queued STORE, "
        "this many per commit (1: one commit per iteration).",
    )
    ideate_rate_limit: str = Field("", description="Celery rate limit for the ideate task, e.g. '30/m'.")
    ideate_concurrency: int = Field(8, ge=1)
    build_concurrency: int = Field(2, ge=1)
    build_pool: Literal["prefork", "threads"] = Field(
        "prefork", description="prefork for nvcc (CPU bound); threads suits the simulated backend."
    )

    # -- leases and timeouts (seconds) ------------------------------------------------------------
    lease_ttl_s: float = Field(10.0, gt=0, description="Step, GPU and singleton lease TTL.")
    reconcile_every_s: float = Field(1.0, gt=0)
    queue_resend_s: float = Field(600.0, gt=0, description="Safety net: re-publish a step queued this long.")
    queue_wait_s: float = Field(3600.0, gt=0, description="Give up waiting for a free GPU after this long.")
    compile_timeout_s: float = 300.0
    run_timeout_s: float = 120.0
    agent_timeout_s: float = 1800.0
    health_wait_s: float = Field(
        30.0, ge=0, description="Wait this long for an unhealthy GPU before quarantine."
    )
    gpu_offline_s: float = Field(
        60.0, gt=0, description="A GPU whose worker is gone this long releases its shapes."
    )
    recheck_every_s: float = Field(30.0, gt=0, description="Re-probe quarantined GPUs this often.")
    quarantine_cooldown_s: float = Field(
        60.0, ge=0, description="A quarantined GPU stays out at least this long, however its re-checks go."
    )
    repo_check_every_s: float = Field(
        60.0,
        gt=0,
        description="The writer checks the results repo's refs and new packs/objects this often "
        "(and at start-up); damage stops its commits until `croqq repo repair`.",
    )
    git_reconcile_every_s: float = Field(
        60.0,
        gt=0,
        description="Reconcile live state against the results repo this often (and after Redis restarts).",
    )
    max_step_failures: int = Field(
        3, ge=1, description="Unexpected errors before a shape is parked as 'error'."
    )
    max_attempts_in_a_row: int = Field(
        50,
        ge=1,
        description="Attempts in a row (candidates refused, repeated or failing to build; nothing measured) "
        "before a shape is parked as 'error': its proposer is stuck.",
    )
    task_events: bool = Field(
        True, description="Workers send task events and event heartbeats (Flower lists workers from them)."
    )
    # -- monitoring logins: Flower and the exporter refuse a non-loopback address without one --------
    flower_basic_auth: SecretStr | None = Field(
        None, description="Flower's HTTP basic auth, `user:password[,user2:password2]` (unset: none)."
    )
    flower_basic_auth_file: Path | None = Field(
        None, description="A file holding Flower's `user:password[,...]` (a Secret); wins over the variable."
    )
    exporter_basic_auth: SecretStr | None = Field(
        None, description="The exporter's HTTP basic auth, `user:password[,...]` (unset: none)."
    )
    exporter_basic_auth_file: Path | None = Field(
        None, description="A file holding the exporter's `user:password[,...]`; wins over the variable."
    )
    test_barriers: bool = Field(False, description="Steps block on croqq:barrier:<kind> keys (chaos tests).")

    # -- GPU health thresholds ----------------------------------------------------------------------
    max_temp_c: int = 85
    max_idle_util_pct: int = 10
    max_idle_mem_mib: int = 2048

    @field_validator("agent")
    @classmethod
    def _agent_names(cls, value: str) -> str:
        names = [name.strip() for name in value.split(",")]
        unknown = [name for name in names if name not in AGENT_NAMES]
        if unknown:
            raise ValueError(
                f"unknown agent {unknown[0]!r}; use one or a comma list of {', '.join(AGENT_NAMES)}"
            )
        return ",".join(names)

    @property
    def agents(self) -> list[str]:
        """The agents of ``agent`` (one, or those an iteration's candidates are spread over)."""
        return self.agent.split(",")

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.proposer == "agent" and "command" in self.agents and not self.agent_command.strip():
            raise ConfigError("CROQQ_AGENT=command needs CROQQ_AGENT_COMMAND (the agent command to run)")
        if self.proposer != "agent":
            _refuse_an_unused_agent(self)
        patience.scale()  # CROQQ_PATIENCE is read where croqq waits; refused here before anything starts
        for name in ("flower_basic_auth", "exporter_basic_auth"):
            secret = getattr(self, name)
            if secret is not None:
                check_basic_auth(secret.get_secret_value(), f"CROQQ_{name.upper()}")
        if self.backend == "replay":
            _check_replay(self)
        if self.broker_url and not self.broker_url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(
                f"CROQQ_BROKER_URL={self.broker_url!r} is not a Redis URL; use redis://host:6379/0 or unix:///path"
            )
        return self

    def resolved_health_dir(self) -> Path:
        return self.health_dir if self.health_dir is not None else self.run_dir / "health"

    def resolved_build_dir(self) -> Path:
        return self.build_dir if str(self.build_dir) not in ("", ".") else self.run_dir / "build"

    def resolved_artifact_cache_dir(self) -> Path:
        cache = self.artifact_cache_dir
        return cache if str(cache) not in ("", ".") else self.run_dir / "artifacts"

    def resolved_broker_url(self) -> str:
        """The broker URL to use: the configured one, else the embedded Redis of the run folder."""
        if self.broker_url:
            return self.broker_url
        return f"unix://{(self.run_dir / 'redis' / 'redis.sock').resolve()}"


def _refuse_an_unused_agent(s: Settings) -> None:
    """An agent named while another proposer is selected would never run: refuse it rather than drop it.
    ``CROQQ_AGENT=scripted`` (the default) names no choice: deploy templates set it beside any proposer."""
    named = []
    if s.agent != Settings.model_fields["agent"].default:
        named.append(f"CROQQ_AGENT={s.agent}")
    if s.agent_command.strip():
        named.append("CROQQ_AGENT_COMMAND")
    if not named:
        return
    use = "CROQQ_PROPOSER=agent" + (
        " CROQQ_AGENT=command" if "command" not in s.agents and s.agent_command.strip() else ""
    )
    raise ConfigError(
        f"{' and '.join(named)} set while CROQQ_PROPOSER={s.proposer}, which never calls an agent: "
        f"set {use} to use it, or unset {' and '.join(n.split('=')[0] for n in named)}"
    )


def _check_replay(s: Settings) -> None:
    """backend=replay: a readable cache file, and the replay dsl (the default then)."""
    if s.replay_cache is None or str(s.replay_cache) in ("", "."):
        raise ConfigError("CROQQ_BACKEND=replay needs CROQQ_REPLAY_CACHE (a Kernel Tuner cache file)")
    try:
        with s.replay_cache.open("rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"CROQQ_REPLAY_CACHE={s.replay_cache}: cannot read it ({exc.strerror})") from exc
    if "dsl" not in s.model_fields_set:
        s.dsl = "replay"  # croqq.backends.replay.REPLAY_DSL
    elif s.dsl != "replay":
        raise ConfigError(f"CROQQ_BACKEND=replay measures the replay dsl only, not CROQQ_DSL={s.dsl}")


def check_basic_auth(value: str, source: str) -> list[tuple[str, str]]:
    """``user:password[,user2:password2]`` as (user, password) pairs: each names a user and a password."""
    pairs = []
    for pair in value.strip().split(","):
        user, sep, password = pair.partition(":")
        if not (user.strip() and sep and password):
            raise ConfigError(f"{source}: use user:password[,user2:password2], each with a user and password")
        pairs.append((user.strip(), password))
    return pairs


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
