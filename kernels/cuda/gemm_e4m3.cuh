// croqq reference kernel family for dtype e4m3 (see gemm_core.cuh for the knobs, harness.cuh for main()).
// A candidate translation unit defines GEMM_M/N/K and every knob, then includes this header.
#pragma once
#define CROQQ_E4M3 1
#include "gemm_core.cuh"
#include "harness.cuh"
