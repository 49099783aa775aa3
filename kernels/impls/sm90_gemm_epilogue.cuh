/* impls/sm90_gemm_epilogue.cuh: the Hopper grouped GEMM's epilogue: a consumer's half tile,
 * scaled and with its bias, to C (TMA stores, or plain stores where a
 * tile is clipped), and the stream-k partial sums.
 * impls/grouped_gemm_sm90.cuh describes the whole kernel.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/sm90_gemm_schedule.cuh"

namespace gmlp {
namespace sm90 {

/* Element i of an array in one of C's dtypes (FP32, BF16, FP16) as float,
 * the dtype known at run time. The epilogue is unrolled, so whatever it
 * calls is copied into it many times: the all-dtype gmlp_num_load_float
 * (FP8 decoders and a software half conversion) made each kernel 220 KB of
 * code, and the warps of the short-reduction shapes stalled on instruction
 * fetches. */
__device__ __forceinline__ float
load_c_dtype (const void *p, int c_dtype, int64_t i)
{
  if (c_dtype == GMLP_NUM_FLOAT32)
    return to_float<GMLP_NUM_FLOAT32> (static_cast<const float *> (p)[i]);
  if (c_dtype == GMLP_NUM_BFLOAT16)
    return to_float<GMLP_NUM_BFLOAT16> (static_cast<const uint16_t *> (p)[i]);
  return to_float<GMLP_NUM_FLOAT16> (static_cast<const uint16_t *> (p)[i]);
}

/* Writes four adjacent results v (FP32) at element index of C in its dtype,
 * adding the old values first when accumulating. The epilogue calls it
 * from a loop that is not unrolled: small code keeps the instruction cache
 * warm for the main loop (an unrolled epilogue was measured much slower). */
__device__ __forceinline__ void
store_quad (void *c, int c_dtype, uint64_t index, float4 v, bool accumulate)
{
  if (c_dtype == GMLP_NUM_FLOAT32)
    {
      float4 *dst = reinterpret_cast<float4 *> (static_cast<float *> (c) + index);

      if (accumulate)
        {
          const float4 old = *dst;
          v.x += old.x;
          v.y += old.y;
          v.z += old.z;
          v.w += old.w;
        }
      *dst = v;
    }
  else
    {
      uint2 *dst = reinterpret_cast<uint2 *> (static_cast<uint16_t *> (c) + index);
      uint16_t h[4];
      float f[4] = { v.x, v.y, v.z, v.w };

      if (accumulate)
        {
          const uint2 old = *dst;
          f[0] += load_c_dtype (&old.x, c_dtype, 0);
          f[1] += load_c_dtype (&old.x, c_dtype, 1);
          f[2] += load_c_dtype (&old.y, c_dtype, 0);
          f[3] += load_c_dtype (&old.y, c_dtype, 1);
        }
      for (int i = 0; i < 4; i++)
        h[i] = c_dtype == GMLP_NUM_BFLOAT16 ? from_float<GMLP_NUM_BFLOAT16> (f[i])
                                            : from_float<GMLP_NUM_FLOAT16> (f[i]);
      *dst = make_uint2 ((uint32_t) h[0] | ((uint32_t) h[1] << 16),
                         (uint32_t) h[2] | ((uint32_t) h[3] << 16));
    }
}

/* Where result (row, col) of a 64 × 64 chunk is staged: the 8-column
 * groups of each row are permuted by the row's low bits, so that the
 * fragment stores of a warp (8 rows, same columns) and the row reads of
 * the copy-out both spread over all the banks. */
__device__ __forceinline__ int
staging_index (int row, int col)
{
  return row * kStageCols + (col ^ ((row & 7) << 3));
}

/* Synchronises the 128 threads of one consumer warpgroup (named barrier
 * 1 + half; barrier 0 is __syncthreads()). */
__device__ __forceinline__ void
consumer_sync (int half)
{
  asm volatile ("bar.sync %0, 128;" :: "r" (1 + half) : "memory");
}

/* The slot of tail tile r's part j (1 to parts - 1), this CTA's tile of
 * its bundle and this consumer's half: one slot of sums and one flag. */
template <int kOps, int kKind>
__device__ __forceinline__ uint32_t
partial_slot (uint32_t r, uint32_t j, int half)
{
  return ((r * (tail_split.parts - 1) + j - 1) * bundle_tiles<kOps, kKind> () +
          blockIdx.x % bundle_tiles<kOps, kKind> ()) * 2 + half;
}

