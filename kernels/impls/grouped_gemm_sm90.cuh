/* impls/grouped_gemm_sm90.cuh: libgmlp's Hopper grouped GEMM, sizes on the device
 *
 * Two launches, neither of which needs the host to know the group sizes,
 * or for FPROP and DGRAD on packed operands the second alone (the direct
 * schedule, DirectSchedule):
 *
 * 1. The plan (one block, grouped_gemm_sm90.cu): scans the device sizes
 *    into each group's member offsets, clamped rows and first output tile,
 *    and writes three TMA tensor maps per group (A, B, C) into the
 *    workspace, copies of the host-built templates edited on the device
 *    (tensormap.replace) to point at the group's matrices with the group's
 *    row count. Rows past a group's end then read as zeros and are not
 *    written, which is what makes any row count work without padding. The
 *    GEMM is launched as its programmatic dependent.
 *
 * 2. The persistent GEMM (one CTA per SM): CTA b takes tiles b, b + grid,
 *    ... of the list of all groups' output tiles. Per CTA, warpgroup 0 is
 *    the producer: its warp finds each tile's group by walking the plan's
 *    tile offsets (or the sizes themselves; each consumer warp walks the
 *    same way), and one thread issues the TMA copies of A and B tiles into
 *    a kStages-deep shared-memory ring, each stage guarded by a "full"
 *    mbarrier (copy bytes landed) and an "empty" one (both consumers
 *    done). With blockwise FP8 scales, two more of its warps copy the
 *    scales into a ring of their own (kScaleDepth stages at a time).
 *    Warpgroups 1 and 2 are the consumers: each multiplies one 64-row half
 *    of the output tile (16-bit: 128 × 256; FP8: 128 × 128 or 128 × 192,
 *    Config) with wgmma (FP32 accumulators in registers) and hands it,
 *    bias added, to TMA stores (reduce-add for an accumulating FP32
 *    output) that drain while the next tile computes; the producer is
 *    already filling the ring for that tile. Large per-tensor FP8
 *    products on the wide tiles run in clusters of two CTAs that share B's
 *    tiles (TMA multicast; Pairable).
 *    A group's last row tile, where it holds 64 rows or fewer, is a short
 *    tile: with per-tensor FP8 both consumers take its 64 rows, half the
 *    columns each (of 192 columns, 128 and 64); in the 16-bit kernels the
 *    first consumer takes them while the second stands idle (IdleHalves).
 *
 * Layouts (C = A · Bᵀ, reduction over r, every matrix row-major):
 *   FPROP  A = x_g   [m × k]  K-major    B = W_g  [n × k]  K-major
 *   DGRAD  A = dy_g  [m × n]  K-major    B = W_g  [n × k]  MN-major
 *   WGRAD  A = dy_g  [m × n]  MN-major   B = x_g  [m × k]  MN-major
 * K-major tiles arrive as one box of 64 reduction elements × rows; MN-major
 * tiles as 64-element chunks of M or N × 64 reduction rows. Both use the
 * 128-byte swizzle that wgmma reads directly.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <atomic>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gmlp-numeric.h"
#include "impls/common.cuh"
#include "impls/grouped_operand.cuh"
#include "impls/sm90_ptx.cuh"
#include "impls/sm90_wgmma.cuh"

namespace gmlp {
namespace sm90 {

constexpr int kBlockM = 128;
constexpr int kChunk = 64;           /* 16-bit elements per 128-byte row */
constexpr int kConsumers = 2;
/* Tensor maps of each group in the plan's list: A, B and C. */
constexpr int kMapsPerGroup = 3;
/* Row tiles of one raster panel (locate_tile()): 2048 rows of A. */
constexpr uint32_t kPanelTiles = 16;
constexpr int kThreads = 128 * (1 + kConsumers);
/* An MN-major tile (16-bit operands only) arrives in chunks of 64
 * elements of M or N × 64 reduction rows. */
constexpr uint32_t kChunkBytes = kChunk * 64 * 2;            /* 8 KiB */
/* The epilogue stages each consumer's 64-row half of the output tile
 * through shared memory, 64 columns of FP32 at a time (staging_index()):
 * the least of a consumer's epilogue buffer (Config::kEpilogueBytes). */
constexpr int kStageCols = 64;
constexpr uint32_t kStagingBytes = 64 * kStageCols * 4;

