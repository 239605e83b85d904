// croqq GEMM kernel family for Hopper (sm_90a): C[M,N] (f16, row-major) = A[M,K] * B[N,K]^T, fp32 accumulate.
//
// A is row-major (K contiguous), B is "column-major" K x N, i.e. stored as N rows of K contiguous
// elements, the layout the tensor-core `mma.sync ... .row.col` instructions read. The element type is
// chosen by the including header (gemm_f16.cuh, gemm_e4m3.cuh, gemm_f16sp.cuh):
//
//   CROQQ_F16    dense f16        mma.sync.m16n8k16.f32.f16.f16.f32
//   CROQQ_E4M3   dense e4m3       mma.sync.m16n8k32.f32.e4m3.e4m3.f32
//   CROQQ_F16SP  2:4 sparse f16   mma.sp::ordered_metadata.sync.m16n8k32.f32.f16.f16.f32
//                (A compressed to M x K/2 plus 2-bit indices; see kernels/README.md for the layout)
//
// In bytes every variant moves 32 bytes of A per row per mma, so one main loop serves all three.
// Main loop: a STAGES-deep cp.async pipeline into XOR-swizzled shared memory, ldmatrix fragments,
// a WARPS_M x WARPS_N grid of warps each owning a (TILE_M/WARPS_M) x (TILE_N/WARPS_N) tile.
//
// Knobs (compile-time macros, values listed in kernels/manifest.json):
//   TILE_M TILE_N TILE_K   CTA tile (TILE_K in logical elements of K)
//   STAGES                 cp.async pipeline depth
//   WARPS_M WARPS_N        warp grid of the CTA
//   RASTER                 0: walk tiles along N within a group of M-tiles, 1: the transpose
//   SWIZZLE                tiles per raster group (L2 locality of the CTA launch order)
//   SPLIT_K                K split over CTAs (fp32 atomics into a workspace, then a conversion pass)
//   EPI_VEC                f16 elements per global store in the epilogue (4 and 8 stage through smem)
// A knob combination the hardware cannot run fails to compile with a static_assert that says why.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#if !defined(GEMM_M) || !defined(GEMM_N) || !defined(GEMM_K)
#error "define GEMM_M, GEMM_N and GEMM_K (the candidate's shape) before including a croqq kernel"
#endif
#if !defined(TILE_M) || !defined(TILE_N) || !defined(TILE_K) || !defined(STAGES) || !defined(WARPS_M) || \
    !defined(WARPS_N) || !defined(RASTER) || !defined(SWIZZLE) || !defined(SPLIT_K) || !defined(EPI_VEC)
#error "define every knob (TILE_M TILE_N TILE_K STAGES WARPS_M WARPS_N RASTER SWIZZLE SPLIT_K EPI_VEC)"
#endif

