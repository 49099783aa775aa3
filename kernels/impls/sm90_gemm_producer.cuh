/* impls/sm90_gemm_producer.cuh: the Hopper grouped GEMM's producer: the TMA copies of A and B
 * into the shared-memory ring, and of the blockwise FP8 scales into theirs.
 * impls/grouped_gemm_sm90.cuh describes the whole kernel.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/sm90_gemm_schedule.cuh"

namespace gmlp {
namespace sm90 {

template <int kOps, int kKind>
__device__ __forceinline__ void
produce (const GemmParams &p, uint32_t ctas, uint8_t *ring, float *scales, uint64_t *full, uint64_t *empty)
{
  using Cfg = Config<kOps>;
  constexpr bool kTransA = Layout<kOps, kKind>::kTransA;
  constexpr bool kTransB = Layout<kOps, kKind>::kTransB;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kBlockK = Cfg::kBlockK;
  constexpr int kStages = Ring<kOps, kKind>::kStages;
  constexpr uint32_t kStageBytes = Cfg::kStageBytes;
  const bool direct = is_direct<kOps, kKind> (p);
  const uint32_t total = direct ? UINT32_MAX : p.tile_begin[p.n_groups];
  const bool leader = threadIdx.x % 32 == 0;
  uint32_t acquired = 0xffffffffu, stage = 0, phase = 0;
  Walk walk;
  Tile tile;

  /* Paired CTAs: this CTA's rank in its cluster, and the pair's. */
  const bool pair = paired<kOps, kKind> ();
  const uint32_t rank = blockIdx.x & 1;
  constexpr uint16_t kBoth = 3;
  bool shares_b = false, phantom = false;

  /* (A phantom's t lies past the end only on the direct schedule, where
   * total is no bound: the plan's never runs paired, pairs_pay().) */
  for (uint32_t cursor = first_cursor<kOps, kKind> (ctas);;
       cursor = next_cursor<kOps, kKind> (cursor, ctas))
    {
      Piece piece;

      if (!piece_at<kOps, kKind> (cursor, piece) || piece.t >= total)
        break;
      const uint32_t t = piece.t;

      if constexpr (Pairable<kOps, kKind>::value)
        {
          if (!locate_produced<kOps, kKind> (p, t, total, pair, walk, tile, shares_b, phantom))
            break;
        }
      else if (!locate_tile<kOps, kKind> (p, t, walk, tile))
        {
          break;
        }
      if (piece.k_blocks != 0)
        tile.k_blocks = piece.k_blocks;
      const TensorMap *map_a, *map_b;
      int32_t a_row;

      if (direct)
        {
          /* The host's maps, never edited: no acquire. */
          map_a = &p.direct.a;
          map_b = &p.direct.b;
          a_row = (int32_t) (tile.row_base + tile.m0);
        }
      else
        {
          map_a = p.maps + kMapsPerGroup * (uint64_t) tile.group;
          map_b = map_a + 1;
          a_row = (int32_t) tile.m0;
          if (leader && tile.group != acquired)
            {
              tensormap_acquire (map_a);
              tensormap_acquire (map_b);
              acquired = tile.group;
            }
        }

      for (uint32_t kb = 0; kb < tile.k_blocks; kb++)
        {
          uint8_t *tile_a = ring + stage * kStageBytes;
          uint8_t *tile_b = tile_a + Cfg::kTileABytes;
          const int32_t k0 = (int32_t) (piece.k_first + kb) * kBlockK;

          mbarrier_wait (&empty[stage], phase ^ 1);
          if (phantom)
            {
              /* The consumers' arrivals, on this CTA's barrier and the
               * partner's: once this CTA's has seen the partner's for the
               * stage's last use, the partner's has seen those of the
               * consumers here, so these count for its next. */
              if (leader)
                for (int c = 0; c < kConsumers; c++)
                  release_stage<kOps, kKind> (empty, stage);
              next_stage<kStages> (stage, phase);
              continue;
            }
          if (copies_tile_scales<kOps, kKind> (p) && leader)
            {
              /* The consumers would otherwise load them at the tile's
               * start and wait there for the loads. */
              if (kb == 0)
                {
                  const DirectSchedule &d = p.direct;

                  cp_async_4 (scales + stage * Cfg::kScaleSlot, d.a_scale + tile.group * d.a_scale_stride);
                  cp_async_4 (scales + stage * Cfg::kScaleSlot + 1,
                              d.b_scale + tile.group * d.b_scale_stride);
                }
              cp_async_arrive (&full[stage]);
            }
          /* One lane issues the copies; the others only help locate tiles.
           * Shared or not, each CTA's stage takes all of A's and B's bytes. */
          if (leader)
            {
              mbarrier_arrive_expect_tx (&full[stage], kStageBytes);
              if (kTransA)
                {
                  for (int c = 0; c < kBlockM / kChunk; c++)
                    tma_load_2d (tile_a + c * kChunkBytes, map_a, &full[stage],
                                 (int32_t) tile.m0 + c * kChunk, k0);
                }
              else
                {
                  tma_load_2d (tile_a, map_a, &full[stage], k0, a_row);
                }
              /* B: the group's plane of the direct map, or its own map.
               * Where the pair shares B's tile (the direct schedule),
               * this CTA's half of it, into both CTAs' rings. */
              if (shares_b)
                {
                  constexpr int kHalfChunks = kBlockN / kChunk / 2;

                  if (kTransB)
                    for (int c = (int) rank * kHalfChunks; c < ((int) rank + 1) * kHalfChunks; c++)
                      tma_load_3d_multicast (tile_b + c * kChunkBytes, map_b, &full[stage],
                                             (int32_t) tile.n0 + c * kChunk, k0, (int32_t) tile.group, kBoth);
                  else
                    tma_load_3d_multicast (tile_b + rank * (Cfg::kTileBBytes / 2), &p.b_half, &full[stage],
                                           k0, (int32_t) tile.n0 + (int32_t) rank * (kBlockN / 2),
                                           (int32_t) tile.group, kBoth);
                }
              else if (kTransB)
                {
                  for (int c = 0; c < kBlockN / kChunk; c++)
                    if (direct)
                      tma_load_3d (tile_b + c * kChunkBytes, map_b, &full[stage],
                                   (int32_t) tile.n0 + c * kChunk, k0, (int32_t) tile.group);
                    else
                      tma_load_2d (tile_b + c * kChunkBytes, map_b, &full[stage],
                                   (int32_t) tile.n0 + c * kChunk, k0);
                }
              else if (direct)
                {
                  tma_load_3d (tile_b, map_b, &full[stage], k0, (int32_t) tile.n0,
                               (int32_t) tile.group);
                }
              else
                {
                  tma_load_2d (tile_b, map_b, &full[stage], k0, (int32_t) tile.n0);
                }
            }
          next_stage<kStages> (stage, phase);
        }
    }
}