/* The operand types of a kernel instance: 16-bit floats, or a pair of FP8
 * formats (A's, then B's) with one scale per group, or with blockwise
 * scales (the pairs the layers make: activations or gradients by E4M3
 * operands). */
enum Operands
{
  kOpsBf16 = 0,
  kOpsFp16 = 1,
  kOpsE4m3E4m3 = 2,
  kOpsE4m3E5m2 = 3,
  kOpsE5m2E4m3 = 4,
  kOpsE4m3E4m3Blocks = 5,
  kOpsE5m2E4m3Blocks = 6,
  /* The FP8 pairs on 128 × 192 tiles (Config): per-tensor, then blockwise. */
  kOpsE4m3E4m3Wide = 7,
  kOpsE4m3E5m2Wide = 8,
  kOpsE5m2E4m3Wide = 9,
  kOpsE4m3E4m3BlocksWide = 10,
  kOpsE5m2E4m3BlocksWide = 11,
};

/* The wide instance of an FP8 pair, per-tensor or blockwise. */
constexpr int kWideOffset = kOpsE4m3E4m3Wide - kOpsE4m3E4m3;
static_assert (kOpsE4m3E4m3Blocks + kWideOffset == kOpsE4m3E4m3BlocksWide &&
               kOpsE5m2E4m3Blocks + kWideOffset == kOpsE5m2E4m3BlocksWide,
               "every FP8 pair's wide instance lies kWideOffset further");

/* Whether an operand type's instances take blockwise scales, and 128 × 192
 * tiles: Config's, and the host's for a type known at run time. */
constexpr bool
ops_block_scaled (int ops)
{
  return ops == kOpsE4m3E4m3Blocks || ops == kOpsE5m2E4m3Blocks || ops == kOpsE4m3E4m3BlocksWide ||
         ops == kOpsE5m2E4m3BlocksWide;
}

constexpr bool
ops_wide (int ops)
{
  return ops >= kOpsE4m3E4m3Wide;
}

/* The tile shape and ring of each operand type. Either way a stage holds
 * 128-byte rows: 64 16-bit or 128 FP8 reduction elements. FP8 products
 * are promoted out of the tensor cores' accumulators into a further set of
 * FP32 registers after every stage, or every kPromoteStages (the FP8
 * accumulators keep fewer bits, and long reductions would lose accuracy).
 * On 128 × 128 tiles a consumer has two stages in flight, so it holds three 64 × 128 sets (two of
 * partial sums, one promoted), and the smaller stages make room for a
 * deeper ring. The wide instances, per-tensor and blockwise, take
 * 128 × 192 tiles (a sixth less shared-memory and L2 traffic per product,
 * and fewer tiles for short reductions) with one set of partial sums, each
 * stage's promoted once it lands while the other consumer's products run;
 * the host picks them (wide_tiles()). With blockwise scales a stage is
 * one 128-deep block of the scales: the promotion multiplies it by the
 * scales of its rows (A) and of its 128 × 128 tiles (B; TileScales) or
 * columns (WGRAD's B), which the producer's scale warps copy kScaleDepth
 * stages at a time into kScaleBufs buffers of their own (ScaleBlocks);
 * they take the room of one stage of the ring. Per-tensor FP8 on the direct schedule: the producer
 * copies the group's two scale inverses beside the first stage of each
 * tile (kScaleSlot floats a stage). */
