// croqq CUTLASS family for dtype f16: the kernel (cutlass_sm90.cuh, with the knobs), its launch
// (cutlass_run.cuh) and main() (../cuda/harness.cuh).
// A candidate translation unit defines GEMM_M/N/K and every knob, then includes this header.
#pragma once
#define CROQQ_F16 1
#include "cutlass_sm90.cuh"
#include "cutlass_run.cuh"
#include "harness.cuh"
