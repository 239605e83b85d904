"""k8s/, checked offline: every manifest against Kubernetes' own schemas (kubernetes-validate --strict,
which bundles them), the kustomization complete, real croqq commands, probes that run `croqq health`,
secrets from Secrets, non-root pods, and the singletons and GPU workers shaped as k8s/README.md says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from commands import HEALTH_ROLE, ROOT, croqq_argv, parse_croqq, yaml_documents

K8S = ROOT / "k8s"
KUSTOMIZATION = K8S / "kustomization.yaml"
RUN_DIR = "/var/lib/croqq/run"
# The newest Kubernetes kubernetes-validate bundles, and the oldest release still widely supported.
VERSIONS = (kubernetes_validate.utils.latest_version(), "1.33.0")
CROQQ_IMAGES = ("croqq:", "croqq-cuda:")


def manifests() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p != KUSTOMIZATION)


def kustomization() -> dict[str, Any]:
    return dict(yaml.safe_load(KUSTOMIZATION.read_text()))


def resources() -> list[dict[str, Any]]:
    return [doc for path in manifests() for doc in yaml_documents(path)]


def workloads() -> dict[str, dict[str, Any]]:
    return {
        doc["metadata"]["name"]: doc
        for doc in resources()
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
    }


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return dict(workload["spec"]["template"]["spec"])


def croqq_containers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(workload name, pod spec, container) for every container of a croqq image."""
    found = []
    for name, workload in workloads().items():
        spec = pod_spec(workload)
        for container in spec["containers"]:
            if container["image"].startswith(CROQQ_IMAGES):
                found.append((name, spec, container))
    return found