namespace croqq {

#if defined(CROQQ_F16)
using In = __half;
constexpr bool kSparse = false;
constexpr const char* kDtype = "f16";
#elif defined(CROQQ_E4M3)
using In = __nv_fp8_e4m3;
constexpr bool kSparse = false;
constexpr const char* kDtype = "e4m3";
#elif defined(CROQQ_F16SP)
using In = __half;
constexpr bool kSparse = true;
constexpr const char* kDtype = "f16sp";
#else
#error "include gemm_f16.cuh, gemm_e4m3.cuh or gemm_f16sp.cuh, not gemm_core.cuh"
#endif

constexpr int M = GEMM_M, N = GEMM_N, K = GEMM_K;
constexpr int kElemBytes = static_cast<int>(sizeof(In));
constexpr int kThreads = WARPS_M * WARPS_N * 32;
constexpr int kWarpM = TILE_M / WARPS_M;
constexpr int kWarpN = TILE_N / WARPS_N;
constexpr int kMI = kWarpM / 16;  // m16 mma tiles per warp
constexpr int kNI = kWarpN / 8;   // n8 mma tiles per warp
constexpr int kBRow = TILE_K * kElemBytes;          // bytes of one B row in one k-tile
constexpr int kARow = kSparse ? kBRow / 2 : kBRow;  // A is compressed 2:1 when sparse
constexpr int kBStep = kSparse ? 64 : 32;           // B bytes per row one mma consumes
constexpr int kKSteps = kBRow / kBStep;             // mmas along K per k-tile
constexpr int kAPitch = K * kElemBytes / (kSparse ? 2 : 1);  // global row pitches, bytes
constexpr int kBPitch = K * kElemBytes;
constexpr int kMetaPerTile = kSparse ? (TILE_K / 32) * 16 : 0;  // metadata words per m16 block, k-tile
constexpr int kMetaWords = (TILE_M / 16) * kMetaPerTile;
constexpr int kStageBytes = TILE_M * kARow + TILE_N * kBRow + kMetaWords * 4;
constexpr int kPipeBytes = STAGES * kStageBytes;
constexpr bool kSplitWorkspace = SPLIT_K > 1;  // the harness allocates the fp32 workspace
constexpr bool kStagedEpilogue = EPI_VEC > 2 && SPLIT_K == 1;
constexpr int kEpiStride = TILE_N + 8;  // halves; the pad keeps rows 16-byte aligned and spreads banks
constexpr int kEpiBytes = kStagedEpilogue ? TILE_M * kEpiStride * 2 : 0;
constexpr int kSmemBytes = kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes;
constexpr int kTilesM = (M + TILE_M - 1) / TILE_M;
constexpr int kTilesN = (N + TILE_N - 1) / TILE_N;
constexpr int kKTiles = K / TILE_K;
constexpr int kMaxSmem = 227 * 1024;

static_assert(TILE_M % (16 * WARPS_M) == 0, "TILE_M must be a multiple of 16*WARPS_M (m16 mma tiles per warp)");
static_assert(TILE_N % (16 * WARPS_N) == 0, "TILE_N must be a multiple of 16*WARPS_N (pairs of n8 mma tiles)");
static_assert(K % TILE_K == 0, "GEMM_K must be a multiple of TILE_K");
static_assert(kBRow % kBStep == 0 && kARow >= 32, "TILE_K is too small for one mma step of this dtype");
static_assert(kMI * kNI * 4 <= 256, "accumulators exceed 256 registers per thread: more warps or a smaller tile");
static_assert(kSmemBytes <= kMaxSmem, "shared memory per CTA exceeds 227 KiB: fewer STAGES or a smaller tile");
static_assert(SPLIT_K <= kKTiles, "SPLIT_K exceeds the number of k-tiles (GEMM_K / TILE_K)");
static_assert(STAGES >= 2, "STAGES must be at least 2");
static_assert(EPI_VEC == 1 || EPI_VEC == 2 || EPI_VEC == 4 || EPI_VEC == 8, "EPI_VEC must be 1, 2, 4 or 8");
static_assert(N % EPI_VEC == 0, "GEMM_N must be a multiple of EPI_VEC");
static_assert(!kSparse || K % 32 == 0, "2:4 sparse kernels need GEMM_K to be a multiple of 32");

// What one launch reads and writes (device pointers).
struct Operands {
  const void* a;         // M x K (sparse: M x K/2 compressed values)
  const void* b;         // N x K
  const uint32_t* meta;  // sparse only: M*K/32 metadata words, see kernels/README.md
  __half* c;             // M x N
  float* workspace;      // SPLIT_K > 1 only: M x N fp32
};

// ---- device helpers ------------------------------------------------------------------------------

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile with ROW_BYTES-byte rows. The chunk index
// is XORed with a row phase so the 8 rows one ldmatrix phase reads land in distinct bank groups.
template <int ROW_BYTES>
__host__ __device__ __forceinline__ int swizzled(int row, int chunk) {
  constexpr int kChunks = ROW_BYTES / 16;
  constexpr int kSpan = kChunks >= 8 ? 8 : kChunks;
  constexpr int kRowsPerPhase = kChunks >= 8 ? 1 : 8 / kChunks;
  return row * ROW_BYTES + ((chunk ^ ((row / kRowsPerPhase) % kSpan)) << 4);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N_PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N_PENDING));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                            const void* smem) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// One tensor-core step: acc (16x8 fp32) += A fragment (4 regs) x B fragment (2 regs; 4 when sparse).
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t* b, uint32_t meta) {
#if defined(CROQQ_F16SP)
  asm volatile(
      "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, 0x0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(meta));
#else
#if defined(CROQQ_F16)
#define CROQQ_MMA "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#else
#define CROQQ_MMA "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"
#endif
  (void)meta;
  asm volatile(CROQQ_MMA " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#undef CROQQ_MMA
#endif
}

// CTA launch order -> (tile_m, tile_n): groups of SWIZZLE tiles along the major axis are walked
// column by column so neighbouring CTAs share A (or B) panels in L2.
__host__ __device__ __forceinline__ void tile_coords(int pid, int& tile_m, int& tile_n) {
  constexpr int kMajor = RASTER == 0 ? kTilesM : kTilesN;
  constexpr int kMinor = RASTER == 0 ? kTilesN : kTilesM;
  constexpr int kGroupWidth = SWIZZLE * kMinor;
  const int group = pid / kGroupWidth;
  const int first = group * SWIZZLE;
  const int size = (kMajor - first) < SWIZZLE ? (kMajor - first) : SWIZZLE;
  const int in_group = pid % kGroupWidth;
  const int major = first + in_group % size;
  const int minor = in_group / size;
  tile_m = RASTER == 0 ? major : minor;
  tile_n = RASTER == 0 ? minor : major;
}

// cp.async one operand's k-tile `kt` (ROWS rows of ROW_BYTES from rows row0.. of a LIMIT-row matrix
// with PITCH-byte rows) into swizzled shared memory; rows past LIMIT are zero-filled.
template <int ROWS, int ROW_BYTES, int PITCH, int LIMIT>
__device__ __forceinline__ void load_tile(uint8_t* dst, const uint8_t* src, int row0, int kt, int tid) {
  constexpr int kChunks = ROW_BYTES / 16;
#pragma unroll
  for (int i = tid; i < ROWS * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = (LIMIT % ROWS == 0) || (row0 + r < LIMIT);
    const uint8_t* from =
        src + static_cast<size_t>(ok ? row0 + r : 0) * PITCH + static_cast<size_t>(kt) * ROW_BYTES + c * 16;
    cp_async16(dst + swizzled<ROW_BYTES>(r, c), from, ok);
  }
}

// Issue the cp.async copies of k-tile `kt` into one pipeline stage.
__device__ __forceinline__ void load_stage(uint8_t* stage, const Operands& op, int m0, int n0, int kt, int tid) {
  uint8_t* sb = stage + TILE_M * kARow;
  load_tile<TILE_M, kARow, kAPitch, M>(stage, static_cast<const uint8_t*>(op.a), m0, kt, tid);
  load_tile<TILE_N, kBRow, kBPitch, N>(sb, static_cast<const uint8_t*>(op.b), n0, kt, tid);
  if constexpr (kSparse) {
    uint32_t* sm = reinterpret_cast<uint32_t*>(sb + TILE_N * kBRow);
    constexpr int kChunksPerBlock = kSparse ? kMetaPerTile / 4 : 1;  // 4 words per 16-byte chunk
    for (int i = tid; i < (TILE_M / 16) * kChunksPerBlock; i += kThreads) {
      const int mb = i / kChunksPerBlock, c = i % kChunksPerBlock;
      // an m16 block past M reads the last block's metadata: its A rows are zero and its output is
      // discarded, but zero metadata is undefined behaviour for mma.sp (PTX ISA, sparse metadata)
      const int gmb = m0 / 16 + mb < M / 16 ? m0 / 16 + mb : M / 16 - 1;
      const uint32_t* src = op.meta + (static_cast<size_t>(gmb) * (K / 32) + kt * (TILE_K / 32)) * 16 + c * 4;
      cp_async16(sm + mb * kMetaPerTile + c * 4, src, true);
    }
  }
}

__device__ __forceinline__ void store_pair(const Operands& op, int row, int col, float x, float y) {
  if ((M % TILE_M != 0 && row >= M) || (N % TILE_N != 0 && col >= N)) return;
  const size_t at = static_cast<size_t>(row) * N + col;
  if constexpr (SPLIT_K > 1) {
    atomicAdd(op.workspace + at, x);
    atomicAdd(op.workspace + at + 1, y);
  } else if constexpr (EPI_VEC == 1) {
    op.c[at] = __float2half_rn(x);
    op.c[at + 1] = __float2half_rn(y);
  } else {
    *reinterpret_cast<__half2*>(op.c + at) = __floats2half2_rn(x, y);
  }
}

template <int VEC>
__device__ __forceinline__ void store_vec(__half* dst, const __half* src) {
  if constexpr (VEC == 8) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  } else if constexpr (VEC == 4) {
    *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
  } else if constexpr (VEC == 2) {
    *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src);
  } else {
    *dst = *src;
  }
}

