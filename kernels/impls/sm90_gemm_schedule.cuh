/* impls/sm90_gemm_schedule.cuh: the Hopper grouped GEMM's tile schedule: which tile each CTA
 * takes next and where it lies (direct or planned), paired CTAs, even
 * waves, the stream-k tail split, and the shared-memory layout.
 * impls/grouped_gemm_sm90.cuh describes the whole kernel.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/sm90_gemm_config.cuh"

namespace gmlp {
namespace sm90 {

/* The tile schedule both roles follow: tile t of the whole list, found in
 * its group by walking forwards (each CTA's tiles only ever increase).
 * All 32-bit: rows, columns and coordinates are below kMaxExtent (the
 * host's check), and two tiles are live across the main loop, beside the
 * consumer's accumulators. */
struct Tile
{
  uint32_t group;
  int32_t  m0;        /* first output row, in the group */
  int32_t  n0;        /* first output column */
  uint32_t k_blocks;  /* kBlockK-deep steps of the reduction */
  int32_t  rows;      /* the group's, clamped */
  int32_t  row_base;  /* direct schedule: the group's first row in A and C */
};

/* Where a CTA's walk over the groups stands: tiles only ever increase. The
 * plan's schedule keeps the group of the last tile; the direct one the
 * first group not yet passed, its first tile and its first row (at most
 * the capacity). */
struct Walk
{
  uint32_t group = 0;
  uint32_t tile_base = 0;
  int32_t  row_base = 0;
  /* The direct schedule, once a tile is found: the first tile past its
   * group's and the group's rows (locate_direct()'s fast path). */
  uint32_t tile_end = 0;
  int32_t  rows = 0;
};

/* Whether an instance can take the direct schedule (the host asks too,
 * direct_schedule()), and whether this launch does. Blockwise FP8 only on
 * 128 × 128 tiles, and the host sends it only small products: it saves
 * small-e64's fprop the plan's launch, but on 128 × 192 tiles it was
 * slower for qwen3-fc1's skewed fprop and dsv3-fc1's dgrad. */
constexpr bool
direct_capable (int ops, int kind)
{
  return kind != GMLP_KERNEL_GEMM_WGRAD && !(ops_block_scaled (ops) && ops_wide (ops));
}

template <int kOps, int kKind>
struct DirectCapable
{
  static constexpr bool value = direct_capable (kOps, kKind);
};

template <int kOps, int kKind>
__device__ __forceinline__ bool
is_direct (const GemmParams &p)
{
  if constexpr (DirectCapable<kOps, kKind>::value)
    return p.use_direct != 0;
  else
    return false;
}

/* Whether the producer copies each tile's per-tensor FP8 scale inverses
 * into the slot of its first stage (the direct schedule; the plan's
 * GroupWork holds their product). */
template <int kOps, int kKind>
__device__ __forceinline__ bool
copies_tile_scales (const GemmParams &p)
{
  return Config<kOps>::kFp8 && !Config<kOps>::kBlockScaled && is_direct<kOps, kKind> (p);
}

/* The direct schedule's size of group g, clamped to [0, capacity]. */
__device__ __forceinline__ uint32_t
direct_rows (const DirectSchedule &d, uint32_t g)
{
  /* Read-only for the whole kernel: the walks of a CTA's warps hit in L1. */
  const int64_t asked = d.device_rows != nullptr ? __ldg (d.device_rows + g) : (int64_t) d.host_rows[g];

  return (uint32_t) (asked < 0 ? 0 : asked < d.capacity ? asked : d.capacity);
}

/* Blockwise FP8 on the direct schedule: where the scale warps' walk over
 * the members of A's scales stands (groups only ever increase). */
struct MemberWalk
{
  uint32_t group = 0;
  uint64_t offset = 0;
};

/* The offset of member g of A's scales (DirectSchedule::a_scales), as the
 * quantizer laid them out: each earlier group's member stride, from the
 * sizes as asked (the plan's rule), 32 groups a step. Every lane of the
 * warp calls it with the same g. */
