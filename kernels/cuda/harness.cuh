// croqq timing harness: the main() every croqq kernel binary links (included after gemm_core.cuh).
//
//   gemm [--atol X] [--rtol X] [--peak-tflops X] [--warmup N] [--repeats N] [--seeds N]
//        [--no-verify] [--cublas]
//
// 1. verification (unless --no-verify), for each of --seeds input seeds: fresh random inputs, the
//    output buffer poisoned (0xFFFF, a NaN), one run, then an element-wise check against a reference
//    (cuBLASLt when libcublasLt.so can be loaded, else a simple tiled kernel):
//    |c - ref| <= atol + rtol * |ref| everywhere, NaN included. Any failure: status "wrong_answer".
// 2. timing: input sets rotated over at least 2x the GPU's L2 so no run starts with warm inputs;
//    --warmup runs (and at least 200 ms of them), a 5 ms spin that lets the host queue every timed run,
//    then --repeats runs each timed with its own pair of CUDA events (the output poisoned before each,
//    outside the timed window); median, min and max.
// 3. TFLOPS = 2*M*N*K / median (dense-equivalent for 2:4 sparse). Above --peak-tflops: status "invalid".
//
// --cublas times cuBLASLt on the same shape instead of the candidate (dense f16 for the sparse family).
// Prints one JSON line on stdout (the contract kernels/README.md describes); exit 0 unless CUDA failed.
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sparse_layout.cuh"

namespace croqq::harness {

// ---- results and failures ------------------------------------------------------------------------

struct Result {
  std::string status = "ok", reference = "none", detail, gpu;
  bool verified = false;
  double max_abs_err = 0, max_rel_err = 0, median_ms = 0, min_ms = 0, max_ms = 0, tflops = 0;
  int repeats = 0, seeds = 0, input_sets = 0;
  bool cublas = false;
};

inline std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) continue;
    out += ch;
  }
  return out;
}

// JSON has no inf or nan: a non-finite error (an unwritten, still poisoned element) prints as 1e308.
inline double finite(double x) { return std::isfinite(x) ? x : 1e308; }

inline void print(const Result& r) {
  std::printf(
      "{\"kernel\":\"%s\",\"dtype\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"status\":\"%s\",\"verified\":%s,"
      "\"reference\":\"%s\",\"max_abs_err\":%.6g,\"max_rel_err\":%.6g,\"median_ms\":%.6f,\"min_ms\":%.6f,"
      "\"max_ms\":%.6f,\"repeats\":%d,\"seeds\":%d,\"input_sets\":%d,\"tflops\":%.3f,\"gpu\":\"%s\","
      "\"detail\":\"%s\"}\n",
      r.cublas ? "cublas" : "candidate", kDtype, M, N, K, r.status.c_str(), r.verified ? "true" : "false",
      r.reference.c_str(), finite(r.max_abs_err), finite(r.max_rel_err), r.median_ms, r.min_ms, r.max_ms, r.repeats, r.seeds,
      r.input_sets, r.tflops, json_escape(r.gpu).c_str(), json_escape(r.detail).c_str());
  std::fflush(stdout);
}

[[noreturn]] inline void fail_cuda(Result r, const char* what, cudaError_t err) {
  r.status = "error";
  r.detail = std::string(what) + ": " + cudaGetErrorString(err);
  print(r);
  std::exit(1);
}