// ---- the kernel ----------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) croqq_gemm_kernel(const Operands op) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  const int wm0 = warp_m * kWarpM, wn0 = warp_n * kWarpN;
  int tile_m, tile_n;
  tile_coords(blockIdx.x, tile_m, tile_n);
  const int m0 = tile_m * TILE_M, n0 = tile_n * TILE_N;
  // this CTA's share of the k-tiles (SPLIT_K > 1: blockIdx.y picks the slice)
  const int kt_begin = static_cast<int>(blockIdx.y) * kKTiles / SPLIT_K;
  const int kt_end = (static_cast<int>(blockIdx.y) + 1) * kKTiles / SPLIT_K;
  const int ktiles = kt_end - kt_begin;

  float acc[kMI][kNI][4];
#pragma unroll
  for (int i = 0; i < kMI; ++i)
#pragma unroll
    for (int j = 0; j < kNI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(smem + s * kStageBytes, op, m0, n0, kt_begin + s, tid);
    cp_async_commit();
  }

  for (int it = 0; it < ktiles; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // k-tile `it` is in shared memory and every warp is done with the stage refilled next
    const int next = it + STAGES - 1;
    if (next < ktiles) load_stage(smem + (next % STAGES) * kStageBytes, op, m0, n0, kt_begin + next, tid);
    cp_async_commit();

    const uint8_t* sa = smem + (it % STAGES) * kStageBytes;
    const uint8_t* sb = sa + TILE_M * kARow;
    const uint32_t* sm = reinterpret_cast<const uint32_t*>(sb + TILE_N * kBRow);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t a[kMI][4];
      uint32_t meta[kMI];
#pragma unroll
      for (int i = 0; i < kMI; ++i) {
        ldmatrix_x4(a[i][0], a[i][1], a[i][2], a[i][3],
                    sa + swizzled<kARow>(wm0 + i * 16 + (lane & 15), ks * 2 + (lane >> 4)));
        meta[i] = kSparse ? sm[((wm0 + i * 16) / 16) * kMetaPerTile + ks * 16 + (lane >> 2) * 2 + (lane & 1)] : 0u;
      }
      constexpr int kBRegs = kSparse ? 4 : 2;
      uint32_t b[kNI][kBRegs];
#pragma unroll
      for (int j = 0; j < kNI; j += (kSparse ? 1 : 2)) {
        if constexpr (kSparse) {
          ldmatrix_x4(b[j][0], b[j][1], b[j][2], b[j][3],
                      sb + swizzled<kBRow>(wn0 + j * 8 + (lane & 7), ks * 4 + (lane >> 3)));
        } else {
          ldmatrix_x4(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1],
                      sb + swizzled<kBRow>(wn0 + j * 8 + (lane & 7) + ((lane >> 4) << 3),
                                           ks * 2 + ((lane >> 3) & 1)));
        }
      }
