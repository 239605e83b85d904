// croqq CUTLASS family: the host side of one launch of croqq::sm90::Gemm (cutlass_sm90.cuh, or a candidate's
// own edited copy of it) under croqq's harness: the operands the harness passes, CUTLASS's arguments from
// the knob macros, its workspace, and launch(). A candidate that takes the kernel into its own file keeps
// including this header after it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace croqq {

struct Operands {
  const void* a;         // M x K
  const void* b;         // N x K
  const uint32_t* meta;  // unused (dense only)
  __half* c;             // M x N
  float* workspace;      // unused
};

inline sm90::Gemm::Arguments arguments(const Operands& op) {
  using G = sm90::Gemm;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
  auto* c = reinterpret_cast<sm90::Out*>(op.c);
  G::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                    {M, N, K, 1},
                    {static_cast<const Element*>(op.a), cutlass::make_cute_packed_stride(G::GemmKernel::StrideA{}, {M, K, 1}),
                     static_cast<const Element*>(op.b), cutlass::make_cute_packed_stride(G::GemmKernel::StrideB{}, {N, K, 1})},
                    {{1.0f, 0.0f},
                     c, cutlass::make_cute_packed_stride(G::GemmKernel::StrideC{}, {M, N, 1}),
                     c, cutlass::make_cute_packed_stride(G::GemmKernel::StrideD{}, {M, N, 1})},
                    hw};
  args.scheduler.max_swizzle_size = SWIZZLE;
  args.scheduler.raster_order = RASTER == 1   ? sm90::RasterOrder::AlongM
                                : RASTER == 2 ? sm90::RasterOrder::AlongN
                                              : sm90::RasterOrder::Heuristic;
  auto split = [](auto& scheduler) {  // generic, so that the persistent scheduler never sees the fields
    if constexpr (SCHEDULER == 1 && SPLITS > 1) {
      scheduler.splits = SPLITS;
      scheduler.decomposition_mode = decltype(scheduler.decomposition_mode)::SplitK;
    }
  };
  split(args.scheduler);
  return args;
}

// Host: one launch on `stream`. CUTLASS builds its TMA descriptors from the operand pointers, so each
// distinct operand set (the harness rotates several) is initialized once and reused.
inline cudaError_t launch(const Operands& op, cudaStream_t stream) {
  struct Prepared {
    sm90::Gemm::Arguments args;
    sm90::Gemm gemm;
    void* workspace = nullptr;
  };
  static std::map<std::tuple<const void*, const void*, const void*>, std::unique_ptr<Prepared>> prepared;
  auto& slot = prepared[{op.a, op.b, op.c}];
  if (!slot) {
    auto fresh = std::make_unique<Prepared>();
    fresh->args = arguments(op);  // once per operand set: the device query and strides are not redone
    if (fresh->gemm.can_implement(fresh->args) != cutlass::Status::kSuccess) return cudaErrorInvalidConfiguration;
    const size_t bytes = sm90::Gemm::get_workspace_size(fresh->args);
    if (bytes > 0) {
      const cudaError_t err = cudaMalloc(&fresh->workspace, bytes);
      if (err != cudaSuccess) return err;
    }
    if (fresh->gemm.initialize(fresh->args, fresh->workspace, stream) != cutlass::Status::kSuccess)
      return cudaErrorInvalidConfiguration;
    slot = std::move(fresh);
  }
  if constexpr (SCHEDULER == 1) {  // stream-K's workspace (partial tiles, flags) is reset for every run
    if (slot->gemm.initialize(slot->args, slot->workspace, stream) != cutlass::Status::kSuccess)
      return cudaErrorInvalidConfiguration;
  }
  if (slot->gemm.run(stream) != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
  return cudaGetLastError();
}

}  // namespace croqq
