// croqq CUTLASS family for dtype f16 (see cutlass_sm90.cuh for the knobs, ../cuda/harness.cuh for main()).
// A candidate translation unit defines GEMM_M/N/K and every knob, then includes this header.
#pragma once
#define CROQQ_F16 1
#include "cutlass_sm90.cuh"
#include "harness.cuh"