#pragma unroll
      for (int i = 0; i < kMI; ++i)
#pragma unroll
        for (int j = 0; j < kNI; ++j) mma(acc[i][j], a[i], b[j], meta[i]);
    }
  }
  cp_async_wait<0>();

  const int g = lane >> 2, t = lane & 3;
  if constexpr (kStagedEpilogue) {
    __syncthreads();  // the pipeline buffers become the output tile
    __half* tile = reinterpret_cast<__half*>(smem);
#pragma unroll
    for (int i = 0; i < kMI; ++i)
#pragma unroll
      for (int j = 0; j < kNI; ++j) {
        const int r = wm0 + i * 16 + g, c = wn0 + j * 8 + t * 2;
        *reinterpret_cast<__half2*>(tile + r * kEpiStride + c) = __floats2half2_rn(acc[i][j][0], acc[i][j][1]);
        *reinterpret_cast<__half2*>(tile + (r + 8) * kEpiStride + c) =
            __floats2half2_rn(acc[i][j][2], acc[i][j][3]);
      }
    __syncthreads();
    constexpr int kVecPerRow = TILE_N / EPI_VEC;
    for (int v = tid; v < TILE_M * kVecPerRow; v += kThreads) {
      const int r = v / kVecPerRow, c = (v % kVecPerRow) * EPI_VEC;
      if ((M % TILE_M != 0 && m0 + r >= M) || (N % TILE_N != 0 && n0 + c >= N)) continue;
      store_vec<EPI_VEC>(op.c + static_cast<size_t>(m0 + r) * N + n0 + c, tile + r * kEpiStride + c);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kMI; ++i)
#pragma unroll
      for (int j = 0; j < kNI; ++j) {
        const int r = m0 + wm0 + i * 16 + g, c = n0 + wn0 + j * 8 + t * 2;
        store_pair(op, r, c, acc[i][j][0], acc[i][j][1]);
        store_pair(op, r + 8, c, acc[i][j][2], acc[i][j][3]);
      }
  }
}