template <int kOps>
struct Config
{
  static constexpr bool kFp8 = kOps >= kOpsE4m3E4m3;
  static constexpr bool kBlockScaled = ops_block_scaled (kOps);
  static constexpr bool kWide = ops_wide (kOps);
  static constexpr bool kBf16 = kOps == kOpsBf16;
  static constexpr bool kAE5m2 = kOps == kOpsE5m2E4m3 || kOps == kOpsE5m2E4m3Blocks || kOps == kOpsE5m2E4m3Wide ||
                                 kOps == kOpsE5m2E4m3BlocksWide;
  static constexpr bool kBE5m2 = kOps == kOpsE4m3E5m2 || kOps == kOpsE4m3E5m2Wide;
  static constexpr int kBlockN = kWide ? 192 : kFp8 ? 128 : 256;
  static constexpr int kBlockK = kFp8 ? 128 : 64;    /* reduction elements of a stage */
  static constexpr int kMmaK = kFp8 ? 32 : 16;       /* of one wgmma */
  /* FP8: sets of partial sums a consumer holds beside the promoted ones. */
  static constexpr int kPartialSets = kFp8 && !kWide ? 2 : 1;
  /* Per-tensor FP8 with one set of partial sums: the stages whose
   * products run into it before each promotion. Two (256 products) are
   * faster than one for a small cost in error (docs/fp8.md has the
   * errors); the long-reduction test, which no promotion fails, checks it.
   * Blockwise scales change every stage, so they promote every one. */
  static constexpr int kPromoteStages = kFp8 && !kBlockScaled && kPartialSets == 1 ? 2 : 1;
  static constexpr int kStages = kWide ? 4 : kBlockScaled ? 5 : kFp8 ? 6 : 4;
  static constexpr int kScaleSlot = kFp8 && !kBlockScaled ? 2 : 0;
  /* Registers per thread of the producer's warpgroup and of each
   * consumer's (setmaxnreg; Ring's for an instance). The narrow blockwise
   * instances' scale warps walk the direct schedule's sizes and A's scale
   * members beside their copies (see DirectCapable): in 40 they spilled. */
  static constexpr int kProducerRegs = kBlockScaled && !kWide ? 56 : 40;
  static constexpr int kConsumerRegs = kBlockScaled && !kWide ? 224 : 232;
  /* Blockwise: the scales of kScaleDepth stages make one copy, so that each
   * 32-byte sector of a row's scales is read from L2 once, not once per
   * stage (4-byte reads, a sector each, added a quarter to the L2 traffic
   * of a product that L2 bounds). A buffer holds A's rows, then B's tile
   * (FPROP, DGRAD) or columns (WGRAD), each depth-major: [d][row]. */
  static constexpr int kScaleDepth = 8;
  static constexpr int kScaleBufs = kBlockScaled ? 2 : 0;
  static constexpr uint32_t kScaleBlockFloats = kBlockScaled ? kScaleDepth * (kBlockM + kBlockN) : 0;
  static constexpr uint32_t kTileABytes = kBlockM * 128;
  static constexpr uint32_t kTileBBytes = kBlockN * 128;
  static constexpr uint32_t kStageBytes = kTileABytes + kTileBBytes;
  /* Each consumer's epilogue buffer: on the per-tensor wide FP8 tiles,
   * room for the 16-bit results of a whole share, which then take one
   * round of stores a tile (write_tile_tma()); elsewhere two 64-column
   * subtiles' (the 16-bit tiles' and the wide blockwise ones' shared
   * memory is full). */
  static constexpr uint32_t kEpilogueBytes = kWide && !kBlockScaled ? 3 * 8192 : kStagingBytes;
  static_assert (kEpilogueBytes >= kStagingBytes, "write_tile() stages 64 columns of FP32");
  /* The shared memory of a ring of `stages`: the ring, the epilogue
   * buffers, the barriers, the staged scales, and slack to align the ring
   * to the 1024 bytes of a swizzle atom. */
  static constexpr uint32_t
  smem_bytes (int stages)
  {
    return stages * kStageBytes + kConsumers * kEpilogueBytes + 2 * (stages + kScaleBufs) * 8 +
           stages * kScaleSlot * 4 + kScaleBufs * kScaleBlockFloats * 4 + 1024;
  }
  static_assert (smem_bytes (kStages) <= 227 * 1024, "the kernel needs more shared memory than an SM has");
};

/* Whether an instance's CTAs can run in pairs, and whether a product's can
 * (the host asks too, pairs_pay(); see "Clusters of two CTAs" below):
 * per-tensor FP8 on the wide tiles, FPROP and DGRAD (FP8 DGRAD runs the
 * FPROP instance). WGRAD reduces over each group's rows, which
 * would put paired CTAs' rings out of step; the 16-bit and narrow FP8
 * instances gained nothing paired, and keep the producer's 40 registers
 * (the pairing code needs 56, and the narrow consumers ran slower in the
 * 224 that leaves them). */
constexpr bool
pairable (int ops, int kind)
{
  return kind != GMLP_KERNEL_GEMM_WGRAD && ops_wide (ops) && !ops_block_scaled (ops);
}

template <int kOps, int kKind>
struct Pairable
{
  static constexpr bool value = pairable (kOps, kKind);
};

/* The ring of an instance: its operand type's (Config), but the wide FP8
 * WGRAD takes one stage fewer: 3 stages against 4 are faster for the wide
 * WGRAD and slower for the wide FPROP, which keeps 4. Its registers:
 * Config's, but a pairable instance's producer needs 56. */
