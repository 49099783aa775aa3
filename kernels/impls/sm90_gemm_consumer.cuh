/* impls/sm90_gemm_consumer.cuh: the Hopper grouped GEMM's consumers: wgmma over the ring's
 * stages, FP8 promotion with the scales, short tiles and idle halves.
 * impls/grouped_gemm_sm90.cuh describes the whole kernel.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/sm90_gemm_epilogue.cuh"
#include "impls/sm90_gemm_producer.cuh"

namespace gmlp {
namespace sm90 {

/* The wgmma of an instance's operands and layout, kN columns wide. */
template <int kOps, int kKind, int kN, bool kFp8 = Config<kOps>::kFp8>
struct MmaOf
{
  using Type = Wgmma<kN, Config<kOps>::kBf16, Layout<kOps, kKind>::kTransA, Layout<kOps, kKind>::kTransB>;
};

template <int kOps, int kKind, int kN>
struct MmaOf<kOps, kKind, kN, true>
{
  using Type = WgmmaFp8<kN, Config<kOps>::kAE5m2, Config<kOps>::kBE5m2>;
};

/* Short tiles: a group's last row tile, where it holds 64 rows or fewer,
 * is computed as 64 rows by both consumers, half of the columns each (on
 * the wide tiles 128 and 64: whole subtiles for the TMA epilogue; Share),
 * not as 128 rows of which one consumer's half would be thrown
 * away. Skewed routing leaves many such tails (small-e64: 344 of its 760
 * FP8 tiles). Per-tensor FP8 row-grouped products only: blockwise
 * promotion reads the scales of each consumer's rows, and in the 16-bit
 * kernels the two widths of wgmma writing one set of sums made ptxas
 * serialise every wgmma (warning C7515, which slows every product), while
 * a set of sums per width spilled. */
template <int kOps, int kKind>
struct ShortTiles
{
  static constexpr bool value = kKind != GMLP_KERNEL_GEMM_WGRAD && Config<kOps>::kFp8 && !Config<kOps>::kBlockScaled;
};

/* Whether short tiles are on and the tile's rows end within its first 64
 * (the second consumer's 64 rows lie wholly past its group's end): what
 * makes a tile short, for short_tile() and idle_half() alike. */
__device__ __forceinline__ bool
rows_end_in_first_half (const GemmParams &p, const Tile &tile)
{
  return p.short_tiles != 0 && tile.rows - tile.m0 <= 64;
}

template <int kOps, int kKind>
__device__ __forceinline__ bool
short_tile (const GemmParams &p, const Tile &tile)
{
  if constexpr (ShortTiles<kOps, kKind>::value)
    return rows_end_in_first_half (p, tile);
  else
    return false;
}

/* Narrow last columns: on the wide tiles, a group's last column tile
 * holds out_cols mod 192 columns (dsv3-fc1's FPROP 128 of its 11th, its
 * DGRAD 64 of its 38th); its consumers compute only the subtiles that
 * hold columns, with the m64n128 or m64n64 wgmma of the short tiles, where
 * the m64n192 one spent a third or two thirds of its products on columns
 * the epilogue clips. Returns the columns to compute: kBlockN, or
 * ShortTiles' two widths. */
template <int kOps>
__device__ __forceinline__ int
narrow_columns (const GemmParams &p, const Tile &tile)
{
  if constexpr (Config<kOps>::kWide)
    {
      const int32_t left = (int32_t) p.out_cols - tile.n0;

      return left <= 64 ? 64 : left <= 128 ? 128 : Config<kOps>::kBlockN;
    }
  else
    {
      return Config<kOps>::kBlockN;
    }
}