// SPLIT_K > 1: the fp32 workspace to f16, EPI_VEC elements per thread.
__global__ void croqq_gemm_splitk_convert(const float* __restrict__ ws, __half* __restrict__ c) {
  const size_t v = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * EPI_VEC;
  if (v >= static_cast<size_t>(M) * N) return;
  alignas(16) __half out[EPI_VEC];
#pragma unroll
  for (int e = 0; e < EPI_VEC; ++e) out[e] = __float2half_rn(ws[v + e]);
  store_vec<EPI_VEC>(c + v, out);
}

// Host: one launch of the candidate on `stream` (everything it needs is in `op`).
inline cudaError_t launch(const Operands& op, cudaStream_t stream) {
  static bool configured = false;
  if (!configured) {
    const cudaError_t err =
        cudaFuncSetAttribute(croqq_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return err;
    configured = true;
  }
  if constexpr (SPLIT_K > 1) {
    const cudaError_t err = cudaMemsetAsync(op.workspace, 0, sizeof(float) * M * N, stream);
    if (err != cudaSuccess) return err;
  }
  croqq_gemm_kernel<<<dim3(kTilesM * kTilesN, SPLIT_K), kThreads, kSmemBytes, stream>>>(op);
  if constexpr (SPLIT_K > 1) {
    constexpr size_t kVecs = static_cast<size_t>(M) * N / EPI_VEC;
    croqq_gemm_splitk_convert<<<static_cast<unsigned>((kVecs + 255) / 256), 256, 0, stream>>>(op.workspace, op.c);
  }
  return cudaGetLastError();
}

}  // namespace croqq