#define CROQQ_CHECK(res, call)                       \
  do {                                               \
    const cudaError_t croqq_err_ = (call);           \
    if (croqq_err_ != cudaSuccess) fail_cuda((res), #call, croqq_err_); \
  } while (0)

// ---- inputs --------------------------------------------------------------------------------------

__host__ __device__ inline uint32_t mix(uint32_t seed, uint64_t i) {
  uint64_t x = (static_cast<uint64_t>(seed) << 32) ^ i;
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((x ^ (x >> 31)) & 0xFFFFFFFFu);
}

__device__ inline float uniform(uint32_t seed, uint64_t i) {  // in [-1, 1)
  return static_cast<float>(mix(seed, i) >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

__device__ inline In to_in(float x) {
#if defined(CROQQ_E4M3)
  return In(2.0f * x);  // e4m3 values in [-2, 2)
#else
  return __float2half_rn(x);
#endif
}

__global__ void croqq_fill_dense(In* out, size_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = to_in(uniform(seed, i));
}

// 2:4 sparse A. Each 4-wide chunk of a row keeps two elements, chosen by a hash of (seed, row, chunk).
__host__ __device__ inline int pattern(uint32_t seed, uint64_t chunk) { return mix(seed ^ 0x5bd1e995u, chunk) % 6; }
__host__ __device__ inline int kept(int pattern, int which) {  // index in the chunk of kept element `which`
  constexpr uint8_t kPairs[6][2] = {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}};
  return kPairs[pattern][which];
}

// compressed values (M x K/2) and/or the same matrix with its zeros (M x K); either may be null
__global__ void croqq_fill_sparse(__half* compressed, __half* dense, uint32_t seed) {
  const size_t chunks = static_cast<size_t>(M) * (K / 4);
  for (size_t c = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int p = pattern(seed, c);
    const __half v0 = __float2half_rn(uniform(seed, 2 * c)), v1 = __float2half_rn(uniform(seed, 2 * c + 1));
    if (compressed != nullptr) {
      compressed[2 * c] = v0;
      compressed[2 * c + 1] = v1;
    }
    if (dense != nullptr) {
      for (int e = 0; e < 4; ++e) dense[4 * c + e] = __float2half_rn(0.f);
      dense[4 * c + kept(p, 0)] = v0;
      dense[4 * c + kept(p, 1)] = v1;
    }
  }
}

// Metadata word w = ((m16 block * K/32 + k32 block) * 16 + g * 2 + h): for rows g and g+8 of the
// m16 block (bits 0-15 and 16-31), the 4 chunks of logical columns [16h, 16h+16) of the k32 block,
// 4 bits per chunk (index of the first kept element in bits 0-1, the second in bits 2-3).
__host__ __device__ inline uint32_t meta_word(uint32_t seed, size_t w) {
  const int h = w % 2, g = (w / 2) % 8;
  const size_t block = w / 16;
  const size_t kb = block % (K / 32), mb = block / (K / 32);
  uint32_t word = 0;
  for (int upper = 0; upper < 2; ++upper)
    for (int j = 0; j < 4; ++j) {
      const size_t row = mb * 16 + upper * 8 + g;
      const int p = pattern(seed, row * (K / 4) + kb * 8 + h * 4 + j);
      word |= static_cast<uint32_t>(kept(p, 0) | (kept(p, 1) << 2)) << (upper * 16 + j * 4);
    }
  return word;
}

__global__ void croqq_fill_meta(uint32_t* meta, uint32_t seed) {
  const size_t words = static_cast<size_t>(M) * K / 32;
  for (size_t w = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<size_t>(gridDim.x) * blockDim.x)
    meta[w] = meta_word(seed, w);
}

// One set of device inputs in the layout the candidate (or cuBLASLt) reads.
struct Inputs {
  void* a = nullptr;           // candidate's A (compressed when sparse), or dense A in --cublas mode
  void* b = nullptr;
  uint32_t* meta = nullptr;
  size_t a_bytes = 0, b_bytes = 0, meta_bytes = 0;
};

constexpr bool kDenseA(bool cublas) { return !kSparse || cublas; }

// The byte sizes of one input set (no buffers yet).
inline Inputs input_sizes(bool cublas) {
  Inputs in;
  in.a_bytes = static_cast<size_t>(M) * K * kElemBytes / (kDenseA(cublas) ? 1 : 2);
  in.b_bytes = static_cast<size_t>(N) * K * kElemBytes;
  in.meta_bytes = kDenseA(cublas) ? 0 : static_cast<size_t>(M) * K / 32 * 4;
  return in;
}

inline Inputs alloc_inputs(const Result& res, bool cublas) {
  Inputs in = input_sizes(cublas);
  CROQQ_CHECK(res, cudaMalloc(&in.a, in.a_bytes));
  CROQQ_CHECK(res, cudaMalloc(&in.b, in.b_bytes));
  if (in.meta_bytes) CROQQ_CHECK(res, cudaMalloc(&in.meta, in.meta_bytes));
  return in;
}

// How many input sets the timed runs rotate over: at least 2, and together at least 2x the L2, so that
// no run starts with its inputs in L2.
inline size_t rotation_sets(size_t l2_bytes, size_t set_bytes) {
  return std::max<size_t>(2, (2 * l2_bytes + set_bytes - 1) / set_bytes);
}

// A timing that no kernel can reach: faster than the GPU's peak for the dtype (or no time at all).
inline bool impossible(double median_ms, double tflops, double peak_tflops) {
  return median_ms <= 0 || (peak_tflops > 0 && tflops > peak_tflops);
}

// Fill `in` from `seed`; `dense_a` (sparse family, verification only) receives A with its zeros.
inline void fill_inputs(const Result& res, Inputs& in, uint32_t seed, __half* dense_a, bool cublas) {
  const int blocks = 1024, threads = 256;
  croqq_fill_dense<<<blocks, threads>>>(static_cast<In*>(in.b), static_cast<size_t>(N) * K, seed * 2 + 1);
  if constexpr (kSparse) {
    if (cublas) {
      croqq_fill_sparse<<<blocks, threads>>>(nullptr, static_cast<__half*>(in.a), seed * 2);
    } else {
      croqq_fill_sparse<<<blocks, threads>>>(static_cast<__half*>(in.a), dense_a, seed * 2);
      croqq_fill_meta<<<blocks, threads>>>(in.meta, seed * 2);
    }
  } else {
    croqq_fill_dense<<<blocks, threads>>>(static_cast<In*>(in.a), static_cast<size_t>(M) * K, seed * 2);
  }
  CROQQ_CHECK(res, cudaGetLastError());
}

// ---- references ----------------------------------------------------------------------------------

template <class T>
__device__ inline float as_float(T x) {
  return static_cast<float>(x);
}
template <>
__device__ inline float as_float<__half>(__half x) {
  return __half2float(x);
}

// Simple tiled reference (64x64 tile, 4x4 outputs per thread, fp32 accumulation).
template <class T>
__global__ void croqq_reference_gemm(const T* __restrict__ a, const T* __restrict__ b, __half* __restrict__ c) {
  __shared__ float as[16][64];
  __shared__ float bs[16][64];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += 16) {
    for (int i = threadIdx.x; i < 64 * 16; i += 256) {
      const int r = i / 16, kk = i % 16;
      as[kk][r] = (m0 + r < M) ? as_float(a[static_cast<size_t>(m0 + r) * K + k0 + kk]) : 0.f;
      bs[kk][r] = (n0 + r < N) ? as_float(b[static_cast<size_t>(n0 + r) * K + k0 + kk]) : 0.f;
    }
    __syncthreads();
    for (int kk = 0; kk < 16; ++kk)
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] += as[kk][ty * 4 + i] * bs[kk][tx * 4 + j];
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      const int r = m0 + ty * 4 + i, col = n0 + tx * 4 + j;
      if (r < M && col < N) c[static_cast<size_t>(r) * N + col] = __float2half_rn(acc[i][j]);
    }
}

