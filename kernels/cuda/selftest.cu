// Host-only checks of the kernel family's index math and the harness's rules, run by the test suite where there is no GPU:
//   nvcc -arch=sm_90a -DGEMM_M=.. -DGEMM_N=.. -DGEMM_K=.. -D<every knob> -o selftest selftest.cu && ./selftest
// 1. the CTA launch order (RASTER, SWIZZLE) visits every output tile exactly once;
// 2. the shared-memory swizzle is a permutation of each row's 16-byte chunks (A and B tiles);
// 3. each 2:4 metadata word holds, for the rows and columns the PTX fragment layout assigns to the
//    thread that reads it, the indices of the elements the input generator kept;
// 4. the harness's rules: timed inputs rotate over at least 2 sets and 2x the L2; a timing faster than
//    the peak (or of no time) is refused.
#define CROQQ_NO_MAIN 1
#include <cstdio>
#include <vector>

#include "gemm_f16sp.cuh"

using namespace croqq;

static int failures = 0;
#define EXPECT(cond, ...)              \
  do {                                 \
    if (!(cond) && failures++ < 10) {  \
      std::printf("FAIL: " __VA_ARGS__); \
      std::printf("\n");               \
    }                                  \
  } while (0)

template <int ROW_BYTES>
static void check_swizzle(int rows) {
  for (int r = 0; r < rows; ++r) {
    std::vector<int> seen(ROW_BYTES / 16, 0);
    for (int c = 0; c < ROW_BYTES / 16; ++c) {
      const int off = swizzled<ROW_BYTES>(r, c) - r * ROW_BYTES;
      EXPECT(off >= 0 && off < ROW_BYTES && off % 16 == 0, "row %d chunk %d -> offset %d", r, c, off);
      if (off >= 0 && off < ROW_BYTES) seen[off / 16]++;
    }
    for (int c = 0; c < ROW_BYTES / 16; ++c) EXPECT(seen[c] == 1, "row %d: chunk slot %d used %d times", r, c, seen[c]);
  }
}

int main() {
  std::vector<int> visits(kTilesM * kTilesN, 0);
  for (int pid = 0; pid < kTilesM * kTilesN; ++pid) {
    int tm = -1, tn = -1;
    tile_coords(pid, tm, tn);
    EXPECT(tm >= 0 && tm < kTilesM && tn >= 0 && tn < kTilesN, "pid %d -> tile (%d, %d)", pid, tm, tn);
    if (tm >= 0 && tm < kTilesM && tn >= 0 && tn < kTilesN) visits[tm * kTilesN + tn]++;
  }
  for (int t = 0; t < kTilesM * kTilesN; ++t) EXPECT(visits[t] == 1, "tile %d visited %d times", t, visits[t]);

  check_swizzle<kARow>(TILE_M);
  check_swizzle<kBRow>(TILE_N);

  for (uint32_t seed : {1u, 7u}) {
    for (int row = 0; row < M; row += 7) {
      for (int chunk = 0; chunk < K / 4; ++chunk) {
        // the word the kernel hands to mma.sp for this row and k32 block: thread g*4 + h of the warp
        const int mb = row / 16, in_block = row % 16, g = in_block % 8, upper = in_block / 8;
        const int kb = chunk / 8, h = (chunk % 8) / 4, j = chunk % 4;
        const uint32_t word = harness::meta_word(seed, (static_cast<size_t>(mb) * (K / 32) + kb) * 16 + g * 2 + h);
        const int nibble = (word >> (upper * 16 + j * 4)) & 0xF;
        EXPECT(harness::meta_index(row, chunk) == (static_cast<size_t>(mb) * (K / 32) + kb) * 16 + g * 2 + h &&
                   harness::meta_shift(row, chunk) == upper * 16 + j * 4,
               "row %d chunk %d: meta_index/meta_shift disagree with the kernel's metadata index", row, chunk);
        const int p = harness::pattern(seed, static_cast<uint64_t>(row) * (K / 4) + chunk);
        const int expected = harness::kept(p, 0) | (harness::kept(p, 1) << 2);
        EXPECT(nibble == expected, "seed %u row %d chunk %d: nibble %x, expected %x", seed, row, chunk, nibble, expected);
        EXPECT((nibble & 3) < (nibble >> 2), "row %d chunk %d: indices not ascending (ordered_metadata)", row, chunk);
      }
    }
  }
  for (size_t l2 : {size_t{40} << 20, size_t{50} << 20}) {
    for (size_t set : {size_t{96} << 10, harness::input_sizes(false).a_bytes + harness::input_sizes(false).b_bytes,
                       size_t{256} << 20}) {
      const size_t sets = harness::rotation_sets(l2, set);
      EXPECT(sets >= 2 && sets * set >= 2 * l2, "L2 %zu, set %zu bytes: %zu sets", l2, set, sets);
    }
  }
  EXPECT(harness::impossible(1.0, 990.0, 989.4), "a timing above peak is accepted");
  EXPECT(harness::impossible(0.0, 0.0, 989.4), "a zero-time run is accepted");
  EXPECT(!harness::impossible(1.0, 700.0, 989.4), "a plausible timing is refused");

  std::printf(failures ? "selftest: %d failures\n" : "selftest: ok\n", failures);
  return failures ? 1 : 0;
}