/* Idle halves, the 16-bit kernels' short tiles: where a row-grouped tile's
 * rows end within its first 64 (a group's last tile, often, under skewed
 * routing), the second consumer's 64 rows lie wholly past the group's end.
 * That consumer then issues no products and writes nothing (its results
 * were zeros that the epilogue clipped): it only takes each stage as it
 * lands and gives it back (pass_stages()), and the first consumer's
 * products, the same m64 × kBlockN wgmma as always, have the tensor cores
 * to themselves. One wgmma width keeps ptxas from serialising them
 * (C7515; see ShortTiles). The host turns them on (GemmParams::
 * short_tiles) for short reductions only, where they were measured to pay
 * (kIdleHalvesMaxReduction). */
template <int kOps, int kKind>
struct IdleHalves
{
  static constexpr bool value = kKind != GMLP_KERNEL_GEMM_WGRAD && !Config<kOps>::kFp8;
};

template <int kOps, int kKind>
__device__ __forceinline__ bool
idle_half (const GemmParams &p, const Tile &tile, int half)
{
  if constexpr (IdleHalves<kOps, kKind>::value)
    return half == 1 && rows_end_in_first_half (p, tile);
  else
    return false;
}

/* An idle half's tile (idle_half()): its leader waits for each of its
 * k_blocks stages to land and gives it back; every thread keeps stage and
 * phase in step with the other consumer's. Only the leader waits: the
 * other warps, unlike in a tile of products (whose warpgroup-wide wgmma
 * keeps them with the leader), would be held by nothing, and a warp that
 * had not yet seen a stage land when the ring came round to it again would
 * wait on the wrong phase (with every thread waiting here, the benchmark
 * hung once). The warpgroup meets at the end, so that no warp starts the
 * next tile before the leader has passed this one's stages. With no
 * products to overlap, on_first_stage() (which finds the next tile) runs
 * after them. */
template <int kOps, int kKind, typename OnFirstStage>
__device__ __forceinline__ void
pass_stages (uint64_t *full, uint64_t *empty, uint32_t k_blocks, uint32_t &stage, uint32_t &phase,
             int half, OnFirstStage &&on_first_stage)
{
  const bool leader = threadIdx.x % 128 == 0;

  for (uint32_t kb = 0; kb < k_blocks; kb++)
    {
      if (leader)
        {
          mbarrier_wait (&full[stage], phase);
          release_stage<kOps, kKind> (empty, stage);
        }
      next_stage<Ring<kOps, kKind>::kStages> (stage, phase);
    }
  on_first_stage ();
  consumer_sync (half);
}

/* FP8: issues the products of one ring stage into part, a set of
 * registers of its own (so that the previous stage's set can be promoted
 * while these run), or with accumulate adds them to what part holds. */