// cuBLASLt, loaded at run time (no link-time dependency; the binary runs where it is absent).
// Declarations of the few entry points used, with the enum values of cublasLt.h / library_types.h.
class Lt {
 public:
  bool ok = false;
  std::string why;

  explicit Lt(bool wanted) {
    if (!wanted) {
      why = "not needed (--no-verify)";
      return;
    }
    // CROQQ_CUBLASLT (a path) first: on hosts where cuBLAS comes only with a Python wheel
    // (site-packages/nvidia/cu13/lib), which is not on the loader's path
    const char* chosen = std::getenv("CROQQ_CUBLASLT");
    for (const char* name : {chosen, "libcublasLt.so", "libcublasLt.so.13", "libcublasLt.so.12",
                             "/usr/local/cuda/lib64/libcublasLt.so", "/usr/local/cuda/lib64/libcublasLt.so.13",
                             "/usr/local/cuda/lib64/libcublasLt.so.12"}) {
      if (name == nullptr || *name == '\0') continue;
      lib_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib_ != nullptr) break;
    }
    if (lib_ == nullptr) {
      why = "libcublasLt.so not found (set CROQQ_CUBLASLT to its path, or add its folder to LD_LIBRARY_PATH)";
      return;
    }
    create_ = reinterpret_cast<CreateFn>(dlsym(lib_, "cublasLtCreate"));
    desc_create_ = reinterpret_cast<DescCreateFn>(dlsym(lib_, "cublasLtMatmulDescCreate"));
    desc_set_ = reinterpret_cast<SetFn>(dlsym(lib_, "cublasLtMatmulDescSetAttribute"));
    layout_create_ = reinterpret_cast<LayoutCreateFn>(dlsym(lib_, "cublasLtMatrixLayoutCreate"));
    pref_create_ = reinterpret_cast<PrefCreateFn>(dlsym(lib_, "cublasLtMatmulPreferenceCreate"));
    pref_set_ = reinterpret_cast<SetFn>(dlsym(lib_, "cublasLtMatmulPreferenceSetAttribute"));
    heuristic_ = reinterpret_cast<HeuristicFn>(dlsym(lib_, "cublasLtMatmulAlgoGetHeuristic"));
    matmul_ = reinterpret_cast<MatmulFn>(dlsym(lib_, "cublasLtMatmul"));
    if (!create_ || !desc_create_ || !desc_set_ || !layout_create_ || !pref_create_ || !pref_set_ ||
        !heuristic_ || !matmul_) {
      why = "libcublasLt.so lacks a cublasLtMatmul entry point";
      return;
    }
    ok = setup();
  }

  // C (M x N row-major, f16) = A (M x K row-major) * B (N x K row-major)^T. In column-major terms:
  // C^T (N x M) = op(B) * A with op = transpose, the "TN" layout FP8 cuBLASLt requires.
  bool run(const void* a, const void* b, __half* c, cudaStream_t stream) {
    const float one = 1.0f, zero = 0.0f;
    return matmul_(handle_, desc_, &one, b, layout_b_, a, layout_a_, &zero, c, layout_c_, c, layout_c_,
                   &heuristic_result_.algo, workspace_, kWorkspace, stream) == 0;
  }

 private:
  static constexpr int kOpN = 0, kOpT = 1, kTransA = 3, kTransB = 4, kMaxWorkspace = 1;
  static constexpr int kR16F = 2, kR32F = 0, kR8FE4M3 = 28, kCompute32F = 68;
  static constexpr size_t kWorkspace = 32u << 20;
  struct Algo {
    uint64_t data[8];
  };
  struct HeuristicResult {
    Algo algo;
    size_t workspace_size;
    int state;
    float waves;
    int reserved[4];
  };
  using CreateFn = int (*)(void**);
  using DescCreateFn = int (*)(void**, int, int);
  using SetFn = int (*)(void*, int, const void*, size_t);
  using LayoutCreateFn = int (*)(void**, int, uint64_t, uint64_t, int64_t);
  using PrefCreateFn = int (*)(void**);
  using HeuristicFn = int (*)(void*, void*, void*, void*, void*, void*, void*, int, HeuristicResult*, int*);
  using MatmulFn = int (*)(void*, void*, const void*, const void*, void*, const void*, void*, const void*,
                           const void*, void*, void*, void*, const Algo*, void*, size_t, cudaStream_t);

  bool setup() {
    const int in_type = (kSparse || kElemBytes == 2) ? kR16F : kR8FE4M3;
    const int op_t = kOpT, op_n = kOpN;
    const uint64_t ws = kWorkspace;
    void* pref = nullptr;
    int found = 0;
    if (create_(&handle_) != 0 || desc_create_(&desc_, kCompute32F, kR32F) != 0 ||
        desc_set_(desc_, kTransA, &op_t, sizeof(op_t)) != 0 || desc_set_(desc_, kTransB, &op_n, sizeof(op_n)) != 0 ||
        layout_create_(&layout_b_, in_type, K, N, K) != 0 || layout_create_(&layout_a_, in_type, K, M, K) != 0 ||
        layout_create_(&layout_c_, kR16F, N, M, N) != 0 || pref_create_(&pref) != 0 ||
        pref_set_(pref, kMaxWorkspace, &ws, sizeof(ws)) != 0 ||
        heuristic_(handle_, desc_, layout_b_, layout_a_, layout_c_, layout_c_, pref, 1, &heuristic_result_, &found) !=
            0 ||
        found == 0) {
      why = "cuBLASLt has no algorithm for this shape and dtype";
      return false;
    }
    if (cudaMalloc(&workspace_, kWorkspace) != cudaSuccess) {
      why = "no memory for the cuBLASLt workspace";
      return false;
    }
    return true;
  }

  void* lib_ = nullptr;
  void *handle_ = nullptr, *desc_ = nullptr, *layout_a_ = nullptr, *layout_b_ = nullptr, *layout_c_ = nullptr;
  void* workspace_ = nullptr;
  HeuristicResult heuristic_result_{};
  CreateFn create_ = nullptr;
  DescCreateFn desc_create_ = nullptr;
  SetFn desc_set_ = nullptr;
  LayoutCreateFn layout_create_ = nullptr;
  PrefCreateFn pref_create_ = nullptr;
  SetFn pref_set_ = nullptr;
  HeuristicFn heuristic_ = nullptr;
  MatmulFn matmul_ = nullptr;
};