template <int kOps, int kKind>
struct Ring
{
  using Cfg = Config<kOps>;
  static constexpr int kStages = Cfg::kWide && kKind == GMLP_KERNEL_GEMM_WGRAD ? Cfg::kStages - 1 : Cfg::kStages;
  static constexpr uint32_t kSmemBytes = Cfg::smem_bytes (kStages);
  static constexpr int kProducerRegs = Pairable<kOps, kKind>::value ? 56 : Cfg::kProducerRegs;
  static constexpr int kConsumerRegs = Pairable<kOps, kKind>::value ? 224 : Cfg::kConsumerRegs;
  /* A CTA holds what its 384 threads got at launch, 168 each (the most in
   * steps of 8 within the SM's 64K): setmaxnreg.inc waits for registers
   * that setmaxnreg.dec gave back, forever where it asks for more. */
  static_assert (128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * 168, "more registers than a CTA holds");
};

/* The widest output tile of any instance (the host's coordinate bound). */
constexpr int kMaxBlockN = 256;


/* What the GEMM needs of each group, written by the plan. */
struct GroupWork
{
  void        *c;           /* output matrix of the group */
  const void  *bias;        /* FPROP: bias_g or NULL */
  const float *a_scales;    /* blockwise FP8: the group's scale inverses */
  const float *b_scales;
  int64_t      rows;        /* m_g, clamped */
  uint32_t     accumulate;  /* WGRAD: add into c */
  float        scale;       /* per-tensor FP8: the product of A's and B's scale inverses; else 1 */
};


/* The direct schedule (FPROP and DGRAD, where the host finds every member
 * of A and C one row after another, the groups' B matrices, biases and
 * per-tensor scales or B's blockwise scales equally spaced, and A's
 * blockwise scales laid out by the sizes, scale_member_offset()): no plan. The
 * maps are the host's, over whole tensors (A and C: their capacity rows;
 * B: one plane per group), and each CTA walks the sizes itself
 * (locate_direct()). A tile's rows past its group's end are the next
 * group's, read but never stored: a consumer half that holds any copies
 * its group's rows out itself (copy_clipped(); an FP32 C through
 * write_tile()). Saves the plan's launch, a large part of a small
 * product's time. */
constexpr uint32_t kDirectHostGroups = 512;

struct DirectSchedule
{
  TensorMap      a;
  TensorMap      b;
  TensorMap      c;
  const int64_t *device_rows;   /* or NULL: the sizes are host_rows */
  int64_t        capacity;      /* rows that A and C both hold */
  uint8_t       *c_data;
  uint64_t       c_row_bytes;
  const uint8_t *bias;          /* group g's at bias + g * bias_stride, or NULL */
  uint64_t       bias_stride;
  const uint8_t *a_scale;       /* FP8: group g's scale inverses, the same way */
  const uint8_t *b_scale;       /* (blockwise: B's, the group's 128 × 128 blocks) */
  uint64_t       a_scale_stride;
  uint64_t       b_scale_stride;
  GroupedOperand a_scales;      /* blockwise: A's, member g group g's rows' */
  uint32_t       host_rows[kDirectHostGroups];   /* clamped to capacity */
};

struct GemmParams
{
  DirectSchedule   direct;          /* when use_direct */
  uint32_t         use_direct;
  uint32_t         short_tiles;     /* short_tile(), idle_half(): see short_tiles_on() */
  const uint32_t  *tile_begin;
  const GroupWork *groups;
  const TensorMap *maps;
  uint32_t         n_groups;
  uint32_t         tiles_n;         /* output tiles across */
  uint32_t         tiles_m_fixed;   /* WGRAD */
  int64_t          out_rows_fixed;  /* WGRAD: n */
  int64_t          out_cols;        /* columns and leading dimension of C */
  int64_t          reduction;       /* FPROP: k, DGRAD: n; WGRAD: m_g */
  int              c_dtype;
  /* Blockwise FP8: the strides (the row blocks are the instance's: 1 for
   * A, 128 for B, 1 for WGRAD's B; checked on the host). */
  GmlpKernelFp8Scales a_scales;
  GmlpKernelFp8Scales b_scales;
  /* Paired CTAs (pairs_pay()): the direct schedule's B in boxes of half a
   * tile's rows. (Last, so that the other fields' offsets, and the code of
   * the instances that never pair, stay as they were.) */
  uint32_t         pairs;
  TensorMap        b_half;
  /* Whether as few CTAs take tiles as keep the waves (working_ctas()). */
  uint32_t         even_waves;
  /* Whether the last tiles' reductions may be split across CTAs
   * (TailSplit), and the room of the split tiles' partial sums and flags
   * (the workspace's; the flags zeroed before the launch). */
  uint32_t         stream_k;
  float           *partials;
  uint32_t        *partial_flags;
};

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

