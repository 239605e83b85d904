// croqq CUTLASS 3.x GEMM for Hopper (sm_90a): C[M,N] (f16, row-major) = A[M,K] * B[N,K]^T, fp32 accumulate,
// the same problem and operand layouts as kernels/cuda (A and B both K-major), timed by the same harness.
// f16sp: A is 2:4 structured-sparse, multiplied by CUTLASS's sm90 sparse GEMM (sparse WGMMA; A in CUTLASS's
// compressed layout with its metadata, converted from the harness's once per fill by cutlass_run.cuh).
//
// The kernel is CUTLASS's sm90 warp-specialized GEMM (TMA loads into an mbarrier pipeline, WGMMA, a TMA
// epilogue), assembled by the collective builders from the knob macros below. The element type is chosen
// by the including header (cutlass_f16.cuh: f16 x f16; cutlass_e4m3.cuh: e4m3 x e4m3 with FP8 schedules;
// cutlass_f16sp.cuh: 2:4 sparse f16 x f16).
// This file is the kernel, what a structural edit changes (the epilogue's tile or fusion, the tile
// scheduler, the mainloop schedule): it ends with the type croqq::sm90::Gemm. cutlass_run.cuh launches that type under the harness.
//
// Knobs (compile-time macros; a candidate translation unit defines every one, then includes this family):
//   TILE_M TILE_N TILE_K  CTA tile (TILE_M 64 or a multiple of 64; cooperative schedules need TILE_M >= 128)
//   CLUSTER_M CLUSTER_N   thread-block cluster (TMA multicast of B along M, of A along N); product <= 8
//   STAGES                mainloop pipeline depth; 0: as many as shared memory holds after the epilogue
//   SCHEDULE              0: cooperative (two consumer warpgroups share a tile), 1: ping-pong (one tile each)
//   EPILOGUE              0: TMA store through shared memory (the schedule's own), 1: direct stores from the
//                         accumulators (NoSmemWarpSpecialized: no staging, its shared memory goes to stages)
//   FAST_ACCUM            e4m3 only: 1 accumulates in the tensor core's fast (lower-precision) mode
//   SCHEDULER             0: persistent data-parallel, 1: stream-K (SPLITS > 1: split-K over SPLITS)
//   RASTER                0: CUTLASS's heuristic, 1: along M, 2: along N
//   SWIZZLE               1, 2, 4 or 8: CTAs that walk neighbouring tiles together (L2 reuse)
//   SPLITS                stream-K scheduler only: K split this many ways (1: stream-K's own decomposition)
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

// CUTLASS's headers are toolchain headers (angle brackets): they come from the installed nvidia-cutlass
// package (the manifest's build.packages), are never copied into a candidate, and its version is part of
// the candidate's content hash.
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/transform/device/transform_universal_adapter.hpp>
#include <cutlass/transform/kernel/sparse_gemm_compressor.hpp>
#include <cutlass/util/packed_stride.hpp>

#if !defined(GEMM_M) || !defined(GEMM_N) || !defined(GEMM_K)
#error "define GEMM_M, GEMM_N and GEMM_K (the candidate's shape) before including a croqq kernel"
#endif
#if !defined(TILE_M) || !defined(TILE_N) || !defined(TILE_K) || !defined(CLUSTER_M) || !defined(CLUSTER_N) || \
    !defined(STAGES) || !defined(SCHEDULE) || !defined(EPILOGUE) || !defined(FAST_ACCUM) || !defined(SCHEDULER) || \
    !defined(RASTER) || !defined(SWIZZLE) || !defined(SPLITS)
#error "define every knob (TILE_M TILE_N TILE_K CLUSTER_M CLUSTER_N STAGES SCHEDULE EPILOGUE FAST_ACCUM SCHEDULER RASTER SWIZZLE SPLITS)"
#endif

