// croqq harness: where the metadata of its 2:4 sparse A lives, and A back with its zeros. The harness
// (harness.cuh) writes this layout; a family whose kernel reads another one (the CUTLASS family's f16sp)
// builds its own from it, outside the timed runs. Include it after the family has defined croqq::M and K.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

namespace croqq::harness {

// Where chunk `chunk` (4 logical columns) of row `row` has its nibble: word meta_index, bits from meta_shift.
__host__ __device__ inline size_t meta_index(size_t row, size_t chunk) {
  return ((row / 16) * (K / 32) + chunk / 8) * 16 + (row % 8) * 2 + (chunk % 8) / 4;
}
__host__ __device__ inline int meta_shift(size_t row, size_t chunk) {
  return static_cast<int>(((row % 16) / 8) * 16 + (chunk % 4) * 4);
}

// The compressed values and metadata back into the M x K matrix with its zeros (a family whose kernel
// reads another sparse layout builds its own from this one, outside the timed runs).
__global__ void croqq_expand_sparse(const __half* values, const uint32_t* meta, __half* dense) {
  const size_t chunks = static_cast<size_t>(M) * (K / 4);
  for (size_t c = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t row = c / (K / 4), chunk = c % (K / 4);
    const uint32_t nibble = (meta[meta_index(row, chunk)] >> meta_shift(row, chunk)) & 0xFu;
    for (int e = 0; e < 4; ++e) dense[4 * c + e] = __float2half_rn(0.f);
    dense[4 * c + (nibble & 3u)] = values[2 * c];
    dense[4 * c + (nibble >> 2)] = values[2 * c + 1];
  }
}

}  // namespace croqq::harness