def exec_argv(probe: dict[str, Any]) -> list[str]:
    return [str(a) for a in probe["exec"]["command"]]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_for_kubernetes_strictly(version: str) -> None:
    assert version in kubernetes_validate.utils.all_versions()
    done = subprocess.run(  # the schemas are inside the package: no network
        [
            sys.executable,
            "-m",
            "kubernetes_validate",
            "--strict",
            "--quiet",
            "-k",
            version,
            *map(str, manifests()),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ERROR" not in done.stdout + done.stderr


def test_strict_validation_catches_a_misplaced_field() -> None:
    (beat,) = yaml_documents(K8S / "beat.yaml")
    beat["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {"exec": {"command": ["true"]}}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(beat, VERSIONS[0], strict=True)


def test_the_kustomization_lists_every_manifest_and_every_listed_file_exists() -> None:
    k = kustomization()
    assert k["namespace"] == "croqq"
    assert sorted(k["resources"]) == sorted(p.name for p in manifests())
    for gen in k["configMapGenerator"]:
        for env in gen["envs"]:
            assert (K8S / env).is_file(), env
    namespaces = [doc for doc in resources() if doc["kind"] == "Namespace"]
    assert [ns["metadata"]["name"] for ns in namespaces] == ["croqq"]


def test_secrets_come_from_git_ignored_files_that_the_user_fills_from_examples() -> None:
    generated = {gen["name"]: gen["envs"] for gen in kustomization()["secretGenerator"]}
    assert set(generated) == {"croqq-redis", "croqq-flower", "croqq-exporter"}
    for envs in generated.values():
        for env in envs:
            example = K8S / f"{env}.example"
            assert "change-me" in example.read_text(), example
            ignored = subprocess.run(["git", "check-ignore", "-q", f"k8s/{env}"], cwd=ROOT, check=False)
            assert ignored.returncode == 0, f"k8s/{env} must be git-ignored"
    assert not [doc for doc in resources() if doc["kind"] == "Secret"], (
        "no Secret manifest: no password in git"
    )


def test_every_croqq_container_runs_a_real_croqq_command_under_tini() -> None:
    commands = {}
    for name, _spec, container in croqq_containers():
        assert "command" not in container, f"{name}: keep the image's tini entrypoint, use args"
        argv = croqq_argv(container["args"])
        assert argv is not None, name
        parse_croqq(argv)
        commands[name] = argv[1]
    assert sorted(set(commands.values())) == sorted(HEALTH_ROLE)


def test_every_croqq_container_has_probes_that_run_croqq_health_for_its_role() -> None:
    for name, _spec, container in croqq_containers():
        role = HEALTH_ROLE[container["args"][1]]
        alive = ["croqq", "health", "--role", role]
        assert exec_argv(container["livenessProbe"]) == alive, name
        assert exec_argv(container["startupProbe"]) == alive, name
        assert exec_argv(container["readinessProbe"]) == [*alive, "--ready"], name
        for probe in ("livenessProbe", "startupProbe", "readinessProbe"):
            parse_croqq(exec_argv(container[probe]))
            assert container[probe]["timeoutSeconds"] >= 5  # a Python start on a busy node


def test_every_croqq_container_reaches_redis_with_the_password_from_the_secret() -> None:
    for name, _spec, container in croqq_containers():
        env = container["env"]
        names = [e["name"] for e in env]
        password = env[names.index("CROQQ_REDIS_PASSWORD")]
        assert password["valueFrom"]["secretKeyRef"] == {"name": "croqq-redis", "key": "CROQQ_REDIS_PASSWORD"}
        url = env[names.index("CROQQ_BROKER_URL")]
        assert url["value"] == "redis://:$(CROQQ_REDIS_PASSWORD)@redis:6379/0", name
        assert names.index("CROQQ_REDIS_PASSWORD") < names.index(
            "CROQQ_BROKER_URL"
        )  # $(...) sees earlier ones
        assert container["envFrom"] == [{"configMapRef": {"name": "croqq-config"}}]


def test_every_croqq_container_requests_resources_and_runs_as_a_user_on_a_read_only_root() -> None:
    config = (K8S / "config.env").read_text()
    assert f"CROQQ_RUN_DIR={RUN_DIR}" in config
    for name, spec, container in croqq_containers():
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), name
        pod, own = spec["securityContext"], container["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, name
        assert own["readOnlyRootFilesystem"] is True and own["allowPrivilegeEscalation"] is False, name
        assert own["capabilities"]["drop"] == ["ALL"], name
        empty = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts.get(RUN_DIR) in empty and mounts.get("/tmp") in empty, name  # health files, builds
        assert spec["enableServiceLinks"] is False and spec["automountServiceAccountToken"] is False, name


def test_redis_is_a_statefulset_with_a_pvc_a_password_and_a_headless_service() -> None:
    redis = workloads()["redis"]
    assert redis["kind"] == "StatefulSet" and redis["spec"]["replicas"] == 1
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    (container,) = pod_spec(redis)["containers"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in container["volumeMounts"]
    args = " ".join(container["args"])
    for setting in (
        "--appendonly yes",
        "--appendfsync always",
        "--maxmemory-policy noeviction",
        "--requirepass $(CROQQ_REDIS_PASSWORD)",
    ):
        assert setting in args
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    assert secrets == {"CROQQ_REDIS_PASSWORD": "croqq-redis", "REDISCLI_AUTH": "croqq-redis"}
    (service,) = [d for d in resources() if d["kind"] == "Service" and d["metadata"]["name"] == "redis"]
    assert service["spec"]["clusterIP"] == "None" and redis["spec"]["serviceName"] == "redis"
    assert service["spec"]["ports"][0]["port"] == 6379


def test_the_writer_is_one_statefulset_pod_with_the_results_repo_on_its_pvc() -> None:
    writer = workloads()["writer"]
    assert writer["kind"] == "StatefulSet" and writer["spec"]["replicas"] == 1
    (claim,) = writer["spec"]["volumeClaimTemplates"]
    (container,) = pod_spec(writer)["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    repo = next(e["value"] for e in container["env"] if e["name"] == "CROQQ_RESULTS_REPO")
    assert Path(repo).parent == Path(mounts[claim["metadata"]["name"]])


def test_beat_is_one_replica_replaced_by_recreate() -> None:
    beat = workloads()["beat"]
    assert beat["kind"] == "Deployment" and beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}


def test_stateless_roles_are_deployments() -> None:
    found = workloads()
    for name in ("coordinator", "build-worker", "ideate-worker", "flower", "exporter"):
        assert found[name]["kind"] == "Deployment", name
    (build,) = pod_spec(found["build-worker"])["containers"]
    assert build["image"].startswith("croqq-cuda:")


def test_gpu_workers_are_one_pod_per_gpu_placed_by_the_gpu_product_label() -> None:
    gpus = [
        w
        for w in workloads().values()
        if w["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "gpu-worker"
    ]
    assert gpus
    for workload in gpus:
        spec = pod_spec(workload)
        (container,) = spec["containers"]
        assert container["image"].startswith("croqq-cuda:")
        assert container["args"] == ["croqq", "worker", "--gpus", "all"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        product = spec["nodeSelector"]["nvidia.com/gpu.product"]
        assert re.fullmatch(r"NVIDIA-H[12]00[-A-Za-z0-9]*", product)
        assert workload["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


def assert_login_is_a_mounted_secret_file(workload: str, secret: str, variable: str) -> None:
    """The login reaches the process as a file of the Secret (``<variable>_FILE``), never as a variable."""
    spec = pod_spec(workloads()[workload])
    (container,) = spec["containers"]
    assert variable not in {e["name"] for e in container["env"]}
    path = next(e["value"] for e in container["env"] if e["name"] == f"{variable}_FILE")
    folder, name = path.rsplit("/", 1)
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
    assert mount["readOnly"] is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == secret
    assert volume["secret"]["items"] == [{"key": variable, "path": name}]
    generated = (ROOT / "k8s" / "secrets" / f"{secret.removeprefix('croqq-')}.env.example").read_text()
    assert f"{variable}=" in generated  # the key the Secret is generated with


def test_flower_has_a_service_and_its_basic_auth_from_a_secret() -> None:
    (container,) = pod_spec(workloads()["flower"])["containers"]
    assert_login_is_a_mounted_secret_file("flower", "croqq-flower", "CROQQ_FLOWER_BASIC_AUTH")
    (service,) = [d for d in resources() if d["kind"] == "Service" and d["metadata"]["name"] == "flower"]
    assert service["spec"]["ports"][0]["port"] == 5555
    assert parse_croqq(container["args"]) == {"port": 5555, "address": "0.0.0.0", "read_only": True}


def test_the_exporter_has_an_annotated_service_and_its_basic_auth_from_a_secret() -> None:
    (container,) = pod_spec(workloads()["exporter"])["containers"]
    assert_login_is_a_mounted_secret_file("exporter", "croqq-exporter", "CROQQ_EXPORTER_BASIC_AUTH")
    assert parse_croqq(container["args"]) == {"port": 9808, "address": "0.0.0.0", "log_level": "INFO"}
    (service,) = [d for d in resources() if d["kind"] == "Service" and d["metadata"]["name"] == "exporter"]
    assert service["spec"]["ports"][0]["port"] == 9808
    annotations = service["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9808",
        "prometheus.io/path": "/metrics",
    }


def test_build_workers_scale_on_the_build_queues_that_the_exporter_publishes() -> None:
    from croqq.delivery import queues
    from croqq.domain.manifest import load_manifest
    from croqq.settings import Settings

    (hpa,) = [d for d in resources() if d["kind"] == "HorizontalPodAutoscaler"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (
        "Deployment",
        "build-worker",
    ) and "build-worker" in workloads()
    (metric,) = hpa["spec"]["metrics"]  # the exporter's series (tests/unit/test_metrics.py reads it)
    assert metric["external"]["metric"]["name"] == "croqq_queue_messages"
    (match,) = metric["external"]["metric"]["selector"]["matchExpressions"]
    dsls = load_manifest(Settings().manifest).dsls  # every family's queue: none left out of the sum
    assert (match["key"], match["operator"]) == ("queue", "In")
    assert sorted(match["values"]) == sorted(map(queues.build_queue, dsls))
    replicas = workloads()["build-worker"]["spec"]["replicas"]
    assert hpa["spec"]["minReplicas"] <= replicas <= hpa["spec"]["maxReplicas"]