__device__ __forceinline__ uint64_t
scale_member_offset (const DirectSchedule &d, MemberWalk &walk, uint32_t g)
{
  const uint32_t lane = threadIdx.x % 32;

  while (walk.group < g)
    {
      const uint32_t i = walk.group + lane;
      uint64_t stride = 0;

      if (i < g)
        {
          const int64_t asked = d.device_rows != nullptr ? __ldg (d.device_rows + i) : (int64_t) d.host_rows[i];

          stride = member_stride (asked > 0 ? asked : 0, d.a_scales);
        }
#pragma unroll
      for (int delta = 16; delta > 0; delta /= 2)
        stride = SaturatingAdd () (stride, __shfl_xor_sync (0xffffffffu, stride, delta));
      walk.offset = SaturatingAdd () (walk.offset, stride);
      walk.group = min (g, walk.group + 32);
    }
  return walk.offset;
}

/* Finds tile t's group by scanning the sizes 32 groups a step from where
 * the walk stands: each lane one group's clamped rows and tiles, prefix
 * sums by shuffles, and the groups that end at or before t are a prefix of
 * the lanes. The clamping is the plan's: group g gets the rows of
 * [P_g, P_g + m_g) that lie below the capacity, P_g the sum of the sizes
 * before it, so the sums saturate at the capacity (and stay 32-bit: the
 * consumers run this beside their accumulators). False when t lies past
 * the last group's tiles. */
__device__ __forceinline__ bool
locate_direct (const GemmParams &p, uint32_t t, Walk &walk, Tile &tile)
{
  const DirectSchedule &d = p.direct;
  const uint32_t capacity = (uint32_t) d.capacity;
  const int lane = threadIdx.x % 32;

  /* Most of a CTA's tiles lie in the group of its last one: no scan. */
  if (t < walk.tile_end)
    {
      tile.group = walk.group;
      tile.rows = walk.rows;
      tile.row_base = walk.row_base;
      tile.m0 = (int32_t) (t - walk.tile_base);
      return true;
    }
  for (;;)
    {
      const uint32_t g = walk.group + lane;
      const bool valid = g < p.n_groups;
      uint32_t end = valid ? direct_rows (d, g) : 0, start, tiles, tiles_incl, ballot;
      int passed;

      if (walk.group >= p.n_groups)
        return false;
      /* end: P_{g+1} from the walk's row, saturated (no sum exceeds 2^32). */
#pragma unroll
      for (int delta = 1; delta < 32; delta *= 2)
        {
          const uint32_t v = __shfl_up_sync (0xffffffffu, end, delta);
          if (lane >= delta)
            end = min (capacity, end + v);
        }
      end = min (capacity, (uint32_t) walk.row_base + end);
      start = __shfl_up_sync (0xffffffffu, end, 1);
      if (lane == 0)
        start = (uint32_t) walk.row_base;
      tiles = valid ? div_up (end - start, (uint32_t) kBlockM) * p.tiles_n : 0;
      tiles_incl = tiles;
#pragma unroll
      for (int delta = 1; delta < 32; delta *= 2)
        {
          const uint32_t v = __shfl_up_sync (0xffffffffu, tiles_incl, delta);
          if (lane >= delta)
            tiles_incl += v;
        }
      ballot = __ballot_sync (0xffffffffu, valid && walk.tile_base + tiles_incl <= t);
      passed = __popc (ballot);
      if (passed == 32)
        {
          walk.group += 32;
          walk.tile_base += __shfl_sync (0xffffffffu, tiles_incl, 31);
          walk.row_base = (int32_t) __shfl_sync (0xffffffffu, end, 31);
          continue;
        }
      /* Lane passed holds t's group, unless the groups ran out. */
      {
        const uint32_t first_tile = walk.tile_base + __shfl_sync (0xffffffffu, tiles_incl - tiles, passed);
        const uint32_t group_start = __shfl_sync (0xffffffffu, start, passed);
        const uint32_t group_end = __shfl_sync (0xffffffffu, end, passed);

        if (walk.group + passed >= p.n_groups)
          {
            /* (count_tiles() reads the tiles of every group here.) */
            walk.group = p.n_groups;
            walk.tile_base = first_tile;
            return false;
          }
        walk.group += passed;
        walk.tile_base = first_tile;
        walk.row_base = (int32_t) group_start;
        walk.tile_end = first_tile + __shfl_sync (0xffffffffu, tiles, passed);
        walk.rows = (int32_t) (group_end - group_start);
        tile.group = walk.group;
        tile.rows = walk.rows;
        tile.row_base = (int32_t) group_start;
        tile.m0 = (int32_t) (t - first_tile);   /* the tile's index in its group, for now */
        return true;
      }
    }
}

