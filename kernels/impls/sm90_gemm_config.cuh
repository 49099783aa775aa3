/* impls/sm90_gemm_config.cuh: the Hopper grouped GEMM's configuration: tile shapes per operand
 * kind (Config), the ring, the direct schedule's table and the kernel's
 * parameters (GemmParams).
 * impls/grouped_gemm_sm90.cuh describes the whole kernel.
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

}  // namespace sm90
}  // namespace gmlp