namespace croqq {

#if defined(CROQQ_F16) || defined(CROQQ_F16SP)
using In = __half;
using Element = cutlass::half_t;
#if defined(CROQQ_F16SP)
constexpr const char* kDtype = "f16sp";
constexpr bool kSparse = true;  // A is 2:4 sparse
#else
constexpr const char* kDtype = "f16";
constexpr bool kSparse = false;
#endif
constexpr bool kFp8 = false;
#elif defined(CROQQ_E4M3)
using In = __nv_fp8_e4m3;
using Element = cutlass::float_e4m3_t;
constexpr const char* kDtype = "e4m3";
constexpr bool kFp8 = true;
constexpr bool kSparse = false;
#else
#error "include cutlass_f16.cuh, cutlass_f16sp.cuh or cutlass_e4m3.cuh, not cutlass_sm90.cuh"
#endif

constexpr bool kSplitWorkspace = false;  // the harness allocates no fp32 workspace for this family
constexpr int M = GEMM_M, N = GEMM_N, K = GEMM_K;
constexpr int kElemBytes = static_cast<int>(sizeof(In));

static_assert(SCHEDULE == 0 || SCHEDULE == 1, "SCHEDULE must be 0 (cooperative) or 1 (ping-pong)");
static_assert(EPILOGUE == 0 || EPILOGUE == 1, "EPILOGUE must be 0 (TMA store) or 1 (direct stores, no smem)");
static_assert(SCHEDULE == 1 || TILE_M % 128 == 0, "the cooperative schedule needs TILE_M a multiple of 128");
static_assert(TILE_M % 64 == 0, "TILE_M must be a multiple of 64 (one warpgroup's WGMMA rows)");
static_assert(TILE_K * kElemBytes % 128 == 0, "TILE_K must span a multiple of 128 bytes (the 128B swizzle)");
static_assert(CLUSTER_M * CLUSTER_N <= 8, "a portable thread-block cluster holds at most 8 CTAs");
static_assert(!FAST_ACCUM || kFp8, "FAST_ACCUM applies to e4m3 only");
static_assert(SCHEDULER == 0 || SCHEDULER == 1, "SCHEDULER must be 0 (persistent) or 1 (stream-K)");
static_assert(SPLITS == 1 || SCHEDULER == 1, "SPLITS > 1 needs the stream-K scheduler (SCHEDULER 1)");
static_assert(SWIZZLE == 1 || SWIZZLE == 2 || SWIZZLE == 4 || SWIZZLE == 8, "SWIZZLE must be 1, 2, 4 or 8");
static_assert(K % TILE_K == 0, "GEMM_K must be a multiple of TILE_K");

namespace sm90 {
using namespace cute;

using LayoutA = cutlass::layout::RowMajor;     // M x K, K contiguous
using LayoutB = cutlass::layout::ColumnMajor;  // K x N stored as N rows of K
using LayoutC = cutlass::layout::RowMajor;
using Out = cutlass::half_t;
constexpr int kAlignIn = 16 / sizeof(Element), kAlignOut = 8;

using Tile = Shape<Int<TILE_M>, Int<TILE_N>, Int<TILE_K>>;
using Cluster = Shape<Int<CLUSTER_M>, Int<CLUSTER_N>, _1>;

using CoopMain = std::conditional_t<FAST_ACCUM, cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                                    cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
using PingMain = std::conditional_t<FAST_ACCUM, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum,
                                    cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
using MainSchedule = std::conditional_t<SCHEDULE == 0, CoopMain, PingMain>;
using TmaEpilogue = std::conditional_t<SCHEDULE == 0, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                       cutlass::epilogue::TmaWarpSpecialized>;
using EpiSchedule = std::conditional_t<EPILOGUE == 0, TmaEpilogue, cutlass::epilogue::NoSmemWarpSpecialized>;
using TileScheduler = std::conditional_t<SCHEDULER == 0, cutlass::gemm::PersistentScheduler,
                                         cutlass::gemm::StreamKScheduler>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, Out, LayoutC, kAlignOut, Out, LayoutC,
    kAlignOut, EpiSchedule>::CollectiveOp;

using Stages = std::conditional_t<
    STAGES == 0,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::collective::StageCount<(STAGES > 0 ? STAGES : 2)>>;

using MainOpClass = std::conditional_t<kSparse, cutlass::arch::OpClassSparseTensorOp, cutlass::arch::OpClassTensorOp>;
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, MainOpClass, Element, LayoutA, kAlignIn, Element, LayoutB, kAlignIn,
    float, Tile, Cluster, Stages, MainSchedule>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, TileScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
using RasterOrder = cutlass::gemm::kernel::detail::RasterOrderOptions;
}  // namespace sm90

}  // namespace croqq