template <int kOps, int kKind>
__global__ void __launch_bounds__ (kThreads, 1)
gemm_kernel (const __grid_constant__ GemmParams p)
{
  using Cfg = Config<kOps>;
  constexpr int kStages = Ring<kOps, kKind>::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t *ring = reinterpret_cast<uint8_t *> (
    (reinterpret_cast<uintptr_t> (smem_raw) + 1023) & ~(uintptr_t) 1023);
  float *staging = reinterpret_cast<float *> (ring + kStages * Cfg::kStageBytes);
  uint64_t *full = reinterpret_cast<uint64_t *> (ring + kStages * Cfg::kStageBytes +
                                                 kConsumers * Cfg::kEpilogueBytes);
  uint64_t *empty = full + kStages;
  uint64_t *scale_full = empty + kStages;
  uint64_t *scale_empty = scale_full + Cfg::kScaleBufs;
  float *scales = reinterpret_cast<float *> (scale_empty + Cfg::kScaleBufs);
  ScaleBlocks sb = { scales + kStages * Cfg::kScaleSlot, scale_full, scale_empty, 0 };
  /* Broadcast, so that the compiler knows it is the same across a warp
   * and keeps what derives from it (the consumers' wgmma descriptors) in
   * uniform registers. */
  const int warpgroup = __shfl_sync (0xffffffffu, threadIdx.x / 128, 0);

  if (threadIdx.x == 0)
    {
      /* A stage is full once the producer's leader has armed it for the
       * operands' bytes (copied per-tensor scales: and its copies have
       * landed); both consumers give it back. A blockwise scale buffer is
       * full once the scale warps' lanes' copies have landed; the
       * consumers' 256 threads give it back. */
      for (int s = 0; s < kStages; s++)
        {
          mbarrier_init (&full[s], copies_tile_scales<kOps, kKind> (p) ? 2 : 1);
          mbarrier_init (&empty[s], kConsumers * (paired<kOps, kKind> () ? 2 : 1));
        }
      for (int b = 0; b < Cfg::kScaleBufs; b++)
        {
          mbarrier_init (&scale_full[b], 32 * kScaleWarps);
          mbarrier_init (&scale_empty[b], 128 * kConsumers);
        }
      mbarrier_init_fence ();
    }
  /* Paired CTAs: the partner's barriers are ready before anything of
   * this CTA's reaches them. */
  if (paired<kOps, kKind> ())
    cluster_sync ();
  else
    __syncthreads ();
  /* Launched as a programmatic dependent (of the plan, or on the direct
   * schedule of whatever came before): what it wrote is read from here on. */
  grid_dependency_wait ();
  /* The stream-K tail's split (TailSplit), or none. Every warp works it
   * out (a warp alone, diverged from the others, made ptxas spill the
   * consumers' sums); a split tail takes every CTA of the grid. */
  bool split = false;

  if constexpr (StreamKCapable<kOps, kKind>::value)
    {
      const TailSplit mine = p.stream_k ? plan_tail_split<kOps, kKind> (p) : TailSplit { UINT32_MAX, 0, 0, 0 };

      if (threadIdx.x == 0)
        tail_split = mine;
      __syncthreads ();
      split = mine.whole_tiles != UINT32_MAX;
    }
  /* (Each warp counts for itself: the sizes are read-only, and hit in L1.) */
  const uint32_t ctas = split ? gridDim.x : working_ctas<kOps, kKind> (p);

  if (warpgroup == 0)
    {
      const int warp = threadIdx.x / 32;

      registers_decrease<Ring<kOps, kKind>::kProducerRegs> ();
      if (warp == 0)
        {
          produce<kOps, kKind> (p, ctas, ring, scales, full, empty);
        }
      else if constexpr (Cfg::kBlockScaled)
        {
          if (warp <= kScaleWarps)
            produce_scales<kOps, kKind> (p, ctas, sb, warp - 1);
        }
    }
  else
    {
      registers_increase<Ring<kOps, kKind>::kConsumerRegs> ();
      consume<kOps, kKind> (p, ctas, ring, scales, sb, full, empty,
                            staging + (warpgroup - 1) * (Cfg::kEpilogueBytes / 4), warpgroup - 1);
    }
  /* Paired CTAs: neither leaves while the other's consumers may still
   * give stages back to it. */
  if (paired<kOps, kKind> ())
    cluster_sync ();
}

}  // namespace sm90
}  // namespace gmlp