template <int kOps, int kKind, int kN>
__device__ __forceinline__ void
issue_fp8_stage (float (&part)[kN / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate)
{
  using Cfg = Config<kOps>;
  using Mma = typename MmaOf<kOps, kKind, kN>::Type;

  wgmma_fence ();
#pragma unroll
  for (int s = 0; s < Cfg::kBlockK / Cfg::kMmaK; s++)
    Mma::run (part, descriptor_plus (desc_a, s * 32), descriptor_plus (desc_b, s * 32), accumulate || s > 0);
  wgmma_commit ();
}

/* Blockwise FP8: the scales of one ring stage that this thread's
 * promotion multiplies by, read from depth d of its block's buffer (at
 * block_address in shared memory) a step before the promotion, so that
 * their loads' latency is hidden: A's scales of its rows frag_row and
 * frag_row + 8 of its half, and B's tile scales (TileScales), or for WGRAD where B's
 * columns' scales start for this thread (columns 8 j + 2 (lane % 4) +
 * {0, 1}, read in the promotion). Kept apart, not multiplied here: ptxas
 * moved such a product between the stage's wgmma, where it waited for the
 * loads and held the last one back. */
struct StageScales
{
  float    row[2];
  float    tile[3];   /* TileScales<kOps>::value of them */
  uint32_t cols;
};

template <int kOps, int kKind>
__device__ __forceinline__ StageScales
stage_scales (uint32_t block_address, uint32_t d, int half)
{
  StageScales s = { { 1.0f, 1.0f }, { 1.0f, 1.0f, 1.0f }, 0 };

  if constexpr (Config<kOps>::kBlockScaled)
    {
      constexpr int kDepth = Config<kOps>::kScaleDepth;
      const int thread = threadIdx.x % 128;
      const uint32_t row = block_address + 4 * (d * kBlockM + half * 64 + (thread / 32) * 16 + (thread % 32) / 4);

      s.row[0] = lds_f32 (row);
      s.row[1] = lds_f32 (row + 4 * 8);
      if constexpr (kKind != GMLP_KERNEL_GEMM_WGRAD)
        {
#pragma unroll
          for (int t = 0; t < TileScales<kOps>::value; t++)
            s.tile[t] = lds_f32 (block_address + 4 * (kDepth * kBlockM + t * kDepth + d));
        }
      else
        s.cols = block_address + 4 * (kDepth * kBlockM + d * Config<kOps>::kBlockN + 2 * (thread % 4));
    }
  return s;
}

/* FP8: the promotion of ring stage `stage`, whose products have landed in
 * part: acc += part in FP32 (acc starts each tile at zero, so that every
 * promotion is the same adds), with blockwise scales times each result's
 * scales (s from stage_scales(); for WGRAD also its column's). The stage
 * goes back to the producer first: its operands have been read. */
template <int kOps, int kKind, int kN>
__device__ __forceinline__ void
promote_fp8_stage (float (&acc)[kN / 2], float (&part)[kN / 2], const StageScales &s, uint64_t *empty,
                   uint32_t stage)
{
  wgmma_fence_operand (part);
  if (threadIdx.x % 128 == 0)
    release_stage<kOps, kKind> (empty, stage);
  if constexpr (Config<kOps>::kBlockScaled)
    {
#pragma unroll
      for (int j = 0; j < kN / 8; j++)
        {
          float2 scale[2];

          if constexpr (kKind == GMLP_KERNEL_GEMM_WGRAD)
            {
              const float2 b = lds_f32x2 (s.cols + 4 * 8 * j);

              scale[0] = make_float2 (s.row[0] * b.x, s.row[0] * b.y);
              scale[1] = make_float2 (s.row[1] * b.x, s.row[1] * b.y);
            }
          else
            {
              /* Columns 8 j ... 8 j + 7: the block of third j / 8. */
              const float tile = s.tile[TileScales<kOps>::value > 1 ? j / 8 : 0];

              scale[0] = make_float2 (s.row[0] * tile, s.row[0] * tile);
              scale[1] = make_float2 (s.row[1] * tile, s.row[1] * tile);
            }
#pragma unroll
          for (int h = 0; h < 2; h++)
            {
              const int i = 4 * j + 2 * h;

              acc[i] = fmaf (part[i], scale[h].x, acc[i]);
              acc[i + 1] = fmaf (part[i + 1], scale[h].y, acc[i + 1]);
            }
        }
    }
  else
    {
#pragma unroll
      for (int i = 0; i < kN / 2; i++)
        acc[i] += part[i];
    }
}

/* Blockwise FP8: the scale buffer of stage kb of a tile (the buffer of
 * stage kb - 1, block, but at the first stage of each block of
 * kScaleDepth, the next one, once its copies have landed). */
template <int kOps>
__device__ __forceinline__ uint32_t
scale_block_of (ScaleBlocks &sb, uint32_t kb, uint32_t block)
{
  using Cfg = Config<kOps>;

  if constexpr (Cfg::kBlockScaled)
    if (kb % Cfg::kScaleDepth == 0)
      {
        block = sb.count % Cfg::kScaleBufs;
        mbarrier_wait (&sb.full[block], (sb.count / Cfg::kScaleBufs) & 1);
        sb.count++;
      }
  return block;
}

/* Blockwise FP8: once the last stage of a block (or of the tile) has been
 * promoted, each thread gives its buffer back, its own reads of it done.
 * (Once in 8 stages: the 256 arrivals timed the same as one per
 * warpgroup. With one arrival per warp after __syncwarp, or per warpgroup
 * after its named barrier, compute-sanitizer's racecheck reported the
 * buffer's next copies as racing with the other threads' reads: it
 * follows an mbarrier's order from the threads that arrive only.) */
template <int kOps>
__device__ __forceinline__ void
scale_block_promoted (ScaleBlocks &sb, uint32_t block, uint32_t kb, uint32_t k_blocks)
{
  using Cfg = Config<kOps>;

  if constexpr (Cfg::kBlockScaled)
    if (kb % Cfg::kScaleDepth == Cfg::kScaleDepth - 1 || kb + 1 == k_blocks)
      mbarrier_arrive (&sb.empty[block]);
}

/* The products of a consumer's share of one tile, kN columns, into acc
 * (kN / 2 registers), from the descriptors of its A rows and B columns in
 * ring stage 0 (a stage's are those plus its offset); each stage goes back
 * to the producer once read, and with blockwise scales each block of
 * kScaleDepth stages' scales once promoted. on_first_stage() runs while
 * the first stage's products do. */
template <int kOps, int kKind, int kN, typename OnFirstStage>
__device__ __forceinline__ void
tile_products (float (&acc)[kN / 2], uint64_t desc_a0, uint64_t desc_b0, ScaleBlocks &sb,
               uint64_t *full, uint64_t *empty, uint32_t k_blocks, uint32_t &stage, uint32_t &phase,
               int half, OnFirstStage &&on_first_stage)
{
  using Cfg = Config<kOps>;
  constexpr bool kTransA = Layout<kOps, kKind>::kTransA;
  constexpr bool kTransB = Layout<kOps, kKind>::kTransB;
  constexpr int kStages = Ring<kOps, kKind>::kStages;
  constexpr int kDepth = Cfg::kScaleDepth;
  const bool leader = threadIdx.x % 128 == 0;
  /* Blockwise: the scale buffers (ScaleBlocks), and the current block's. */
  const uint32_t blocks_address = smem_address (sb.data);
  uint32_t held = 0, block = 0;
  /* FP8: waits for ring stage `stage` and issues its products into part
   * (a stage's set, or added to it with accumulate), then, at the tile's
   * first stage, runs on_first_stage(); generic, so that the 16-bit
   * instances never make it. */
  auto issue_stage = [&] (auto &part, bool first, bool accumulate)
  {
    mbarrier_wait (&full[stage], phase);
    /* The same in every lane, but with blockwise scales the compiler kept
     * it in a vector register and rebuilt each wgmma's descriptors
     * through R2UR moves (a third of the loop's instructions). Broadcast,
     * it stays uniform. */
    if constexpr (Cfg::kBlockScaled)
      stage = __shfl_sync (0xffffffffu, stage, 0);
    issue_fp8_stage<kOps, kKind, kN> (part, descriptor_plus (desc_a0, stage * Cfg::kStageBytes),
                                      descriptor_plus (desc_b0, stage * Cfg::kStageBytes), accumulate);
    if (first)
      on_first_stage ();
  };

  if constexpr (Cfg::kFp8 && (kN < Cfg::kBlockN || Cfg::kPartialSets == 1))
    {
      /* One set of partial sums, promoted as soon as it lands: a short
       * tile's share (two sets beside the full tiles' made the consumers
       * spill; short tiles are a group's last; per-tensor only), or a wide
       * tile, whose sets take the registers of the narrow tiles' three. */
      float part[kN / 2];

#pragma unroll
      for (int i = 0; i < kN / 2; i++)
        acc[i] = 0.0f;
      if constexpr (Cfg::kPromoteStages > 1)
        {
          /* kPromoteStages stages' products run into part, then one
           * promotion; each stage but the last of them goes back as soon
           * as its products are done. Every path out of the inner loop
           * drains part before the promotion (see the two sets' loop). */
          const StageScales none = {};
          uint32_t kb = 0;

          while (kb < k_blocks)
            {
              uint32_t issued = stage;

              issue_stage (part, kb == 0, false);
              next_stage<kStages> (stage, phase);
              kb++;
#pragma unroll
              for (int j = 1; j < Cfg::kPromoteStages; j++)
                {
                  if (kb == k_blocks)
                    break;
                  issue_stage (part, false, true);
                  wgmma_wait<1> ();
                  if (leader)
                    release_stage<kOps, kKind> (empty, issued);
                  issued = stage;
                  next_stage<kStages> (stage, phase);
                  kb++;
                }
              wgmma_wait<0> ();
              promote_fp8_stage<kOps, kKind, kN> (acc, part, none, empty, issued);
            }
        }
      else
        {
          for (uint32_t kb = 0; kb < k_blocks; kb++)
            {
              StageScales ss;

              issue_stage (part, kb == 0, false);
              /* Read while the products run. */
              block = scale_block_of<kOps> (sb, kb, block);
              ss = stage_scales<kOps, kKind> (blocks_address + block * Cfg::kScaleBlockFloats * 4, kb % kDepth,
                                              half);
              wgmma_wait<0> ();
              promote_fp8_stage<kOps, kKind, kN> (acc, part, ss, empty, stage);
              scale_block_promoted<kOps> (sb, block, kb, k_blocks);
              next_stage<kStages> (stage, phase);
            }
        }
    }
  else if constexpr (Cfg::kFp8)
    {
      /* Two sets of partial sums: stage kb's products run into one while
       * stage kb - 1's, landed in the other, are promoted into acc. (A
       * consumer that waited for its own stage before promoting it left
       * the tensor cores to the other consumer alone meanwhile: ncu saw
       * no instruction issued on many of the cycles.) */
      float part_even[kN / 2], part_odd[kN / 2];
      StageScales held_scales = {};   /* the scales of stage held */
      uint32_t held_block = 0;        /* blockwise: the buffer of held's */
      auto promoted = [&] (uint32_t kb) { scale_block_promoted<kOps> (sb, held_block, kb, k_blocks); };
      auto step = [&] (float (&issue)[kN / 2], float (&ready)[kN / 2], uint32_t kb)
      {
        StageScales landed;

        issue_stage (issue, kb == 0, false);
        block = scale_block_of<kOps> (sb, kb, block);
        /* This stage's scales, read now for its promotion in the next
         * step: their latency is then hidden. */
        landed = stage_scales<kOps, kKind> (blocks_address + block * Cfg::kScaleBlockFloats * 4, kb % kDepth,
                                            half);
        if (kb > 0)
          {
            wgmma_wait<1> ();
            promote_fp8_stage<kOps, kKind, kN> (acc, ready, held_scales, empty, held);
            promoted (kb - 1);
          }
        held = stage;
        held_scales = landed;
        held_block = block;
        next_stage<kStages> (stage, phase);
      };

#pragma unroll
      for (int i = 0; i < kN / 2; i++)
        acc[i] = 0.0f;
      /* Each exit drains the set its last stage went into, and they are
       * the only ways out: a test at the loop's top would be a path, to
       * ptxas, that leaves products in flight, and it would then wait for
       * every wgmma as soon as it was issued. */
      if (k_blocks > 0)
        {
          uint32_t kb = 0;

          for (;;)
            {
              step (part_even, part_odd, kb);
              if (++kb == k_blocks)
                {
                  wgmma_wait<0> ();
                  promote_fp8_stage<kOps, kKind, kN> (acc, part_even, held_scales, empty, held);
                  promoted (kb - 1);
                  break;
                }
              step (part_odd, part_even, kb);
              if (++kb == k_blocks)
                {
                  wgmma_wait<0> ();
                  promote_fp8_stage<kOps, kKind, kN> (acc, part_odd, held_scales, empty, held);
                  promoted (kb - 1);
                  break;
                }
            }
        }
    }
  else
    {
      using Mma = typename MmaOf<kOps, kKind, kN>::Type;

      for (uint32_t kb = 0; kb < k_blocks; kb++)
        {
          const uint64_t desc_a = descriptor_plus (desc_a0, stage * Cfg::kStageBytes);
          const uint64_t desc_b = descriptor_plus (desc_b0, stage * Cfg::kStageBytes);

          mbarrier_wait (&full[stage], phase);
          wgmma_fence ();
#pragma unroll
          for (int s = 0; s < Cfg::kBlockK / Cfg::kMmaK; s++)
            {
              /* K-major: 16 elements further along the 128-byte row.
               * MN-major: 16 rows further down each chunk. */
              Mma::run (acc, descriptor_plus (desc_a, kTransA ? s * 16 * 128 : s * 32),
                        descriptor_plus (desc_b, kTransB ? s * 16 * 128 : s * 32), kb > 0 || s > 0);
            }
          wgmma_commit ();
          /* While the first products run, find the next tile. */
          if (kb == 0)
            on_first_stage ();
          /* The stage before this one is no longer read: give it back. */
          wgmma_wait<1> ();
          if (kb > 0 && leader)
            release_stage<kOps, kKind> (empty, held);
          held = stage;
          next_stage<kStages> (stage, phase);
        }
      wgmma_wait<0> ();
      if (k_blocks > 0 && leader)
        release_stage<kOps, kKind> (empty, held);
    }
}

template <int kOps, int kKind>
__device__ __forceinline__ void
consume (const GemmParams &p, uint32_t ctas, uint8_t *ring, const float *scales, ScaleBlocks &sb,
         uint64_t *full, uint64_t *empty, float *staging, int half)
{
  using Cfg = Config<kOps>;
  constexpr bool kTransA = Layout<kOps, kKind>::kTransA;
  constexpr bool kTransB = Layout<kOps, kKind>::kTransB;
  constexpr int kBlockN = Cfg::kBlockN;
  /* A short tile's columns of each consumer: halves, or on the wide tiles
   * 128 and 64, so that each writes whole 64-column subtiles. */
  constexpr int kShortCols0 = Cfg::kWide ? 128 : kBlockN / 2;
  constexpr int kShortCols1 = kBlockN - kShortCols0;
  const bool direct = is_direct<kOps, kKind> (p);
  const uint32_t total = direct ? UINT32_MAX : p.tile_begin[p.n_groups];
  const bool leader = threadIdx.x % 128 == 0;
  const uint32_t ring_address = smem_address (ring);
  /* The wgmma descriptors of ring stage 0: this consumer's half of A's
   * tile (K-major: 64 rows further; MN-major: one chunk further) and B's.
   * A stage's are these plus its offset. */
  const uint64_t desc_a0 = smem_descriptor (ring_address + (kTransA ? half * kChunkBytes : half * 64 * 128),
                                            kTransA ? kChunkBytes : 0);
  const uint64_t desc_b0 = smem_descriptor (ring_address + Cfg::kTileABytes, kTransB ? kChunkBytes : 0);
  uint8_t *slots = reinterpret_cast<uint8_t *> (staging);
  uint32_t rounds = 0;   /* write_tile_tma()'s rounds of stores so far: its slots' turn */
  uint32_t stage = 0, phase = 0, acquired = 0xffffffffu;
  float acc[kBlockN / 2];
  Walk walk;
  Tile tile, next;
  /* The plan's schedule finds each next tile while the products of one
   * run (its reads are off the critical path then); the direct one finds
   * each tile at its start: its walk, beside the FP8 consumer's three sets
   * of sums, would spill, and its reads of the sizes hit in L1. */
  bool have_next = !direct && first_tile<kOps, kKind> (ctas) < total &&
                   locate_planned<kOps, kKind> (p, first_tile<kOps, kKind> (ctas), walk, next);
  GroupWork next_work = {};
  /* With the next tile, its GroupWork and its C map's acquire: at the
   * tile's start the warp waited there for them. */
  auto prepare_next = [&] ()
  {
    next_work = p.groups[next.group];
    if (leader && next.group != acquired)
      {
        tensormap_acquire (p.maps + kMapsPerGroup * (uint64_t) next.group + 2);
        acquired = next.group;
      }
  };
  auto find_next = [&] (uint32_t t)
  {
    if (!direct)
      {
        have_next = t + tile_step<kOps, kKind> (ctas) < total &&
                    locate_planned<kOps, kKind> (p, t + tile_step<kOps, kKind> (ctas), walk, next);
        if (have_next)
          prepare_next ();
      }
  };

  if (have_next)
    prepare_next ();

  for (uint32_t cursor = first_cursor<kOps, kKind> (ctas);;
       cursor = next_cursor<kOps, kKind> (cursor, ctas))
    {
      /* (The plan's schedule splits nothing: there the cursor is the
       * tile's index, which find_next() takes.) */
      {
        Piece piece;

        if (!piece_at<kOps, kKind> (cursor, piece))
          break;
        if (direct)
          {
            if (!locate_tile<kOps, kKind> (p, piece.t, walk, tile))
              break;
          }
        else
          {
            if (!have_next)
              break;
            tile = next;
            have_next = false;
          }
        if (piece.k_blocks != 0)
          tile.k_blocks = piece.k_blocks;
      }

      const GroupWork w = direct ? group_work<kOps, kKind> (p, tile) : next_work;
      /* Per-tensor FP8 on the direct schedule: the group's scale inverses,
       * which the tile's first stage brings. (Loaded here from global
       * memory, the warp waited for them before its first wgmma: a large
       * share of small-e64's stall samples.) */
      const uint32_t first_stage = stage;
      float scale_a = 1.0f, scale_b = 1.0f;
      auto on_first_stage = [&] ()
      {
        find_next (cursor);
        if (copies_tile_scales<kOps, kKind> (p))
          {
            scale_a = scales[first_stage * Cfg::kScaleSlot];
            scale_b = scales[first_stage * Cfg::kScaleSlot + 1];
          }
      };

      if (idle_half<kOps, kKind> (p, tile, half))
        {
          pass_stages<kOps, kKind> (full, empty, tile.k_blocks, stage, phase, half, on_first_stage);
          continue;
        }
      /* The columns this consumer computes, and where its operands start:
       * all of a tile's, or a short tile's share, or (narrow_columns())
       * those that a group's last column tile has. */
      int cols = kBlockN;
      uint64_t desc_a = desc_a0, desc_b = desc_b0;

      if constexpr (ShortTiles<kOps, kKind>::value)
        {
          if (short_tile<kOps, kKind> (p, tile))
            {
              /* The first 64 rows of A's tile (K-major: short tiles are
               * row-grouped) and this consumer's columns of B's; the sums
               * are the first of acc. */
              desc_a = descriptor_minus (desc_a0, half * 64 * 128);
              desc_b = descriptor_plus (desc_b0, half * kShortCols0 * 128);
              cols = half == 0 ? kShortCols0 : kShortCols1;
            }
          else
            {
              cols = narrow_columns<kOps> (p, tile);
            }
        }
      /* One call of each width (each is inlined): the narrow instances'
       * two short widths are one. */
      if constexpr (ShortTiles<kOps, kKind>::value)
        {
          if (cols == kShortCols0)
            tile_products<kOps, kKind, kShortCols0> (reinterpret_cast<float (&)[kShortCols0 / 2]> (acc), desc_a,
                                                     desc_b, sb, full, empty, tile.k_blocks, stage, phase, half,
                                                     on_first_stage);
          else if (kShortCols1 != kShortCols0 && cols == kShortCols1)
            tile_products<kOps, kKind, kShortCols1> (reinterpret_cast<float (&)[kShortCols1 / 2]> (acc), desc_a,
                                                     desc_b, sb, full, empty, tile.k_blocks, stage, phase, half,
                                                     on_first_stage);
          else
            tile_products<kOps, kKind, kBlockN> (acc, desc_a, desc_b, sb, full, empty, tile.k_blocks, stage,
                                                 phase, half, on_first_stage);
        }
      else
        {
          tile_products<kOps, kKind, kBlockN> (acc, desc_a, desc_b, sb, full, empty, tile.k_blocks, stage, phase,
                                               half, on_first_stage);
        }
      if (tile.k_blocks == 0)
        {
#pragma unroll
          for (int i = 0; i < kBlockN / 2; i++)
            acc[i] = 0.0f;
          find_next (cursor);
        }
      /* A tail tile's part (TailSplit): the later parts leave their sums
       * to the first, which adds them (all before any scale). */
      if constexpr (StreamKCapable<kOps, kKind>::value)
        {
          if (in_tail<kOps, kKind> (cursor))
            {
              const uint32_t slot = blockIdx.x / bundle_tiles<kOps, kKind> ();
              const uint32_t r = slot % tail_split.rest, j = slot / tail_split.rest;

              if (j != 0)
                {
                  store_partial<kOps, kKind, kBlockN> (p, acc, r, j, half);
                  continue;
                }
              add_partials<kOps, kKind, kBlockN> (p, acc, r, half);
            }
        }
      /* FP8: the sums' scale, applied as they are stored. Per-tensor: the
       * groups' scale inverses. Blockwise: 1 (the scales were applied
       * stage by stage), but the multiply gives the stores registers of
       * their own: stored as they were, the sums' registers put the
       * blockwise promotion's FFMAs on two registers of one bank in 96 of
       * 96 (64 this way; scripts/dev/ffma-banks.py). */
      const float scale = Cfg::kFp8 ? w.scale * scale_a * scale_b : 1.0f;
      const Share share = short_tile<kOps, kKind> (p, tile) ?
        Share { tile.m0, tile.n0 + half * kShortCols0, cols } :
        Share { tile.m0 + half * 64, tile.n0, cols };
      /* Only FPROP has a bias: no bias code in the other kernels. */
      const bool bias = kKind == GMLP_KERNEL_GEMM_FPROP && w.bias != nullptr;
      bool written;

      /* C is FP32 or the operands' dtype (the host check); FP8 products
       * write any of FP32, BF16 and FP16. */
      if (p.c_dtype == GMLP_NUM_FLOAT32)
        written = write_tile_tma_with<kKind, GMLP_NUM_FLOAT32, kBlockN, Cfg::kEpilogueBytes, Cfg::kFp8> (
          bias, p, tile, w, share, acc, scale, slots, rounds, half, direct);
      else if (Cfg::kFp8 ? p.c_dtype == GMLP_NUM_BFLOAT16 : Cfg::kBf16)
        written = write_tile_tma_with<kKind, GMLP_NUM_BFLOAT16, kBlockN, Cfg::kEpilogueBytes, Cfg::kFp8> (
          bias, p, tile, w, share, acc, scale, slots, rounds, half, direct);
      else
        written = write_tile_tma_with<kKind, GMLP_NUM_FLOAT16, kBlockN, Cfg::kEpilogueBytes, Cfg::kFp8> (
          bias, p, tile, w, share, acc, scale, slots, rounds, half, direct);
      if (!written)
        {
          if constexpr (Cfg::kFp8)
            {
#pragma unroll
              for (int i = 0; i < kBlockN / 2; i++)
                acc[i] *= scale;
            }
          write_tile<kKind, kBlockN> (p, tile, w, share, acc, staging, half);
        }
    }
  if (leader)
    bulk_wait_all ();
}

}  // namespace sm90
}  // namespace gmlp