// ---- verification --------------------------------------------------------------------------------

struct Errors {
  unsigned long long bad;
  unsigned int max_abs_bits, max_rel_bits;  // non-negative floats compare as integers
};

__global__ void croqq_compare(const __half* c, const __half* ref, float atol, float rtol, Errors* out) {
  const size_t count = static_cast<size_t>(M) * N;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float x = __half2float(c[i]), r = __half2float(ref[i]);
    float err = fabsf(x - r);
    if (!(err <= atol + rtol * fabsf(r))) atomicAdd(&out->bad, 1ull);
    if (isnan(err)) err = INFINITY;
    atomicMax(&out->max_abs_bits, __float_as_uint(err));
    atomicMax(&out->max_rel_bits, __float_as_uint(err / fmaxf(fabsf(r), 1e-3f)));
  }
}

// ---- timing --------------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;
constexpr double kWarmupMs = 200;                  // GPU time of warm-up at least
constexpr int kMaxWarmupRuns = 100000;
constexpr unsigned long long kSpinNs = 5000000;  // 5 ms head start for the host's launch queue

inline double elapsed_ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

__global__ void croqq_spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

// ---- main ----------------------------------------------------------------------------------------

struct Args {
  float atol = 0.05f, rtol = 0.02f, peak_tflops = 0.f;
  int warmup = 10, repeats = 50, seeds = 3;
  bool verify = true, cublas = false;
};