/* Fills in the coordinates of the tile with index local in its group
 * (tile.group and tile.rows known). */
template <int kOps, int kKind>
__device__ __forceinline__ void
place_tile (const GemmParams &p, uint32_t local, Tile &tile)
{
  uint32_t tiles_m;
  int64_t reduction;

  if (kKind == GMLP_KERNEL_GEMM_WGRAD)
    {
      tiles_m = p.tiles_m_fixed;
      reduction = tile.rows;
    }
  else
    {
      tiles_m = (uint32_t) div_up (tile.rows, kBlockM);
      reduction = p.reduction;
    }
  /* Panels of kPanelTiles row tiles: down a panel's rows first, then
   * across its columns, then the next panel. CTAs running at once share B
   * tiles, and a panel's A rows stay in L2 while its columns are swept,
   * however many rows the group has (a big group would otherwise have its
   * A read again for every column of tiles). */
  {
    const uint32_t panel_tiles = kPanelTiles * p.tiles_n;
    const uint32_t panel = local / panel_tiles;
    const uint32_t in_panel = local % panel_tiles;
    const uint32_t panel_rows = min (kPanelTiles, tiles_m - panel * kPanelTiles);

    tile.m0 = (int32_t) ((panel * kPanelTiles + in_panel % panel_rows) * kBlockM);
    tile.n0 = (int32_t) ((in_panel / panel_rows) * Config<kOps>::kBlockN);
  }
  tile.k_blocks = (uint32_t) div_up (reduction, Config<kOps>::kBlockK);
}

/* Finds tile t (below the plan's tile count) on the plan's schedule. */
template <int kOps, int kKind>
__device__ __forceinline__ bool
locate_planned (const GemmParams &p, uint32_t t, Walk &walk, Tile &tile)
{
  /* A whole warp walks the offsets 32 groups per load: tile_begin only
   * grows, so the lanes whose group starts at or before t are a prefix,
   * and their count is how far to go. (A thread alone would wait out one
   * load per group it passes: many tiny groups made that the bottleneck.) */
  for (;;)
    {
      const uint32_t g = walk.group + 1 + threadIdx.x % 32;
      const bool passed = g <= p.n_groups && p.tile_begin[g] <= t;
      const uint32_t ballot = __ballot_sync (0xffffffffu, passed);

      walk.group += __popc (ballot);
      if (ballot != 0xffffffffu)
        break;
    }
  tile.group = walk.group;
  tile.rows = (int32_t) p.groups[walk.group].rows;
  tile.row_base = 0;
  place_tile<kOps, kKind> (p, t - p.tile_begin[walk.group], tile);
  return true;
}

/* Finds tile t on either schedule (t below the plan's tile count, or any
 * t for the direct one): false when the direct walk finds no such tile. */
template <int kOps, int kKind>
__device__ __forceinline__ bool
locate_tile (const GemmParams &p, uint32_t t, Walk &walk, Tile &tile)
{
  if (!is_direct<kOps, kKind> (p))
    return locate_planned<kOps, kKind> (p, t, walk, tile);
  if (!locate_direct (p, t, walk, tile))
    return false;
  place_tile<kOps, kKind> (p, (uint32_t) tile.m0, tile);
  return true;
}

/* The tiles of the whole list: the plan's count, or on the direct
 * schedule a walk past every group. */
