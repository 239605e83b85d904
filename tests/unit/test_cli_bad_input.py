"""Bad input to the CLI: one line naming what is wrong, a non-zero exit, and nothing enqueued or written."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.output import error_line

ROOT = Path(__file__).resolve().parents[2]
Cli = Callable[..., subprocess.CompletedProcess[str]]  # the `croqq` fixture


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dtype", "fp32"], "unknown dtype 'fp32'; use --dtype f16|e4m3|f16sp|all"),
        (["--dtype", "f16", "--shape", "12x"], "shape '12x' is not MxNxK"),
        (["--dtype", "f16", "--shape", "64x64x64"], "shape 64x64x64: M=64 is below the minimum M>=128"),
        (["--dtype", "f16", "--mode", "fastest"], "unknown mode 'fastest'"),
        (["--dtype", "f16", "--gpu", "sm75_T4"], "GPU type 'sm75_T4' has no entry in the manifest"),
        (["--dtype", "f16", "--candidates", "0"], "--candidates 0: an iteration gathers 1 to 8 candidates"),
        (["--dtype", "f16", "--candidates", "9"], "--candidates 9: an iteration gathers 1 to 8 candidates"),
    ],
)
def test_bad_submit_arguments_exit_2_with_one_line_and_enqueue_nothing(
    cluster_env: dict[str, str], redis_client: redis.Redis, args: list[str], message: str, croqq: Cli
) -> None:
    result = croqq(cluster_env, "submit", *args)
    assert result.returncode == 2 and message in error_line(result.stderr)
    assert redis_client.dbsize() == 0
    assert not Path(cluster_env["CROQQ_RESULTS_REPO"]).exists()


def test_up_refuses_too_many_candidates_before_starting_anything(
    cluster_env: dict[str, str], redis_client: redis.Redis, croqq: Cli
) -> None:
    result = croqq(cluster_env, "up", "--dtype", "f16", "--candidates", "9")
    assert result.returncode == 2 and "use --candidates 1..8" in error_line(result.stderr)
    assert redis_client.dbsize() == 0
    assert not Path(cluster_env["CROQQ_RUN_DIR"], "logs").exists()


def test_manifest_with_unknown_field_is_refused_by_submit(
    cluster_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis, croqq: Cli
) -> None:
    raw = json.loads((ROOT / "kernels" / "manifest.json").read_text())
    raw["turbo"] = True
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps(raw))
    result = croqq({**cluster_env, "CROQQ_MANIFEST": str(bad)}, "submit", "--dtype", "f16")
    assert result.returncode == 2 and "manifest.json: turbo: Extra inputs are not permitted" in result.stderr
    assert redis_client.dbsize() == 0


def test_bad_setting_names_the_variable(cluster_env: dict[str, str], croqq: Cli) -> None:
    result = croqq({**cluster_env, "CROQQ_PIPELINE_DEPTH": "zero"}, "submit", "--dtype", "f16", "--dry-run")
    assert result.returncode == 2 and error_line(result.stderr).startswith(
        "croqq: error: CROQQ_PIPELINE_DEPTH:"
    )


def test_dry_run_json_lists_the_schedule_without_touching_redis(
    cluster_env: dict[str, str], redis_client: redis.Redis, croqq: Cli
) -> None:
    result = croqq(cluster_env, "submit", "--dtype", "all", "--dry-run", "--json")
    rows = json.loads(result.stdout)
    assert len(rows) == 268 and set(rows[0]) == {"key", "dtype", "m", "n", "k", "scenarios", "region", "rank"}
    assert redis_client.dbsize() == 0


def test_unreachable_redis_is_one_line(cluster_env: dict[str, str], tmp_path: Path, croqq: Cli) -> None:
    env = {**cluster_env, "CROQQ_BROKER_URL": f"unix://{tmp_path}/nothing.sock"}
    result = croqq(env, "submit", "--dtype", "f16")
    assert result.returncode == 2 and error_line(result.stderr).startswith(
        "croqq: error: cannot reach Redis at"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--knobs", "fastest"], "--knobs 'fastest': use reference or naive"),
        (["--shape", "12x"], "shape '12x' is not MxNxK"),
    ],
)
def test_bad_kernels_arguments_exit_2_with_one_line_and_build_nothing(
    tmp_path: Path, args: list[str], message: str, croqq: Cli
) -> None:
    out = tmp_path / "kernels"
    result = croqq({}, "kernels", "--out", str(out), *args)
    assert result.returncode == 2 and message in error_line(result.stderr) and not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "name the shapes to resume (croqq retry KEY...) or pass --errors, not both"),
        (["f16_1x1x1", "--errors"], "name the shapes to resume"),
        (["f16_4096x8192x8192"], "no submitted shape f16_4096x8192x8192"),
    ],
)
def test_bad_retry_arguments_exit_2_with_one_line_and_change_nothing(
    cluster_env: dict[str, str], redis_client: redis.Redis, args: list[str], message: str, croqq: Cli
) -> None:
    result = croqq(cluster_env, "retry", *args)
    assert result.returncode == 2, result.stderr
    assert message in error_line(result.stderr)
    assert redis_client.dbsize() == 0
