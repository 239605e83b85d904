"""The static checks on an agent's candidate: the kernel family passes (as croqq seeds it, and flattened
into one file), each rule catches a minimal offender at the right line, comments and strings do not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from croqq.domain.source import HeaderResolver
from croqq.proposers.agent.checks import CheckFailed, Finding, check_bytes, check_size, check_source

ROOT = Path(__file__).resolve().parents[2]
CUDA_DIR = ROOT / "kernels" / "cuda"
RESOLVER = HeaderResolver((CUDA_DIR,))
DTYPES = ("f16", "e4m3", "f16sp")
FLAG = {"f16": "CROQQ_F16", "e4m3": "CROQQ_E4M3", "f16sp": "CROQQ_F16SP"}


def knob_lines(dtype: str) -> str:
    manifest = json.loads((ROOT / "kernels" / "manifest.json").read_text(encoding="utf-8"))
    knobs = manifest["dsls"]["cuda"]["kernels"][dtype]["reference"]
    lines = ["#define GEMM_M 4096", "#define GEMM_N 8192", "#define GEMM_K 4096"]
    return "\n".join(lines + [f"#define {name} {value}" for name, value in knobs.items()]) + "\n"


def reference(dtype: str) -> str:
    return knob_lines(dtype) + f'#include "gemm_{dtype}.cuh"\n'


def flattened(dtype: str) -> str:
    core = (CUDA_DIR / "gemm_core.cuh").read_text(encoding="utf-8")
    return knob_lines(dtype) + f"#define {FLAG[dtype]} 1\n{core}\n" + '#include "harness.cuh"\n'


def findings(body: str) -> list[Finding]:
    return check_source(reference("f16") + body, RESOLVER)


PREFIX_LINES = reference("f16").count("\n")


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_kernel_family_passes(dtype: str) -> None:
    assert check_source(reference(dtype), RESOLVER) == []
    assert check_source(flattened(dtype), RESOLVER) == []
    # the workspace's read-only copies under include/ name the same headers
    assert check_source(reference(dtype).replace('"gemm_', '"include/gemm_'), RESOLVER) == []
    # every knob value of the manifest (split-K's workspace memset included) is legitimate
    assert check_source(flattened(dtype).replace("#define SPLIT_K 1", "#define SPLIT_K 4"), RESOLVER) == []


KERNEL = "__global__ void k(float* out) {{\n  {}\n}}\n"  # line 2 of the body is the offending statement


@pytest.mark.parametrize(
    ("rule", "body", "line"),
    [
        ("host-timing", "float ms;\ncudaEventElapsedTime(&ms, a, b);\n", 2),
        ("host-timing", "#include <cstdio>\nauto t0 = std::chrono::steady_clock::now();\n", 2),
        ("host-timing", KERNEL.format("long long t = clock64(); out[0] = t;"), 2),
        (
            "host-timing",
            KERNEL.format('long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));'),
            2,
        ),
        ("harness-call", "\nint run() { return croqq::harness::main_impl(0, nullptr); }\n", 2),
        ("main", "\nint main(int argc, char** argv) { return 0; }\n", 2),
        ("reference-read", KERNEL.format("croqq_reference_gemm<__half><<<1, 1>>>(a, b, c);"), 2),
        ("reference-read", '\nvoid* lib = dlopen("libcublasLt.so", 2);\n', 2),
        ("reference-read", "\n#include <cutlass/util/reference/device/gemm.h>\n", 2),
        ("reference-read", "\ncutlass::reference::device::Gemm<A, B, C, float, float> ref;\n", 2),
        (
            "reference-read",
            "\nusing namespace cutlass;\nreference::host::Gemm<A, B, C, float, float> g;\n",
            3,
        ),
        ("reference-read", "\ncutlass::library::Handle handle;\n", 2),
        ("device-reset", "\nvoid reset() { cudaDeviceReset(); }\n", 2),
        ("foreign-memory", "\nvoid grab() { void* p; cudaMalloc(&p, 1 << 20); }\n", 2),
        ("foreign-memory", "\n__device__ int counter;\n", 2),
        ("foreign-memory", "\n__device__ float buf[1024];\n", 2),
        ("foreign-memory", KERNEL.format("*reinterpret_cast<float*>(0x1000) = 1.f;"), 2),
        ("foreign-memory", KERNEL.format("*(float*)12345 = 1.f;"), 2),
        ("foreign-memory", "\nvoid wipe(float* p) { cudaMemsetAsync(p, 0, 4); }\n", 2),
        ("absolute-include", '\n#include "/etc/passwd"\n', 2),
        ("escaping-include", '\n#include "../../croqq/settings.py"\n', 2),
        ("escaping-include", "\n#include <../../etc/passwd>\n", 2),
        ("unknown-include", '\n#include "nothere.cuh"\n', 2),
        ("unknown-include", "\n#define MACRO <cstdio>\n#include MACRO\n", 3),
    ],
)
def test_each_rule_catches_its_offender(rule: str, body: str, line: int) -> None:
    found = findings(body)
    assert found, body
    assert {f.rule for f in found} == {rule}, found
    assert found[0].line == PREFIX_LINES + line
    for f in found:
        assert "\n" not in f.message
        assert f.message.startswith(f"line {f.line}: ")


def test_messages_say_what_and_how() -> None:
    [timing] = findings("\ncudaEventElapsedTime(&ms, a, b);\n")
    assert "host-side timing (cudaEventElapsedTime)" in timing.message
    assert "the harness times the kernel" in timing.message
    [clock] = findings(KERNEL.format("long long t = clock64(); out[0] = t;"))
    assert "a clock read (clock64) is not allowed, in a kernel or on the host" in clock.message
    assert "host-side" not in clock.message  # it is read on the device
    [ptx] = findings(KERNEL.format('long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));'))
    assert "a clock read (%%globaltimer)" in ptx.message
    [gemm] = findings("\ncutlass::reference::device::Gemm<A, B, C, float, float> ref;\n")
    assert "a GEMM that is not the candidate's own (cutlass::reference)" in gemm.message
    [unknown] = findings('\n#include "nothere.cuh"\n')
    assert "gemm_f16.cuh" in unknown.message


def test_comments_and_strings_do_not_trigger() -> None:
    body = (
        "// cudaEventRecord would time it; the harness does\n"
        '/* std::chrono, cudaMalloc, int main(\n   #include "/etc/passwd" */\n'
        'static const char* kNote = "clock() and cudaDeviceReset";\n'
        "__device__ __forceinline__ int twice(int x) { return 2 * x; }\n"
        "__constant__ float kTable[4] = {1, 2, 3, 4};\n"
        "int my_clock_fn(int walltime);\n"
    )
    assert findings(body) == []


def test_check_size_refuses_without_reading() -> None:
    with pytest.raises(CheckFailed, match="50000000 bytes") as err:
        check_size(50_000_000, 1 << 20)
    assert err.value.rule == "size"
    check_size(1 << 20, 1 << 20)


def test_check_bytes() -> None:
    assert check_bytes(reference("f16").encode(), 1 << 20) == reference("f16")
    # size is checked before decoding: an over-size file that is not UTF-8 either is refused for its size
    with pytest.raises(CheckFailed) as err:
        check_bytes(b"\xff" * 2048, 1024)
    assert err.value.rule == "size"
    for data in (b"int x = 1;\n\xff\xfe\n", b"int x;\x00\n"):
        with pytest.raises(CheckFailed) as err:
            check_bytes(data, 1024)
        assert err.value.rule == "encoding"
        assert "\n" not in str(err.value)