template <int kOps, int kKind>
__device__ __forceinline__ uint32_t
count_tiles (const GemmParams &p)
{
  Walk walk;
  Tile tile;

  if (!is_direct<kOps, kKind> (p))
    return p.tile_begin[p.n_groups];
  (void) locate_direct (p, UINT32_MAX, walk, tile);
  return walk.tile_base;
}

/* Clusters of two CTAs (per-tensor FP8 FPROP and DGRAD on the wide tiles
 * and the direct schedule, where the host launches them so: Pairable,
 * pairs_pay(), pairs_fit()). CTA b and its partner b ^ 1 take tiles t and
 * t ^ 1 of the list, on the panel raster the next row tile of the same
 * columns; where the two share B's tile (same group and columns), each
 * copies one half of it (GemmParams::b_half) into both CTAs' rings (TMA
 * multicast), which halves B's traffic from L2. A producer writes into its
 * partner's ring, so each consumer gives every stage back to both
 * producers, and the two rings keep in step: the CTAs must pass through
 * the same stages. They do, because all of FPROP's and DGRAD's tiles
 * reduce over the same depth, and because where a CTA's tile lies past the
 * end while its partner's does not, its producer runs the partner's tile
 * as a phantom: it copies nothing, and gives each stage back for its
 * consumers (which have stopped) once the stage comes free. */
/* Whether this launch's CTAs run in pairs. */
template <int kOps, int kKind>
__device__ __forceinline__ bool
paired ()
{
  if constexpr (Pairable<kOps, kKind>::value)
    return cluster_ctas () > 1;
  else
    return false;
}

/* Whether an instance can run on fewer CTAs than its grid (the host asks
 * too, even_waves()): FPROP and DGRAD, whose tiles all reduce over the
 * same depth (a WGRAD tile's is its group's rows), but not blockwise FP8,
 * whose wide FPROP ran slower for the count and the stride's register
 * alone, even with even waves off. */
constexpr bool
even_waves_capable (int ops, int kind)
{
  return kind != GMLP_KERNEL_GEMM_WGRAD && !ops_block_scaled (ops);
}

template <int kOps, int kKind>
struct EvenWavesCapable
{
  static constexpr bool value = even_waves_capable (kOps, kKind);
};

/* The CTAs that take tiles, the first of the grid, each taking every
 * working_ctas()-th tile from its own: with even_waves, as few as still
 * run the list in as many waves as the whole grid (ceil(total / grid)),
 * an even count where CTAs run in pairs. The SMs left out idle through
 * the kernel rather than the last wave of SMs working alone, and those
 * that work run the same tiles each, which at the power limit costs less
 * than a last wave of SMs working alone (dsv3-fc1's FP8 fprop: 2816
 * tiles, 22 waves of 128 CTAs rather than 21.3 of 132). */
template <int kOps, int kKind>
__device__ __forceinline__ uint32_t
working_ctas (const GemmParams &p)
{
  uint32_t total, waves, ctas;

  if (!EvenWavesCapable<kOps, kKind>::value || !p.even_waves)
    return gridDim.x;
  total = count_tiles<kOps, kKind> (p);
  waves = (uint32_t) div_up (total, gridDim.x);
  if (waves == 0)
    return gridDim.x;
  ctas = (uint32_t) div_up (total, waves);
  if (paired<kOps, kKind> ())
    ctas += ctas & 1;
  return min (ctas, gridDim.x);
}

/* A CTA's first tile: its index among the working CTAs, or for those
 * past them none (an index no list reaches, as UINT32_MAX). */
template <int kOps, int kKind>
__device__ __forceinline__ uint32_t
first_tile (uint32_t ctas)
{
  if constexpr (EvenWavesCapable<kOps, kKind>::value)
    return blockIdx.x < ctas ? blockIdx.x : UINT32_MAX;
  else
    return blockIdx.x;
}

/* The step from one of a CTA's tiles to its next: working_ctas(), or the
 * grid where an instance always runs on all of it (its code as before: the
 * grid's size is read where it is used, and holds no register). */