/* Where a part leaves its sums: each thread's as float4s side by side
 * across the warpgroup (coalesced; the two CTAs hold them alike). */
template <int kBlockN>
__device__ __forceinline__ float4 *
partial_sums (const GemmParams &p, uint32_t slot)
{
  return reinterpret_cast<float4 *> (p.partials) + (uint64_t) slot * (kBlockN / 2 / 4) * 128 + threadIdx.x % 128;
}

/* A tail part past the first: its sums into its slot, and its flag
 * raised. */
template <int kOps, int kKind, int kBlockN>
__device__ __forceinline__ void
store_partial (const GemmParams &p, const float (&acc)[kBlockN / 2], uint32_t r, uint32_t j, int half)
{
  const uint32_t slot = partial_slot<kOps, kKind> (r, j, half);
  float4 *sums = partial_sums<kBlockN> (p, slot);

#pragma unroll
  for (int i = 0; i < kBlockN / 2 / 4; i++)
    __stcg (sums + i * 128, make_float4 (acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
  /* The warpgroup's stores, then the leader's fence (cumulative: it
   * orders what the barrier made it see) and the flag. */
  consumer_sync (half);
  if (threadIdx.x % 128 == 0)
    {
      __threadfence ();
      st_release_gpu (p.partial_flags + slot, 1);
    }
}

/* A tail tile's first part, its stages done: waits for each other part's
 * sums and adds them. */
template <int kOps, int kKind, int kBlockN>
__device__ __forceinline__ void
add_partials (const GemmParams &p, float (&acc)[kBlockN / 2], uint32_t r, int half)
{
  for (uint32_t j = 1; j < tail_split.parts; j++)
    {
      const uint32_t slot = partial_slot<kOps, kKind> (r, j, half);
      const float4 *sums = partial_sums<kBlockN> (p, slot);

      if (threadIdx.x % 128 == 0)
        {
          while (ld_acquire_gpu (p.partial_flags + slot) == 0)
            __nanosleep (64);
          __threadfence ();
        }
      consumer_sync (half);
#pragma unroll
      for (int i = 0; i < kBlockN / 2 / 4; i++)
        {
          const float4 v = __ldcg (sums + i * 128);

          acc[4 * i] += v.x;
          acc[4 * i + 1] += v.y;
          acc[4 * i + 2] += v.z;
          acc[4 * i + 3] += v.w;
        }
    }
}

/* The part of an output tile that one consumer computes and writes: 64
 * rows from `row` (in the group's C) and `cols` columns from `col`; its
 * sums are the first cols / 2 of the consumer's registers, in wgmma's
 * fragment layout. A tile's consumers take its two 64-row halves; a short
 * tile's (short_tile()) take its one 64-row half, half of the columns
 * each. */
struct Share
{
  int32_t row;
  int32_t col;
  int32_t cols;
};

/* Whether 64-column subtile `sub` of a share lies past the share's
 * columns or past C's: the epilogue's loops stop there (uniform over the
 * warpgroup). */
__device__ __forceinline__ bool
subtile_past (const GemmParams &p, const Share &share, int sub)
{
  return sub * 64 >= share.cols || share.col + sub * 64 >= p.out_cols;
}

/* Writes one consumer's share of an output tile: 64 columns at a time,
 * the fragments go to shared memory, then every thread copies whole rows
 * of 4 results out, so that a warp's stores are contiguous. */
template <int kKind, int kBlockN>
__device__ __forceinline__ void
write_tile (const GemmParams &p, const Tile &tile, const GroupWork &w, const Share &share,
            const float (&acc)[kBlockN / 2], float *staging, int half)
{
  const int64_t out_rows = kKind == GMLP_KERNEL_GEMM_WGRAD ? p.out_rows_fixed : w.rows;
  const int64_t row_base = share.row;
  const int thread = threadIdx.x % 128;
  const int lane = thread % 32;
  const int frag_row = (thread / 32) * 16 + lane / 4;
  const int frag_col = 2 * (lane % 4);
  const bool accumulate = w.accumulate != 0;

  if (kKind == GMLP_KERNEL_GEMM_WGRAD && tile.k_blocks == 0 && accumulate)
    return;   /* adding zero */
  if (thread == 0)
    bulk_wait_read<0> ();   /* earlier TMA stores no longer read the buffer */

#pragma unroll
  for (int chunk = 0; chunk < kBlockN / kStageCols; chunk++)
    {
      const int64_t col_base = share.col + chunk * kStageCols;

      if (chunk * kStageCols >= share.cols)
        break;   /* uniform over the warpgroup */
      consumer_sync (half);   /* the previous chunk has been copied out */
#pragma unroll
      for (int j = 0; j < kStageCols / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
          {
            const int a = 4 * (chunk * kStageCols / 8 + j) + 2 * h;

            *reinterpret_cast<float2 *> (staging + staging_index (frag_row + 8 * h, 8 * j + frag_col)) =
              make_float2 (acc[a], acc[a + 1]);
          }
      consumer_sync (half);

      if (col_base >= p.out_cols)
        continue;
      /* 16 threads per row of 64 results, 8 rows per pass. */
#pragma unroll 1
      for (int r = thread / 16; r < 64; r += 8)
        {
          const int64_t row = row_base + r;
          const int c4 = 4 * (thread % 16);
          const int64_t col = col_base + c4;
          float4 v;

          if (row >= out_rows || col >= p.out_cols)
            continue;
          v = *reinterpret_cast<const float4 *> (staging + staging_index (r, c4));
          if (kKind == GMLP_KERNEL_GEMM_FPROP && w.bias != nullptr)
            {
              v.x += load_c_dtype (w.bias, p.c_dtype, col);
              v.y += load_c_dtype (w.bias, p.c_dtype, col + 1);
              v.z += load_c_dtype (w.bias, p.c_dtype, col + 2);
              v.w += load_c_dtype (w.bias, p.c_dtype, col + 3);
            }
          store_quad (w.c, p.c_dtype, (uint64_t) row * p.out_cols + col, v, accumulate);
        }
    }
}

/* One result of the TMA epilogue: a sum, scaled (FP8) and with the bias
 * added (FPROP with a bias), each only where the instance has it. */
template <bool kScaled, bool kBias>
__device__ __forceinline__ float
epilogue_value (float sum, float scale, float bias)
{
  if constexpr (kScaled && kBias)
    return fmaf (sum, scale, bias);
  else if constexpr (kScaled)
    return sum * scale;
  else if constexpr (kBias)
    return sum + bias;
  else
    return sum;
}

/* A clipped half's round of 16-bit subtiles (write_tile_tma()), staged in
 * the slots from `round` in the 128-byte swizzled layout: its first
 * `rows` rows copied to C's rows from `c_row` by the warpgroup, 16 bytes a
 * thread, 8 threads a row. */
template <int kPerRound, int kSubtiles>
__device__ __forceinline__ void
copy_clipped (const GemmParams &p, const Share &share, const uint8_t *round, int first, int32_t rows,
              int64_t c_row, int thread)
{
  const int chunk = thread % 8;

#pragma unroll
  for (int sub = first; sub < first + kPerRound && sub < kSubtiles; sub++)
    {
      const int32_t col = share.col + sub * 64 + 8 * chunk;
      const uint8_t *slot = round + (sub - first) * 8192;

      if (subtile_past (p, share, sub))
        break;   /* uniform over the warpgroup */
#pragma unroll
      for (int r = thread / 8; r < 64; r += 16)
        if (r < rows && col < p.out_cols)
          *reinterpret_cast<uint4 *> (p.direct.c_data + (uint64_t) (c_row + r) * p.direct.c_row_bytes +
                                      (uint64_t) col * 2) =
            *reinterpret_cast<const uint4 *> (slot + r * 128 + ((chunk ^ (r % 8)) * 16));
    }
}

/* The TMA epilogue: the common case, and the one that overlaps the next
 * tile's products. Each consumer writes its share (Share) in rounds: the
 * fragments of a round's 64-column subtiles, bias added and rounded to C's
 * dtype (by the hardware, to nearest even), go into 8 KiB slots of its
 * buffer in the 128-byte swizzled layout of C's tensor map; then one
 * thread hands them to the copy engine, which stores them (or adds them
 * into an FP32 C) and clips what lies outside the group's matrix. A round
 * costs two barriers and a fence, whatever it holds. Where the buffer
 * (kBufferBytes) holds the whole share, it is one round, which the last
 * round's stores (a tile ago) have long since read, and fewer barriers
 * than a round a subtile: the wide FP8 tiles. Where it does not, a round is
 * a subtile, and the rounds take the buffer's slots in turn (rounds counts
 * them, across tiles), each once the store that last read it has: the
 * warpgroup goes on while the stores drain. An FP32 subtile takes two
 * slots (two boxes of 32 columns). On the direct schedule a half that
 * reaches past its group's rows (the map's rows go on into the next
 * group's) is staged the same way, and the warpgroup copies its rows in
 * the group out (copy_clipped()): write_tile() there put the direct
 * schedule well behind the plan's on splits where many tiles end a group
 * (qwen3-fc1 skewed), which this mostly closes. Returns false, having
 * written nothing, for a 16-bit C that is accumulated into, and for such
 * a half of an FP32 C: write_tile() does those. C's dtype is a template
 * argument: the unrolled code of the dtype that runs
 * is then contiguous, not interleaved with that of the others. So are
 * whether a bias is added (kBias: without it, the bias loads' addresses,
 * bounds and zeros ran predicated off, half the epilogue's instructions)
 * and whether the sums are scaled (kScaled: FP8, by `scale`, in one FFMA
 * with the bias). 16-bit fragments go in by stmatrix, four 8 × 8 matrices an
 * instruction. */
template <int kKind, int kCDtype, int kBlockN, uint32_t kBufferBytes, bool kBias, bool kScaled>
__device__ __forceinline__ bool
write_tile_tma (const GemmParams &p, const Tile &tile, const GroupWork &w, const Share &share,
                const float (&acc)[kBlockN / 2], float scale, uint8_t *slots, uint32_t &rounds, int half,
                bool direct)
{
  constexpr bool fp32 = kCDtype == GMLP_NUM_FLOAT32;
  constexpr int kSubtiles = kBlockN / 64;
  constexpr uint32_t kSubtileBytes = fp32 ? 16384 : 8192;
  constexpr int kSlots = (int) (kBufferBytes / kSubtileBytes);
  constexpr int kPerRound = kSlots >= kSubtiles ? kSubtiles : 1;
  constexpr int kTurns = kSlots / kPerRound;   /* rounds the buffer holds */
  const bool accumulate = w.accumulate != 0;
  const int thread = threadIdx.x % 128;
  const int lane = thread % 32;
  const int frag_row = (thread / 32) * 16 + lane / 4;
  const int t = lane % 4;
  const TensorMap *map_c = direct ? &p.direct.c : p.maps + kMapsPerGroup * (uint64_t) tile.group + 2;
  const int32_t out_row = (int32_t) ((direct ? tile.row_base : 0) + share.row);
  const uint32_t slots_address = smem_address (slots);
  /* FP32: rows r and r + 8 of this thread's fragments share r % 8, the
   * swizzle's row: in 16-byte chunk c of a 128-byte row, c ^ (r % 8) is
   * stored. 16-bit (stmatrix): lanes 8 i ... 8 i + 7 give the rows of
   * matrix i, rows 8 (i % 2) + l % 8 of the warp's 16 in column chunk
   * 2 jp + i / 2. */
  const uint32_t swizzle = (uint32_t) frag_row % 8;
  const uint32_t matrix_row = (uint32_t) ((thread / 32) * 16 + 8 * ((lane / 8) % 2) + lane % 8);
  const uint32_t matrix_chunk = (uint32_t) (lane / 16);

  /* The direct schedule's map of C runs on into the next group's rows:
   * a half that reaches past its group's end is clipped, its rows in the
   * group copied out by the warpgroup instead of the copy engine. */
  const int32_t group_rows = direct ? tile.rows - share.row : 64;
  const bool clipped = group_rows < 64;

  static_assert (kSlots >= 1, "a consumer's buffer holds a subtile");
  if (accumulate && !fp32)
    return false;
  if (clipped && fp32)
    return false;
  if (group_rows <= 0)
    return true;   /* none of the group's rows */
  if (kKind == GMLP_KERNEL_GEMM_WGRAD && tile.k_blocks == 0 && accumulate)
    return true;   /* adding zero */

#pragma unroll
  for (int first = 0; first < kSubtiles; first += kPerRound)
    {
      if (subtile_past (p, share, first))
        break;   /* uniform over the warpgroup */
      /* Counted here, past the break: only a round of stores turns the slots. */
      const uint32_t turn = (rounds++ % kTurns) * kPerRound * kSubtileBytes;
      /* The turn's slots have been read by their last stores (the other
       * turns' may still be running). */
      if (thread == 0)
        bulk_wait_read<kTurns - 1> ();
      consumer_sync (half);

#pragma unroll
      for (int sub = first; sub < first + kPerRound && sub < kSubtiles; sub++)
        {
          const int32_t col0 = share.col + sub * 64;
          const uint32_t slot = slots_address + turn + (uint32_t) (sub - first) * kSubtileBytes;

          if (subtile_past (p, share, sub))
            break;   /* uniform over the warpgroup */
#pragma unroll
          for (int jp = 0; jp < 4; jp++)
            {
              uint32_t packed[4];

#pragma unroll
              for (int jo = 0; jo < 2; jo++)
                {
                  const int jj = 2 * jp + jo;
                  const int j = sub * 8 + jj;
                  const int64_t col = col0 + 8 * jj + 2 * t;
                  float b0 = 0.0f, b1 = 0.0f;

                  if (kBias && col < p.out_cols)
                    {
                      const StorageType<kCDtype> *bias = static_cast<const StorageType<kCDtype> *> (w.bias);

                      b0 = to_float<kCDtype> (bias[col]);
                      b1 = to_float<kCDtype> (bias[col + 1]);
                    }
#pragma unroll
                  for (int h = 0; h < 2; h++)
                    {
                      const int r = frag_row + 8 * h;
                      const float v0 = epilogue_value<kScaled, kBias> (acc[4 * j + 2 * h], scale, b0);
                      const float v1 = epilogue_value<kScaled, kBias> (acc[4 * j + 2 * h + 1], scale, b1);

                      if (fp32)
                        {
                          /* Box jj / 4 of 32 columns; 16-byte chunk 2 (jj % 4) + t / 2. */
                          const uint32_t chunk = 2 * (jj % 4) + t / 2;
                          sts_f32x2 (slot + (jj / 4) * 8192 + r * 128 + ((chunk ^ swizzle) * 16) + 8 * (t % 2),
                                     v0, v1);
                        }
                      else if (kCDtype == GMLP_NUM_BFLOAT16)
                        {
                          const __nv_bfloat162 v = __floats2bfloat162_rn (v0, v1);
                          packed[2 * jo + h] = *reinterpret_cast<const uint32_t *> (&v);
                        }
                      else
                        {
                          const __half2 v = __floats2half2_rn (v0, v1);
                          packed[2 * jo + h] = *reinterpret_cast<const uint32_t *> (&v);
                        }
                    }
                }
              if (!fp32)
                stmatrix_x4 (slot + matrix_row * 128 + (((2 * jp + matrix_chunk) ^ (matrix_row % 8)) * 16),
                             packed[0], packed[1], packed[2], packed[3]);
            }
        }
      fence_async_shared ();
      consumer_sync (half);
      if (clipped)
        copy_clipped<kPerRound, kSubtiles> (p, share, slots + turn, first, group_rows, tile.row_base + share.row,
                                            thread);
      if (thread == 0)
        {
#pragma unroll
          for (int sub = first; sub < first + kPerRound && sub < kSubtiles; sub++)
            {
              const int32_t col0 = share.col + sub * 64;
              uint8_t *slot = slots + turn + (sub - first) * kSubtileBytes;

              if (clipped || subtile_past (p, share, sub))
                break;
              if (fp32 && accumulate)
                {
                  tma_store_2d<true> (map_c, slot, col0, out_row);
                  tma_store_2d<true> (map_c, slot + 8192, col0 + 32, out_row);
                }
              else if (fp32)
                {
                  tma_store_2d<false> (map_c, slot, col0, out_row);
                  tma_store_2d<false> (map_c, slot + 8192, col0 + 32, out_row);
                }
              else
                tma_store_2d<false> (map_c, slot, col0, out_row);
            }
          /* A group a round, empty where clipped: the turns' waits count them. */
          bulk_commit ();
        }
    }
  return true;
}

/* write_tile_tma() with the bias or without it (a run-time choice, made
 * once a tile). */
template <int kKind, int kCDtype, int kBlockN, uint32_t kBufferBytes, bool kScaled>
__device__ __forceinline__ bool
write_tile_tma_with (bool bias, const GemmParams &p, const Tile &tile, const GroupWork &w, const Share &share,
                     const float (&acc)[kBlockN / 2], float scale, uint8_t *slots, uint32_t &rounds, int half,
                     bool direct)
{
  if (bias)
    return write_tile_tma<kKind, kCDtype, kBlockN, kBufferBytes, true, kScaled> (p, tile, w, share, acc, scale,
                                                                                 slots, rounds, half, direct);
  return write_tile_tma<kKind, kCDtype, kBlockN, kBufferBytes, false, kScaled> (p, tile, w, share, acc, scale,
                                                                                slots, rounds, half, direct);
}

}  // namespace sm90
}  // namespace gmlp
