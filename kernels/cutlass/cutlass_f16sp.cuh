// croqq CUTLASS family for dtype f16sp (2:4 structured-sparse A): the kernel (cutlass_sm90.cuh, with the
// knobs), its launch with A converted to CUTLASS's compressed layout (cutlass_run.cuh) and main()
// (../cuda/harness.cuh). A candidate translation unit defines GEMM_M/N/K and every knob, then includes this header.
#pragma once
#define CROQQ_F16SP 1
#include "cutlass_sm90.cuh"
#include "cutlass_run.cuh"
#include "harness.cuh"
