"""docker-compose.yml, docker/ and .env.example, checked offline (no Docker engine here): the compose
specification, real croqq commands, health checks, secrets only from .env, nothing shared but Redis."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from commands import HEALTH_ROLE, ROOT, InvalidCommand, croqq_argv, parse_croqq

COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILES = {"croqq": ROOT / "docker" / "Dockerfile", "croqq-cuda": ROOT / "docker" / "Dockerfile.cuda"}
INTERPOLATED = re.compile(r"\$\{([A-Z][A-Z0-9_]*)")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    return dict(yaml.safe_load(COMPOSE.read_text())["services"])  # anchors and << merges resolved


def croqq_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services.items() if croqq_argv(command_of(s))}


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def health_argv(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD", f"croqq health checks run without a shell: {test}"
    return [str(a) for a in test[1:]]


def check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_compose_file_follows_the_compose_specification() -> None:
    done = check_jsonschema(COMPOSE)  # the schema is built into check-jsonschema: no network
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_specification_check_catches_a_misspelt_key(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        COMPOSE.read_text().replace("    restart: unless-stopped", "    restrat: unless-stopped")
    )
    done = check_jsonschema(broken)
    assert done.returncode != 0 and "restrat" in done.stdout


def test_every_croqq_service_runs_a_real_croqq_command_with_valid_options(
    services: dict[str, dict[str, Any]],
) -> None:
    found = croqq_services(services)
    assert set(found) == {
        "coordinator",
        "writer",
        "beat",
        "build-worker",
        "ideate-worker",
        "gpu-worker",
        "flower",
        "exporter",
    }
    for service in found.values():
        parse_croqq(command_of(service))
        parse_croqq(health_argv(service))
    assert parse_croqq(command_of(services["gpu-worker"]))["gpus"] == "all"
    assert parse_croqq(command_of(services["flower"])) == {
        "port": 5555,
        "address": "0.0.0.0",
        "read_only": True,
    }


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["croqq", "worker", "--gpu", "all"], "No such option: --gpu"),
        (["croqq", "flower", "--port", "web"], "Invalid value for '--port'"),
        (["croqq", "health", "--ready"], "Missing option '--role'"),
        (["croqq", "build_worker"], "No such command 'build_worker'"),
    ],
)
def test_a_wrong_command_or_option_is_caught(argv: list[str], complaint: str) -> None:
    with pytest.raises(InvalidCommand, match=re.escape(complaint)):
        parse_croqq(argv)


def test_every_service_has_a_healthcheck_and_croqq_ones_ask_croqq_health_about_their_role(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name, service in croqq_services(services).items():
        role = HEALTH_ROLE[command_of(service)[1]]
        assert health_argv(service) == ["croqq", "health", "--role", role, "--ready"], name


def test_every_croqq_service_reaches_redis_with_its_password_once_redis_is_healthy(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in croqq_services(services).items():
        url = service["environment"]["CROQQ_BROKER_URL"]
        assert re.fullmatch(
            r"redis://:\$\{CROQQ_REDIS_PASSWORD:\?[^}]*\}@\$\{CROQQ_REDIS_HOST:-redis\}:6379/0", url
        )
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name
        assert service["restart"] in ("unless-stopped", "always", "on-failure"), name


def test_redis_is_durable_password_protected_never_evicts_and_is_checked_with_the_password(
    services: dict[str, dict[str, Any]],
) -> None:
    redis = services["redis"]
    assert redis["image"].startswith("redis:7")
    args = " ".join(redis["command"])
    for setting in ("--appendonly yes", "--appendfsync always", "--maxmemory-policy noeviction"):
        assert setting in args
    assert "--requirepass ${CROQQ_REDIS_PASSWORD:?" in args
    assert redis["environment"]["REDISCLI_AUTH"].startswith("${CROQQ_REDIS_PASSWORD")  # redis-cli's password
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])
    assert redis["volumes"] == ["redis-data:/data"] and redis["restart"] == "unless-stopped"


def test_gpu_and_build_workers_use_the_cuda_image_and_the_gpu_worker_reserves_every_gpu(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in ("gpu-worker", "build-worker"):
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    for name in ("coordinator", "writer", "beat", "ideate-worker", "flower", "exporter"):
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile"
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "deploy" not in services["build-worker"]  # nvcc needs no GPU


def test_the_writer_keeps_the_results_repo_on_its_own_volume(services: dict[str, dict[str, Any]]) -> None:
    writer = services["writer"]
    assert writer["volumes"] == ["results:/var/lib/croqq/results"]
    assert writer["environment"]["CROQQ_RESULTS_REPO"].startswith("/var/lib/croqq/results/")


def test_nothing_is_shared_between_services_but_redis(services: dict[str, dict[str, Any]]) -> None:
    users: dict[str, list[str]] = {}
    for name, service in services.items():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0] if isinstance(mount, str) else mount["source"]
            assert not source.startswith((".", "/", "~")), f"{name} mounts a host folder: {mount}"
            users.setdefault(source, []).append(name)
    assert users == {
        "redis-data": ["redis"],
        "results": ["writer"],
        "prometheus-data": ["prometheus"],
        "grafana-data": ["grafana"],
    }
    assert set(yaml.safe_load(COMPOSE.read_text())["volumes"]) == set(users)


def test_flower_has_basic_auth_from_env(services: dict[str, dict[str, Any]]) -> None:
    flower = services["flower"]
    assert flower["environment"]["CROQQ_FLOWER_BASIC_AUTH"].startswith("${CROQQ_FLOWER_BASIC_AUTH:?")


def test_the_exporter_needs_a_login_from_env_and_is_published_on_this_host_only_by_default(
    services: dict[str, dict[str, Any]],
) -> None:
    exporter = services["exporter"]
    login = exporter["environment"]["CROQQ_EXPORTER_BASIC_AUTH"]
    assert login.startswith("prometheus:${CROQQ_EXPORTER_PASSWORD:?")
    assert parse_croqq(command_of(exporter)) == {"port": 9808, "address": "0.0.0.0", "log_level": "INFO"}
    assert exporter["ports"] == ["${CROQQ_EXPORTER_PUBLISH:-127.0.0.1}:9808:9808"]


def test_the_env_example_documents_every_variable_and_holds_only_placeholders() -> None:
    used = set(INTERPOLATED.findall(COMPOSE.read_text()))
    lines = (ROOT / ".env.example").read_text().splitlines()
    documented = {}
    for i, line in enumerate(lines):
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            assert lines[i - 1].startswith("#"), f"{name} has no comment above it"
            documented[name] = value
    assert used == set(documented)
    assert documented["CROQQ_REDIS_PASSWORD"] == "change-me"
    assert documented["CROQQ_FLOWER_BASIC_AUTH"] == "admin:change-me"
    assert documented["CROQQ_EXPORTER_PASSWORD"] == "change-me"
    assert documented["CROQQ_GRAFANA_PASSWORD"] == "change-me"


def test_dotenv_files_are_never_committed() -> None:
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT, check=False)
    assert ignored.returncode == 0


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for raw in joined.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_a_dockerfile_copies_only_what_the_repo_has_and_runs_croqq_as_a_user(image: str) -> None:
    steps = dockerfile_instructions(DOCKERFILES[image])
    copies = [shlex.split(rest) for word, rest in steps if word in ("COPY", "ADD")]
    assert copies
    for *sources, _target in copies:
        assert not any(s.startswith("--from") for s in sources)
        for source in sources:
            assert (ROOT / source).exists(), f"{image}: COPY {source}: not in the repo"
            assert (
                subprocess.run(
                    ["git", "ls-files", "--error-unmatch", source], cwd=ROOT, capture_output=True, check=False
                ).returncode
                == 0
            )
    users = [rest for word, rest in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert ("ENTRYPOINT", '["tini", "--"]') in steps
    base = next(rest for word, rest in steps if word == "FROM")
    assert base == ("python:3.11-slim" if image == "croqq" else "nvidia/cuda:12.8.1-devel-ubuntu24.04")
    installs = " ".join(rest for word, rest in steps if word == "RUN")
    assert " git " in installs and "pip install -e '.[flower]'" in installs


def test_the_docker_build_context_holds_what_the_dockerfiles_copy() -> None:
    kept = [line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    for path in DOCKERFILES.values():
        for word, rest in dockerfile_instructions(path):
            if word == "COPY":
                for source in shlex.split(rest)[:-1]:
                    assert any(source.rstrip("/") == k.rstrip("/") for k in kept), source


def test_the_monitoring_profile_scrapes_the_exporter_with_its_login_and_loads_the_dashboard(
    services: dict[str, dict[str, Any]],
) -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["monitoring"]  # not started by a plain `up`
    configs = {name: ROOT / c["file"] for name, c in compose["configs"].items()}
    assert all(path.is_file() for path in configs.values()), configs
    mounted = {c["target"]: configs[c["source"]] for s in (prometheus, grafana) for c in s["configs"]}
    scrape = yaml.safe_load(mounted["/etc/prometheus/prometheus.yml"].read_text())["scrape_configs"]
    (job,) = scrape
    # the login Prometheus sends is the exporter's: user prometheus, the password compose hands it
    user = services["exporter"]["environment"]["CROQQ_EXPORTER_BASIC_AUTH"].split(":")[0]
    assert job["basic_auth"]["username"] == user
    (secret,) = prometheus["secrets"]
    assert job["basic_auth"]["password_file"] == f"/run/secrets/{secret}"
    assert compose["secrets"][secret] == {"environment": "CROQQ_EXPORTER_PASSWORD"}
    assert job["static_configs"] == [{"targets": ["exporter:9808"]}]
    # Grafana: its data source is that Prometheus, and its dashboards folder holds croqq's dashboard
    sources = yaml.safe_load(mounted["/etc/grafana/provisioning/datasources/croqq.yml"].read_text())
    assert [d["url"] for d in sources["datasources"]] == ["http://prometheus:9090"]
    providers = yaml.safe_load(mounted["/etc/grafana/provisioning/dashboards/croqq.yml"].read_text())
    folder = providers["providers"][0]["options"]["path"]
    assert mounted[f"{folder}/croqq.json"] == ROOT / "docker" / "grafana" / "croqq.json"
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"].startswith("${CROQQ_GRAFANA_PASSWORD:?")
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert prometheus["ports"] == ["${CROQQ_PROMETHEUS_PUBLISH:-127.0.0.1}:9090:9090"]
    assert grafana["ports"] == ["${CROQQ_GRAFANA_PUBLISH:-127.0.0.1}:3000:3000"]
