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

#include "sparse_layout.cuh"  // the harness's 2:4 layout (kernels/cuda)

namespace croqq {

struct Operands {
  const void* a;         // M x K (f16sp: M x K/2 compressed values, the harness's layout)
  const void* b;         // N x K
  const uint32_t* meta;  // f16sp only: the harness's metadata words (kernels/README.md)
  __half* c;             // M x N
  float* workspace;      // unused
};

using ProblemShape = cute::Shape<int, int, int, int>;

// ---- f16sp: the harness's 2:4 A in CUTLASS's compressed layout -------------------------------------
// The harness hands A as its own compressed values and metadata (the mma.sp layout of kernels/cuda).
// CUTLASS's sparse mainloop reads another layout, so prepare() rebuilds the M x K matrix with its zeros
// and runs CUTLASS's compressor on it, once per fill of an operand set, outside every timed run.
template <class Mainloop, bool = kSparse>
struct SparseA {  // dense dtypes: nothing to convert
  static cudaError_t prepare(const Operands&, cudaStream_t) { return cudaSuccess; }
  template <class Args>
  static cudaError_t mainloop(const Operands& op, Args& args) {
    args = {static_cast<const Element*>(op.a),
            cutlass::make_cute_packed_stride(typename Mainloop::StrideA{}, {M, K, 1}),
            static_cast<const Element*>(op.b),
            cutlass::make_cute_packed_stride(typename Mainloop::StrideB{}, {N, K, 1})};
    return cudaSuccess;
  }
};

template <class Mainloop>
struct SparseA<Mainloop, true> {
  using Config = typename Mainloop::SparseConfig;
  using LayoutATag = sm90::LayoutA;
  using StrideA = cutlass::gemm::TagToStrideA_t<LayoutATag>;
  using Utility = cutlass::transform::kernel::StructuredSparseCompressorUtility<ProblemShape, Element, LayoutATag, Config>;
  using Compressor = cutlass::transform::device::TransformUniversalAdapter<
      cutlass::transform::kernel::StructuredSparseCompressor<ProblemShape, Element, LayoutATag, Config, cutlass::arch::Sm90>>;
  struct Buffers {
    __half* dense = nullptr;
    void* values = nullptr;  // CUTLASS's compressed A
    void* meta = nullptr;    // CUTLASS's metadata (E)
  };
  static std::map<const void*, Buffers>& buffers() {
    static std::map<const void*, Buffers> by_a;  // one per operand set, keyed by the harness's A
    return by_a;
  }

  static cudaError_t prepare(const Operands& op, cudaStream_t stream) {
    const StrideA stride = cutlass::make_cute_packed_stride(StrideA{}, {M, K, 1});
    Utility sizes(ProblemShape{M, N, K, 1}, stride);
    Buffers& buf = buffers()[op.a];
    cudaError_t err = cudaSuccess;
    if (buf.dense == nullptr) {
      const size_t values = size_t(sizes.get_tensorA_m_physical()) * sizes.get_tensorA_k_physical() * sizeof(Element);
      const size_t meta = size_t(sizes.get_metadata_m_physical()) * sizes.get_metadata_k_physical();
      if ((err = cudaMalloc(&buf.dense, sizeof(__half) * M * K)) != cudaSuccess) return err;
      if ((err = cudaMalloc(&buf.values, values)) != cudaSuccess) return err;
      if ((err = cudaMalloc(&buf.meta, meta)) != cudaSuccess) return err;
    }
    harness::croqq_expand_sparse<<<1024, 256, 0, stream>>>(static_cast<const __half*>(op.a), op.meta, buf.dense);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    cutlass::KernelHardwareInfo hw;
    hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
    typename Compressor::Arguments args{{M, N, K, 1}, {buf.dense, stride, buf.values, buf.meta}, hw};
    Compressor compress;
    if (compress.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidConfiguration;
    if (Compressor::get_workspace_size(args) != 0) return cudaErrorInvalidConfiguration;  // none on sm90
    if (compress.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return cudaErrorInvalidConfiguration;
    if (compress.run(stream) != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
    return cudaGetLastError();
  }

  template <class Args>
  static cudaError_t mainloop(const Operands& op, Args& args) {
    const auto found = buffers().find(op.a);
    if (found == buffers().end()) return cudaErrorNotReady;  // the harness calls prepare() after each fill
    const ProblemShape problem{M, N, K, 1};
    args = {static_cast<const Element*>(found->second.values), Config::fill_layoutA(problem),
            static_cast<const Element*>(op.b),
            cutlass::make_cute_packed_stride(typename Mainloop::StrideB{}, {N, K, 1}),
            static_cast<const typename Mainloop::ElementE*>(found->second.meta), Config::fill_layoutE(problem)};
    return cudaSuccess;
  }
};

using Sparse = SparseA<sm90::Mainloop>;

// The harness calls this after filling an operand set (not timed).
inline cudaError_t prepare(const Operands& op, cudaStream_t stream) { return Sparse::prepare(op, stream); }

inline cudaError_t arguments(const Operands& op, sm90::Gemm::Arguments& args) {
  using G = sm90::Gemm;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
  auto* c = reinterpret_cast<sm90::Out*>(op.c);
  args = G::Arguments{cutlass::gemm::GemmUniversalMode::kGemm,
                    {M, N, K, 1},
                    {},
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
  return Sparse::mainloop(op, args.mainloop);
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
    const cudaError_t err = arguments(op, fresh->args);  // once per operand set, not per run
    if (err != cudaSuccess) return err;
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