template <int kOps, int kKind>
__device__ __forceinline__ uint32_t
tile_step (uint32_t ctas)
{
  if constexpr (EvenWavesCapable<kOps, kKind>::value)
    return ctas;
  else
    return gridDim.x;
}

/* The split tail. With W whole waves of tiles and R tiles more (R at
 * most half a wave), the last R tiles would run alone on R SMs while the
 * others idle: long reductions (dsv3-fc1's 56 or 112 stages a tile) lose
 * most of a tile's time there. Instead each of the R tiles is cut along
 * its reduction into S parts (S = the CTAs over R, at most a part per 4
 * stages), run at once by S CTAs: part j of tail tile r by CTA j R + r,
 * so that the parts running side by side read the same depths of their
 * operands (a first version that gave each CTA an equal run of the tail's
 * stages staggered them, and read more from DRAM than it saved). Parts
 * 1 to S - 1 store their unscaled sums in slots of the workspace and raise
 * a flag each; part 0 waits for the flags, adds the sums and writes the
 * tile. Paired CTAs split in bundles of two tiles (t and t ^ 1, as they
 * take them), so that the pair runs the same stages. The direct schedule
 * only (per-tensor FP8 and 16-bit FPROP and DGRAD), where every tile
 * reduces over the same depth. Every CTA must be resident at once (the
 * grid is one CTA an SM). */
constexpr bool
stream_k_capable (int ops, int kind)
{
  return direct_capable (ops, kind) && !ops_block_scaled (ops);
}

template <int kOps, int kKind>
struct StreamKCapable
{
  static constexpr bool value = stream_k_capable (kOps, kKind);
};

/* A launch's split (in shared memory, set once a launch): whole tiles
 * t = first, first + step, ... below whole_tiles, then, for the first
 * rest × parts CTAs (in bundles), one part of a tail tile. */
struct TailSplit
{
  uint32_t whole_tiles;   /* UINT32_MAX: no split */
  uint32_t rest;          /* tail bundles */
  uint32_t parts;         /* of each */
  uint32_t k_blocks;      /* a whole tile's stages */
};

/* This launch's (gemm_kernel() sets it). At a fixed address, so that the
 * roles read it with no register held for it. */
static __shared__ TailSplit tail_split;

/* A cursor over a CTA's work: a whole tile's index, or kTailCursor for its
 * part of the tail (kTailCursor + 1: done). */
constexpr uint32_t kTailCursor = 0x80000000u;

template <int kOps, int kKind>
__device__ __forceinline__ uint32_t
bundle_tiles ()
{
  return paired<kOps, kKind> () ? 2 : 1;
}

/* The split of this launch, or whole_tiles UINT32_MAX for none: where the
 * tiles make a whole wave or more and then at most half a wave, and the
 * tiles have 8 stages or more. Called by a whole warp (count_tiles()). */
template <int kOps, int kKind>
__device__ __forceinline__ TailSplit
plan_tail_split (const GemmParams &p)
{
  TailSplit split = { UINT32_MAX, 0, 0, 0 };
  const uint32_t width = bundle_tiles<kOps, kKind> ();
  const uint32_t bundles = (uint32_t) div_up (count_tiles<kOps, kKind> (p), width);
  const uint32_t slots = gridDim.x / width;
  const uint32_t rest = bundles % slots;
  const uint32_t k_blocks = (uint32_t) div_up (p.reduction, Config<kOps>::kBlockK);

  if (bundles > slots && rest != 0 && 2 * rest <= slots && k_blocks >= 8)
    {
      split.whole_tiles = (bundles - rest) * width;
      split.rest = rest;
      split.parts = min (slots / rest, k_blocks / 4);
      split.k_blocks = k_blocks;
    }
  return split;
}

/* A piece of a CTA's work: tile t, from stage k_first, k_blocks stages
 * (a whole tile's, from place_tile(), where k_blocks is 0). */
struct Piece
{
  uint32_t t;
  uint32_t k_first;
  uint32_t k_blocks;
};

/* The first cursor of a CTA. (Where the launch splits nothing,
 * tail_split.whole_tiles is UINT32_MAX: every cursor is a tile's index.) */