inline Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--no-verify") {
      args.verify = false;
    } else if (flag == "--cublas") {
      args.cublas = true;
    } else if (has_value && flag == "--atol") {
      args.atol = std::strtof(argv[++i], nullptr);
    } else if (has_value && flag == "--rtol") {
      args.rtol = std::strtof(argv[++i], nullptr);
    } else if (has_value && flag == "--peak-tflops") {
      args.peak_tflops = std::strtof(argv[++i], nullptr);
    } else if (has_value && flag == "--warmup") {
      args.warmup = std::max(0, std::atoi(argv[++i]));
    } else if (has_value && flag == "--repeats") {
      args.repeats = std::max(1, std::atoi(argv[++i]));
    } else if (has_value && flag == "--seeds") {
      args.seeds = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--atol X] [--rtol X] [--peak-tflops X] [--warmup N] [--repeats N] [--seeds N] "
                   "[--no-verify] [--cublas]\n(unknown or incomplete argument: %s)\n",
                   argv[0], flag.c_str());
      std::exit(2);
    }
  }
  return args;
}

// A family whose kernel reads operands in a layout of its own defines
// cudaError_t prepare(const Operands&, cudaStream_t): the harness calls it after each fill of an operand set,
// outside every timed run (the CUTLASS family's 2:4 sparse A). Other families define nothing.
template <class Op>
auto prepare_operands(const Op& op, cudaStream_t stream, int) -> decltype(prepare(op, stream)) {
  return prepare(op, stream);
}
template <class Op>
cudaError_t prepare_operands(const Op&, cudaStream_t, long) {
  return cudaSuccess;
}

