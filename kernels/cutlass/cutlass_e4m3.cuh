// croqq CUTLASS family for dtype e4m3 (see cutlass_sm90.cuh for the knobs, ../cuda/harness.cuh for main()).
// A candidate translation unit defines GEMM_M/N/K and every knob, then includes this header.
#pragma once
#define CROQQ_E4M3 1
#include "cutlass_sm90.cuh"
#include "harness.cuh"