/* Blockwise FP8: scale warp `share` of the producer warpgroup (see
 * kScaleWarps). It walks the tiles as the operands' warp does and copies
 * its share of each block of kScaleDepth stages' scales as a buffer comes
 * free; each of its lanes arrives on the buffer's full barrier once its
 * copies have landed. Lane l copies depth l % 8 of rows l / 8 + 4 i, so
 * that 8 lanes read one row's 8 depths, one sector when they share one.
 * Rows past an operand's end take its last row's scales (their results
 * are never stored); depths past the tile's reduction are not copied (nor
 * read); nothing past the group's scales is read. The copies are
 * asynchronous (cp.async): their latency is not the warp's to wait out. */
template <int kOps, int kKind>
__device__ __forceinline__ void
produce_scales (const GemmParams &p, uint32_t ctas, ScaleBlocks &sb, int share)
{
  using Cfg = Config<kOps>;
  constexpr bool kWgrad = kKind == GMLP_KERNEL_GEMM_WGRAD;
  constexpr int kDepth = Cfg::kScaleDepth;
  constexpr int kRowsA = kWgrad ? kBlockM : kBlockM / kScaleWarps;   /* this warp's of A */
  const uint32_t total = is_direct<kOps, kKind> (p) ? UINT32_MAX : p.tile_begin[p.n_groups];
  const int lane = threadIdx.x % 32;
  const bool b_rows = kWgrad && share == 1;
  const int rows = b_rows ? Cfg::kBlockN : kRowsA;
  const GmlpKernelFp8Scales &layout = b_rows ? p.b_scales : p.a_scales;
  /* Where this lane's copies go in a buffer: its depth's row of the
   * operand's scales, from its first row. */
  const uint32_t dst = (b_rows ? kDepth * kBlockM : 0) + (lane % kDepth) * (b_rows ? Cfg::kBlockN : kBlockM) +
                       (kWgrad ? 0 : share * kRowsA) + lane / kDepth;
  Walk walk;
  MemberWalk members;
  Tile tile;

  for (uint32_t t = first_tile<kOps, kKind> (ctas); t < total; t += tile_step<kOps, kKind> (ctas))
    {
      if (!locate_tile<kOps, kKind> (p, t, walk, tile))
        break;

      /* The group's scales: the plan's, or on the direct schedule A's
       * member and B's equally spaced blocks. */
      const float *a_scales, *b_scales;

      if (is_direct<kOps, kKind> (p))
        {
          const DirectSchedule &d = p.direct;

          a_scales = reinterpret_cast<const float *> (d.a_scales.data +
                                                      scale_member_offset (d, members, tile.group));
          b_scales = reinterpret_cast<const float *> (d.b_scale + tile.group * d.b_scale_stride);
        }
      else
        {
          a_scales = p.groups[tile.group].a_scales;
          b_scales = p.groups[tile.group].b_scales;
        }

      const int32_t first = (b_rows ? tile.n0 : tile.m0) + (kWgrad ? 0 : share * kRowsA) + lane / kDepth;
      const int32_t last = (int32_t) ((b_rows ? p.out_cols : kWgrad ? p.out_rows_fixed : tile.rows) - 1);
      /* FPROP and DGRAD: the 128 × 128 block of B's scales under each
       * 64-column third of the tile (TileScales), a third past B's rows
       * taking the last block's. Depth-major after A's: [third][d]. */
      const int32_t b_block = min ((tile.n0 + (lane / kDepth) * 64) >> 7, (int32_t) ((p.out_cols - 1) >> 7));

      for (uint32_t kb0 = 0; kb0 < tile.k_blocks; kb0 += kDepth)
        {
          const uint32_t buf = sb.count % Cfg::kScaleBufs;
          const uint32_t kb = kb0 + lane % kDepth;
          float *data = sb.data + buf * Cfg::kScaleBlockFloats;

          mbarrier_wait (&sb.empty[buf], ((sb.count / Cfg::kScaleBufs) & 1) ^ 1);
          if (kb < tile.k_blocks)
            {
              const float *column = (b_rows ? b_scales : a_scales) + kb * layout.depth_stride;

#pragma unroll 4
              for (int i = 0; i < rows / (32 / kDepth); i++)
                cp_async_4 (data + dst + (32 / kDepth) * i,
                            column + min (first + (32 / kDepth) * i, last) * layout.row_stride);
              if (!kWgrad && share == 0 && lane < kDepth * TileScales<kOps>::value)
                cp_async_4 (data + kDepth * kBlockM + lane,
                            b_scales + b_block * p.b_scales.row_stride + kb * p.b_scales.depth_stride);
            }
          cp_async_arrive (&sb.full[buf]);
          sb.count++;
        }
    }
}

}  // namespace sm90
}  // namespace gmlp
