"""`croqq import` then a real `croqq submit` on a local cluster: the imported shape resumes from its
imported best, its first new iteration is numbered after the imported ones, and the agent's first IDEATE
is shown the imported best and ideas (context.json, history.md, ideas.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from croqq.delivery import keys
from croqq.delivery.state import make_sid
from croqq.domain.knobs import render_source
from croqq.domain.manifest import load_manifest
from croqq.domain.shapes import Shape
from croqq.patience import wait_until
from croqq.processes.local import LocalCluster
from croqq.store.paths import RunPaths
from croqq.store.validate import validate_repo

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
GPU = "sm90_Simulated_H100_SXM"
PATHS = RunPaths(GPU, "cuda")
KEY, TREE_KEY = "f16_1024x1024x1024", "matmul_f16fp32_1024x1024x1024"
Cli = Callable[..., subprocess.CompletedProcess[str]]  # the `croqq` fixture

CAPTURE = """\
import pathlib, runpy, shutil, sys
out = pathlib.Path(%(out)r)
if not out.exists():  # the first IDEATE: keep what the agent was shown
    out.mkdir()
    for name in ("context.json", "history.md", "ideas.md", "best.cu"):
        shutil.copy(name, out / name)
sys.argv = [%(scripted)r]
runpy.run_path(%(scripted)r, run_name="__main__")
"""


def team_tree(root: Path) -> Path:
    """A CroqTile-style tree: a cuBLAS reference, two tuned kernels (the seed's source with other
    stages, its headers beside it), a compile failure and an idea log."""
    manifest = load_manifest(ROOT / "kernels" / "manifest.json")
    seed = dict(manifest.dsl("cuda").kernels["f16"].reference)
    srcs = root / "tuning/sm90_H100/cuda/srcs" / TREE_KEY
    srcs.mkdir(parents=True)
    for header in (ROOT / "kernels/cuda").glob("*.cuh"):
        shutil.copy(header, srcs / header.name)
    shape = Shape(dtype="f16", m=1024, n=1024, k=1024)
    for name, stages in (("v1", 2), ("v3", 3)):
        (srcs / f"{name}.cu").write_text(render_source(manifest, "cuda", shape, seed | {"STAGES": stages}))
    logs = root / "tuning/sm90_H100/cuda/logs" / TREE_KEY
    logs.mkdir(parents=True)
    (logs / "results.tsv").write_text(
        "iter\tkernel\ttflops\tdecision\tbottleneck\tidea_summary\n"
        "iter000\tcublas\t600.0\tBASELINE\t-\tcuBLAS reference\n"
        f"iter001\tsrcs/{TREE_KEY}/v1.cu\t310.0\tKEEP\tmemory\ttwo-stage pipeline\n"
        f"iter002\tsrcs/{TREE_KEY}/v2.cu\t0\tCOMPILE_FAIL\tptxas error\tswizzled smem epilogue\n"
        f"iter003\tsrcs/{TREE_KEY}/v3.cu\t355.5\tKEEP\tlatency\tthree-stage pipeline\n"
    )
    (logs / "idea-log.jsonl").write_text(json.dumps({"idea": "persistent kernel with stream-K"}) + "\n")
    return root


@pytest.mark.timeout(1800)
def test_an_imported_shape_resumes_on_a_cluster_after_its_imported_iterations(
    cluster_env: dict[str, str], tmp_path: Path, croqq: Cli
) -> None:
    from croqq.proposers.agent.presets import SCRIPTED

    tree = team_tree(tmp_path / "team")
    repo = Path(cluster_env["CROQQ_RESULTS_REPO"])
    done = croqq(cluster_env, "import", str(tree), "--into", str(repo), "--gpu", GPU, "--json")
    assert done.returncode == 0, done.stderr
    [report] = json.loads(done.stdout)
    assert (report["key"], report["imported_as"], report["written"]["iterations"]) == (KEY, "resumable", 3)
    seen = tmp_path / "seen"
    script = tmp_path / "capture_agent.py"
    script.write_text(CAPTURE % {"out": str(seen), "scripted": str(SCRIPTED)})
    env = cluster_env | {
        "CROQQ_PROPOSER": "agent",
        "CROQQ_AGENT": "command",
        "CROQQ_AGENT_JAIL": "none",
        "CROQQ_AGENT_COMMAND": f"{sys.executable} -I {script}",
    }
    with LocalCluster(env) as cluster:
        cluster.wait_gpus()
        sid = make_sid(GPU, "cuda", KEY)
        wait_until(
            lambda: bool(cluster.client.exists(keys.shape(sid))), 120, "the writer to register the import"
        )
        cluster.submit("f16", shape="1024x1024x1024", max_iter=5, gpu_type=GPU, dsl="cuda")  # the import's

        def first_new_stored() -> bool:
            rounds = (repo / PATHS.rounds_raw(KEY)).read_text().splitlines()
            return len(rounds) > 3

        wait_until(first_new_stored, 600, "the first iteration after the imported ones", every_s=0.5)
    rounds = [json.loads(line) for line in (repo / PATHS.rounds_raw(KEY)).read_text().splitlines()]
    assert [r["iteration"] for r in rounds[:4]] == [0, 1, 2, 3]
    assert all(r["imported"] for r in rounds[:3]) and rounds[3]["imported"] is None
    context = json.loads((seen / "context.json").read_text())
    assert context["iteration"] == 3 and context["best_iter"] == 2
    history = (seen / "history.md").read_text()
    assert "three-stage pipeline" in history and "swizzled smem epilogue" in history
    assert "two-stage pipeline" in (seen / "ideas.md").read_text()
    assert "#define STAGES 3" in (seen / "best.cu").read_text()
    assert validate_repo(repo, None) == []