template <int kOps, int kKind>
__device__ __forceinline__ uint32_t
first_cursor (uint32_t ctas)
{
  const uint32_t t = first_tile<kOps, kKind> (ctas);

  if constexpr (StreamKCapable<kOps, kKind>::value)
    return t < tail_split.whole_tiles ? t : kTailCursor;
  else
    return t;
}

/* The cursor after the piece at cursor. */
template <int kOps, int kKind>
__device__ __forceinline__ uint32_t
next_cursor (uint32_t cursor, uint32_t ctas)
{
  const uint32_t t = cursor + tile_step<kOps, kKind> (ctas);

  if constexpr (StreamKCapable<kOps, kKind>::value)
    {
      if ((cursor & kTailCursor) != 0)
        return kTailCursor + 1;
      return t < tail_split.whole_tiles ? t : kTailCursor;
    }
  else
    {
      return t;
    }
}

/* Whether the cursor is on the tail's units. */
template <int kOps, int kKind>
__device__ __forceinline__ bool
in_tail (uint32_t cursor)
{
  return StreamKCapable<kOps, kKind>::value && (cursor & kTailCursor) != 0;
}

/* The stages of part j of a tail tile: [first, end). */
__device__ __forceinline__ uint32_t
part_start (uint32_t j)
{
  return (uint32_t) ((uint64_t) j * tail_split.k_blocks / tail_split.parts);
}

/* The piece at cursor; false once a CTA is past its part of the tail (or
 * has none). */
template <int kOps, int kKind>
__device__ __forceinline__ bool
piece_at (uint32_t cursor, Piece &piece)
{
  const uint32_t slot = blockIdx.x / bundle_tiles<kOps, kKind> ();
  uint32_t j;

  if (!in_tail<kOps, kKind> (cursor))
    {
      piece = Piece { cursor, 0, 0 };
      return true;
    }
  if (cursor != kTailCursor || slot >= tail_split.rest * tail_split.parts)
    return false;
  j = slot / tail_split.rest;
  piece.t = tail_split.whole_tiles + (slot % tail_split.rest) * bundle_tiles<kOps, kKind> () +
            blockIdx.x % bundle_tiles<kOps, kKind> ();
  piece.k_first = part_start (j);
  piece.k_blocks = part_start (j + 1) - piece.k_first;
  return true;
}

/* Hands ring stage `stage` back to the producer, and with paired CTAs to
 * the partner's too (which copies into this CTA's ring). */
template <int kOps, int kKind>
__device__ __forceinline__ void
release_stage (uint64_t *empty, uint32_t stage)
{
  mbarrier_arrive (&empty[stage]);
  if (paired<kOps, kKind> ())
    mbarrier_arrive_cluster (&empty[stage], (blockIdx.x & 1) ^ 1);
}

/* Tile t if it lies below total (any t on the direct schedule). */
template <int kOps, int kKind>
__device__ __forceinline__ bool
locate_listed (const GemmParams &p, uint32_t t, uint32_t total, Walk &walk, Tile &tile)
{
  return t < total && locate_tile<kOps, kKind> (p, t, walk, tile);
}

/* Paired CTAs on the direct schedule: whether the partner's tile (t ^ 1)
 * lies in the group of this CTA's tile t (just found: the walk stands
 * there, tile_base to tile_end) and in its columns, so that the two need
 * the same B tile. */
template <int kOps, int kKind>
__device__ __forceinline__ bool
partner_shares_b (const GemmParams &p, uint32_t t, const Walk &walk, const Tile &tile)
{
  const uint32_t partner = t ^ 1;
  Tile other = tile;

  if (partner < walk.tile_base || partner >= walk.tile_end)
    return false;
  place_tile<kOps, kKind> (p, partner - walk.tile_base, other);
  return other.n0 == tile.n0;
}

/* The producer's tile t (below total, or any t on the direct schedule);
 * false when there is none. On paired CTAs, also where t lies past the end
 * and the partner's tile does not: that tile, as a phantom (Pairable),
 * found by a walk from the first group (once a kernel, at its end);
 * shares_b says whether the two CTAs' tiles need the same B tile. One walk
 * inlined, one tile and no copy of the walk: the producer's registers
 * spilled with two tiles. */