namespace gmlp {
namespace sm90 {

/* Enqueues gemm_kernel<kOps, kKind>; the instances are spread over files
 * of their own (grouped_gemm_sm90_<kind>.cu) so that they compile in
 * parallel. FP8 DGRAD runs the FPROP instance: with K-major operands the
 * two differ only in the bias, which DGRAD never has. */
template <int kOps, int kKind>
GmlpKernelStatus launch_gemm (const GemmParams &params, int n_sms, cudaStream_t stream);

/* The launch attribute of clusters of two CTAs along x (paired CTAs). */
inline cudaLaunchAttribute
pair_clusters ()
{
  cudaLaunchAttribute attribute;

  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = 2;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  return attribute;
}

/* Whether gemm_kernel<kOps, kKind> can run in clusters of two CTAs
 * (Pairable): an even n_sms, and that many CTAs fitting at once in pairs
 * (on the H200, 66 pairs on its 132 SMs). The count of pairs that fit is
 * asked once per instance and device. */
template <int kOps, int kKind>
bool
pairs_fit (int n_sms)
{
  static std::atomic<int> asked_device (-1), pairs (0);
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attribute = pair_clusters ();
  int device, fit = 0;

  if (!Pairable<kOps, kKind>::value || n_sms % 2 != 0 || cudaGetDevice (&device) != cudaSuccess)
    return false;
  if (asked_device.load () != device)
    {
      config.gridDim = dim3 (n_sms);
      config.blockDim = dim3 (kThreads);
      config.dynamicSmemBytes = Ring<kOps, kKind>::kSmemBytes;
      config.attrs = &attribute;
      config.numAttrs = 1;
      if (cudaOccupancyMaxActiveClusters (&fit, gemm_kernel<kOps, kKind>, &config) != cudaSuccess)
        {
          (void) cudaGetLastError ();
          fit = 0;
        }
      pairs.store (fit);
      asked_device.store (device);
    }
  return 2 * pairs.load () >= n_sms;
}

#define GMLP_SM90_DEFINE_LAUNCH(kOpsArg, kKindArg)                                  \
  template <>                                                                       \
  GmlpKernelStatus                                                                  \
  launch_gemm<kOpsArg, kKindArg> (const GemmParams &params, int n_sms,              \
                                  cudaStream_t stream)                              \
  {                                                                                 \
    cudaLaunchConfig_t config = {};                                                 \
    cudaLaunchAttribute attributes[2];                                              \
    cudaError_t err;                                                                \
                                                                                    \
    /* Set on every call: the attribute belongs to the current device. */           \
    err = cudaFuncSetAttribute (gemm_kernel<kOpsArg, kKindArg>,                     \
                                cudaFuncAttributeMaxDynamicSharedMemorySize,        \
                                (Ring<kOpsArg, kKindArg>::kSmemBytes));             \
    if (err != cudaSuccess)                                                         \
      return record_cuda_error (err);                                               \
    /* A dependent of the plan (programmatic stream serialization): its CTAs     \
     * set up while the plan runs. */                                               \
    attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;          \
    attributes[0].val.programmaticStreamSerializationAllowed = 1;                   \
    config.numAttrs = 1;                                                            \
    if (params.pairs && pairs_fit<kOpsArg, kKindArg> (n_sms))                       \
      {                                                                             \
        attributes[1] = pair_clusters ();                                           \
        config.numAttrs = 2;                                                        \
      }                                                                             \
    config.gridDim = dim3 (n_sms);                                                  \
    config.blockDim = dim3 (kThreads);                                              \
    config.dynamicSmemBytes = Ring<kOpsArg, kKindArg>::kSmemBytes;                  \
    config.stream = stream;                                                         \
    config.attrs = attributes;                                                      \
    err = cudaLaunchKernelEx (&config, gemm_kernel<kOpsArg, kKindArg>, params);      \
    if (err != cudaSuccess)                                                         \
      return record_cuda_error (err);                                               \
    return check_launch ();                                                         \
  }

}  // namespace sm90
}  // namespace gmlp
