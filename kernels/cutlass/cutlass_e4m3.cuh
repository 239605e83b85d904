// croqq CUTLASS family for dtype e4m3: the kernel (cutlass_sm90.cuh, with the knobs), its launch
// (cutlass_run.cuh) and main() (../cuda/harness.cuh).
// A candidate translation unit defines GEMM_M/N/K and every knob, then includes this header.
#pragma once
#define CROQQ_E4M3 1
#include "cutlass_sm90.cuh"
#include "cutlass_run.cuh"
#include "harness.cuh"