template <int kOps, int kKind>
__device__ __forceinline__ bool
locate_produced (const GemmParams &p, uint32_t t, uint32_t total, bool pair, Walk &walk, Tile &tile,
                 bool &shares_b, bool &phantom)
{
  uint32_t wanted = t;

  for (;;)
    {
      if (locate_listed<kOps, kKind> (p, wanted, total, walk, tile))
        break;
      if (!pair || (t & 1) == 0 || wanted != t)
        return false;
      walk = Walk ();
      wanted = t - 1;
    }
  phantom = wanted != t;
  shares_b = pair && !phantom && is_direct<kOps, kKind> (p) && partner_shares_b<kOps, kKind> (p, t, walk, tile);
  return true;
}

/* What the epilogue needs of a tile's group on the direct schedule, where
 * the plan has it in its GroupWork: the group's C from its first row;
 * FPROP and DGRAD never accumulate. */
template <int kOps, int kKind>
__device__ __forceinline__ GroupWork
group_work (const GemmParams &p, const Tile &tile)
{
  const DirectSchedule &d = p.direct;
  GroupWork w = {};

  w.c = d.c_data + (uint64_t) tile.row_base * d.c_row_bytes;
  w.bias = d.bias != nullptr ? d.bias + tile.group * d.bias_stride : nullptr;
  w.rows = tile.rows;
  w.scale = 1.0f;   /* per-tensor FP8: the scales come with the tile's first stage */
  return w;
}

/* Whether A and B arrive MN-major (16-bit DGRAD and WGRAD). FP8 operands
 * are always K-major: the transposed ones are the quantizer's columnwise
 * copies. */
template <int kOps, int kKind>
struct Layout
{
  static constexpr bool kTransA = !Config<kOps>::kFp8 && kKind == GMLP_KERNEL_GEMM_WGRAD;
  static constexpr bool kTransB = !Config<kOps>::kFp8 && kKind != GMLP_KERNEL_GEMM_FPROP;
};

/* Blockwise FP8: the producer warpgroup's warps that copy the scales
 * (its first warp issues the operands' copies). When the operands' warp
 * copied them too, its issue time per stage outlasted the products, and
 * the consumers waited for stages. Each scale warp copies its share of
 * every block of kScaleDepth stages: FPROP and DGRAD, A's rows 64 share +
 * r (and the first warp B's tile scales); WGRAD, A's 128 rows (the first
 * warp) or B's 128 columns (the second). */
constexpr int kScaleWarps = 2;

/* Blockwise FP8 FPROP and DGRAD: the scales of B's 128 × 128 blocks that
 * a stage's promotion takes. A narrow tile's 128 columns lie in one block;
 * the 192 of a wide tile start at a multiple of 192, so at 0 or 64 within
 * a block, and each of their 64-column thirds lies in one block: the scale
 * warp copies one scale per third (the same block's twice, or two), and
 * the promotion takes column c's from third c / 64, with no test of where
 * the tile starts. */
template <int kOps>
struct TileScales
{
  static constexpr int value = Config<kOps>::kWide ? 3 : 1;
};

/* The scale buffers of blockwise FP8 (Config::kScaleBufs of them), each
 * guarded by a "full" mbarrier (the scale warps' copies landed) and an
 * "empty" one (the consumers' 256 threads done with it); count is how many
 * blocks the holder has taken so far, which gives the buffer and parity
 * of the next. */
struct ScaleBlocks
{
  float    *data;
  uint64_t *full;
  uint64_t *empty;
  uint32_t  count;
};

/* Moves to the next stage of the ring. */
template <int kStages>
__device__ __forceinline__ void
next_stage (uint32_t &stage, uint32_t &phase)
{
  if (++stage == kStages)
    {
      stage = 0;
      phase ^= 1;
    }
}

}  // namespace sm90
}  // namespace gmlp