inline int main_impl(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  Result res;
  res.cublas = args.cublas;
  cudaDeviceProp prop{};
  CROQQ_CHECK(res, cudaGetDeviceProperties(&prop, 0));
  res.gpu = prop.name;

  Lt lt(args.verify || args.cublas);  // the reference, or what --cublas times
  if (args.cublas && !lt.ok) {
    res.status = "error";
    res.detail = "--cublas: " + lt.why;
    print(res);
    return 1;
  }
  if (args.cublas && kSparse) res.detail = "dense cuBLASLt on the 2:4 matrix (cuSPARSELt is not used)";

  // input sets rotated over >= 2x L2, so each timed run reads inputs that are not in L2
  const size_t l2 = static_cast<size_t>(std::max(prop.l2CacheSize, 1 << 20));
  const Inputs sizes = input_sizes(args.cublas);
  const size_t sets = rotation_sets(l2, sizes.a_bytes + sizes.b_bytes + sizes.meta_bytes);
  std::vector<Inputs> inputs;
  for (size_t s = 0; s < sets; ++s) inputs.push_back(alloc_inputs(res, args.cublas));
  res.input_sets = static_cast<int>(sets);
  __half* c = nullptr;
  float* workspace = nullptr;
  CROQQ_CHECK(res, cudaMalloc(&c, sizeof(__half) * M * N));
  if (kSplitWorkspace) CROQQ_CHECK(res, cudaMalloc(&workspace, sizeof(float) * M * N));
  cudaStream_t stream;
  CROQQ_CHECK(res, cudaStreamCreate(&stream));

  auto run_once = [&](const Inputs& in) -> cudaError_t {
    if (args.cublas) return lt.run(in.a, in.b, c, stream) ? cudaSuccess : cudaErrorUnknown;
    return launch(Operands{in.a, in.b, in.meta, c, workspace}, stream);
  };
  auto prepare_once = [&](const Inputs& in) -> cudaError_t {  // after a fill, before any run of the set
    if (args.cublas) return cudaSuccess;
    return prepare_operands(Operands{in.a, in.b, in.meta, c, workspace}, stream, 0);
  };
  auto poison = [&]() { CROQQ_CHECK(res, cudaMemsetAsync(c, 0xFF, sizeof(__half) * M * N, stream)); };

  if (args.verify && !args.cublas) {  // cuBLASLt is the reference; it is not checked against itself
    __half *ref = nullptr, *dense_a = nullptr;
    Errors* errors = nullptr;
    CROQQ_CHECK(res, cudaMalloc(&ref, sizeof(__half) * M * N));
    CROQQ_CHECK(res, cudaMalloc(&errors, sizeof(Errors)));
    if (kSparse) CROQQ_CHECK(res, cudaMalloc(&dense_a, sizeof(__half) * M * K));
    const bool by_cublas = lt.ok;
    res.reference = by_cublas ? "cublaslt" : "simple";
    if (!by_cublas) res.detail = "reference: simple kernel (" + lt.why + ")";
    res.seeds = args.seeds;
    Errors worst{0, 0, 0};
    for (int seed = 0; seed < args.seeds; ++seed) {
      Inputs& in = inputs[0];
      fill_inputs(res, in, 1000u + seed, dense_a, false);
      CROQQ_CHECK(res, prepare_once(in));
      const void* ref_a = kSparse ? dense_a : in.a;
      poison();
      CROQQ_CHECK(res, run_once(in));
      if (by_cublas) {
        if (!lt.run(ref_a, in.b, ref, stream)) fail_cuda(res, "cuBLASLt reference", cudaErrorUnknown);
      } else {
        croqq_reference_gemm<In><<<dim3((N + 63) / 64, (M + 63) / 64), 256, 0, stream>>>(
            static_cast<const In*>(ref_a), static_cast<const In*>(in.b), ref);
      }
      CROQQ_CHECK(res, cudaMemsetAsync(errors, 0, sizeof(Errors), stream));
      croqq_compare<<<1024, 256, 0, stream>>>(c, ref, args.atol, args.rtol, errors);
      Errors got{};
      CROQQ_CHECK(res, cudaMemcpyAsync(&got, errors, sizeof(Errors), cudaMemcpyDeviceToHost, stream));
      CROQQ_CHECK(res, cudaStreamSynchronize(stream));
      worst.bad += got.bad;
      worst.max_abs_bits = std::max(worst.max_abs_bits, got.max_abs_bits);
      worst.max_rel_bits = std::max(worst.max_rel_bits, got.max_rel_bits);
    }
    float max_abs, max_rel;
    std::memcpy(&max_abs, &worst.max_abs_bits, sizeof(float));
    std::memcpy(&max_rel, &worst.max_rel_bits, sizeof(float));
    res.max_abs_err = max_abs;
    res.max_rel_err = max_rel;
    if (worst.bad > 0) {
      res.status = "wrong_answer";
      char buf[200];
      std::snprintf(buf, sizeof(buf), "%llu of %lld elements outside atol %g + rtol %g (max abs err %g)",
                    worst.bad, static_cast<long long>(M) * N * args.seeds, args.atol, args.rtol, max_abs);
      res.detail = buf;
      print(res);
      return 0;
    }
    res.verified = true;
    cudaFree(ref);
    cudaFree(errors);
    if (dense_a) cudaFree(dense_a);
  }

  for (size_t s = 0; s < sets; ++s) {
    fill_inputs(res, inputs[s], 2000u + static_cast<uint32_t>(s), nullptr, args.cublas);
    CROQQ_CHECK(res, prepare_once(inputs[s]));
  }
  // warm-up: at least --warmup runs and at least kWarmupMs of GPU time, so that the clocks have left
  // idle (an H200 idles at 345 MHz) before the first timed run, whatever the kernel's length
  int warm = 0;
  for (auto t0 = Clock::now(); warm < args.warmup || elapsed_ms(t0) < kWarmupMs; ++warm) {
    CROQQ_CHECK(res, run_once(inputs[warm % sets]));
    if (warm % 8 == 7) CROQQ_CHECK(res, cudaStreamSynchronize(stream));
    if (warm >= kMaxWarmupRuns) break;
  }
  std::vector<cudaEvent_t> starts(args.repeats), stops(args.repeats);
  for (int i = 0; i < args.repeats; ++i) {
    CROQQ_CHECK(res, cudaEventCreate(&starts[i]));
    CROQQ_CHECK(res, cudaEventCreate(&stops[i]));
  }
  // the GPU spins while the host queues every timed run, so that no timed interval holds a launch gap
  croqq_spin<<<1, 1, 0, stream>>>(kSpinNs);
  CROQQ_CHECK(res, cudaGetLastError());
  for (int i = 0; i < args.repeats; ++i) {
    poison();
    CROQQ_CHECK(res, cudaEventRecord(starts[i], stream));
    CROQQ_CHECK(res, run_once(inputs[(warm + i) % sets]));
    CROQQ_CHECK(res, cudaEventRecord(stops[i], stream));
  }
  CROQQ_CHECK(res, cudaStreamSynchronize(stream));
  std::vector<float> ms(args.repeats);
  for (int i = 0; i < args.repeats; ++i) CROQQ_CHECK(res, cudaEventElapsedTime(&ms[i], starts[i], stops[i]));
  std::sort(ms.begin(), ms.end());
  res.repeats = args.repeats;
  res.min_ms = ms.front();
  res.max_ms = ms.back();
  res.median_ms = args.repeats % 2 ? ms[args.repeats / 2] : 0.5 * (ms[args.repeats / 2 - 1] + ms[args.repeats / 2]);
  res.tflops = res.median_ms > 0 ? 2.0 * M * N * K / (res.median_ms * 1e-3) / 1e12 : 0.0;
  if (impossible(res.median_ms, res.tflops, args.peak_tflops)) {
    res.status = "invalid";
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%.1f TFLOPS exceeds the GPU's %s peak of %.1f: the timing cannot be right",
                  res.tflops, kDtype, args.peak_tflops);
    res.detail = buf;
  }
  print(res);
  return 0;
}

}  // namespace croqq::harness

#ifndef CROQQ_NO_MAIN
int main(int argc, char** argv) { return croqq::harness::main_impl(argc, argv); }
#endif
