/* impls/grouped_quantize.cuh: FP8 quantization of a grouped tensor
 *
 * One launch quantizes every group. Its tiles are every group's 128-row
 * bands cut into 128-column tiles, in group order, and each block takes an
 * equal, contiguous share of them (start_walk()): a group holding most rows
 * gets most blocks, and a block crosses few group boundaries. The number of
 * tiles depends on the sizes, which are read on the device only: every
 * block scans them (clamped to the row capacity as every kernel clamps
 * them) to find its share, then where its first group's members lie in
 * every output (locate_group()), and walks on from group to group.
 *
 * Whole rows of 16-byte units (vector_ok) are loaded 16 bytes at a time,
 * every load of a tile issued before any value is used. Per-tensor recipes
 * encode each value once from registers, write the rowwise bytes 8 at a
 * time, and stage the FP8 bytes in shared memory only for the columnwise
 * (transposed) copy, written 16 bytes at a time where the group's rows are
 * a multiple of 16. Block recipes stage each tile as float, work out the
 * scales of the blocks inside it (1 × 32, 1 × 128, 32 × 1, 128 × 1 or the
 * whole 128 × 128 tile), write them, then the rowwise and columnwise FP8
 * values.
 *
 * Per-tensor recipes take their scale from the group as a whole: DELAYED
 * from the quantizer's state (and max-es the tiles' amaxes into it), CURRENT
 * from an amax that a first launch of the same kernel (kPassAmax) computes.
 * All the arithmetic is gmlp-quantize-numeric.h's, shared with the CPU
 * backend, so both give the same bits; amaxes are combined with atomicMax on
 * their bit patterns, which is exact in any order.
 *
 * The kernel's body, quantize_grouped_tiles(), takes where the values of a
 * tile come from as its Source, so that the fused activation and
 * quantization (grouped_activation_quantize.cuh) is the same code; so are
 * the host's checks, description and launches (at the end), shared by
 * quantize.cu and activation_quantize.cu.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <cub/block/block_scan.cuh>
#include <cuda_fp8.h>

#include "gmlp-quantize-numeric.h"
#include "impls/common.cuh"

namespace gmlp {

constexpr int kQuantThreads = 256;
constexpr int kQuantWarps = kQuantThreads / 32;
/* Blocks an SM holds at least (the registers a thread may use): enough
 * loads in flight to keep memory busy while other blocks compute. */
constexpr int kQuantMinBlocks = 2;
constexpr int kQuantTile = kGmlpQuantTile;
/* NOTE: one float of padding per row: a warp reading down a column hits 32
 * different banks. */
constexpr int kQuantTilePitch = kQuantTile + 1;
/* The float tile of the block recipes' general path, and its blocks'
 * scales, rowwise and columnwise. */
constexpr size_t kQuantTileBytes = sizeof (float) * kQuantTile * kQuantTilePitch +
                                   2 * sizeof (GmlpQuantBlockScale) * kQuantTile * (kQuantTile / kGmlpQuantMxBlock);
/* The most scale blocks a tile holds: 128 rows × 4 MX blocks, or 4 MX
 * blocks down × 128 columns. */
constexpr int kQuantMaxTileBlocks = kQuantTile * (kQuantTile / kGmlpQuantMxBlock);

static_assert (kQuantTile % kGmlpQuantMxBlock == 0, "MX blocks tile the 128 × 128 tiles");
static_assert (kQuantThreads % 32 == 0 && kQuantWarps <= 32, "whole warps, one reduction round");

/* Layouts of the operands, in the order of GroupedQuantizeParams::layouts. */
enum {
  kLayoutSrc = 0,
  kLayoutData = 1,         /* the FP8 data and the columnwise copy */
  kLayoutScale = 2,
  kLayoutColumnScale = 3,
  kLayoutDst = 3,          /* dequantize: the output */
  kMaxLayouts = 4,
};

/* A grouped layout: member i has gmlp_quant_blocks_along (m_i, row_block)
 * rows of row_bytes bytes (row_block 1: m_i rows; 0: one row). */
struct QuantLayout
{
  int64_t   row_block;
  uint64_t  row_bytes;
};

/* Where a group lies: its clamped rows, the rows of the groups before it
 * (clamped to the capacity) and its member offsets. */
struct GroupPlace
{
  int64_t   rows;
  int64_t   before;
  uint64_t  offset[kMaxLayouts];
};

enum QuantPass
{
  kPassAmax = 0,       /* CURRENT only: the per-group amax, nothing else */
  kPassQuantize = 1,
};

struct GroupedQuantizeParams
{
  const int64_t *device_rows;
  uint32_t       n_groups;
  int64_t        cols;
  int64_t        row_capacity;
  int            recipe;
  int            flags;
  int            src_dtype;
  int            fp8_dtype;
  const uint8_t *src;
  uint8_t       *data;
  uint8_t       *scale_inv;
  uint8_t       *columnwise;            /* or nullptr */
  uint8_t       *columnwise_scale_inv;  /* or nullptr: shares the rowwise scales */
  int64_t       *derived_rows;          /* or nullptr */
  int64_t        derived_block;
  float         *state;                 /* DELAYED */
  uint32_t       state_stride;
  uint32_t      *amax;                  /* CURRENT: n_groups amax bit patterns */
  int64_t        block_rows, block_cols;            /* rowwise blocks, 0: per tensor */
  int64_t        col_block_rows, col_block_cols;    /* columnwise blocks */
  int64_t        scale_cols, col_scale_cols;
  uint32_t       scale_size;            /* 4, or 1 for E8M0 */
  int            n_layouts;
  QuantLayout    layouts[kMaxLayouts];
  /* Rows of whole 16-byte units in every operand (the source's rows and the
   * FP8 rows multiples of 8 values, the pointers aligned): whole tiles load
   * 8 values and store 8 FP8 bytes at once. */
  int            vector_ok;
};

struct GroupedDequantizeParams
{
  const int64_t *device_rows;
  uint32_t       n_groups;
  int64_t        cols;
  int64_t        row_capacity;
  int            recipe;
  int            fp8_dtype;
  int            dst_dtype;
  const uint8_t *data;
  const uint8_t *scale_inv;
  uint8_t       *dst;
  int64_t        block_rows, block_cols;
  int64_t        scale_cols;
  int            n_layouts;
  QuantLayout    layouts[kMaxLayouts];
};

/* Warp 0 of a block: the clamped rows of group g and its offsets in each
 * layout, into *place (lane 0 writes). A group gets the rows that are left
 * of the capacity after the groups before it (docs/memory-layout.md). */
__device__ __forceinline__ void
locate_group (const int64_t     *device_rows,
              int64_t            capacity,
              const QuantLayout *layouts,
              int                n_layouts,
              uint32_t           g,
              GroupPlace        *place)
{
  const int lane = threadIdx.x % 32;
  int64_t before = 0;             /* rows of the groups so far, clamped */
  uint64_t offset[kMaxLayouts] = { 0, 0, 0, 0 };

  for (uint32_t base = 0; base < g; base += 32)
    {
      const uint32_t j = base + lane;
      int64_t r = j < g ? device_rows[j] : 0;
      int64_t incl, excl, left, clamped;

      r = r < 0 ? 0 : (r > capacity ? capacity : r);
      incl = r;
#pragma unroll
      for (int d = 1; d < 32; d *= 2)
        {
          int64_t other = __shfl_up_sync (0xffffffffu, incl, d);
          if (lane >= d)
            incl += other;
        }
      excl = before + incl - r;
      left = capacity - (excl < capacity ? excl : capacity);
      clamped = r < left ? r : left;

      for (int l = 0; l < n_layouts; l++)
        {
          uint64_t s = j < g ? gmlp_num_member_stride (gmlp_quant_blocks_along (clamped, layouts[l].row_block),
                                                       layouts[l].row_bytes)
                             : 0;
#pragma unroll
          for (int d = 16; d > 0; d /= 2)
            s += __shfl_down_sync (0xffffffffu, s, d);
          offset[l] += __shfl_sync (0xffffffffu, s, 0);
        }
      before += __shfl_sync (0xffffffffu, incl, 31);
      if (before > capacity)
        before = capacity;
    }

  if (lane == 0)
    {
      int64_t r = device_rows[g];
      int64_t left = capacity - before;

      r = r < 0 ? 0 : r;
      place->rows = r < left ? r : left;
      place->before = before;
      for (int l = 0; l < kMaxLayouts; l++)
        place->offset[l] = offset[l];
    }
}

/* The maximum of v over aligned groups of kLanes lanes (32: the warp). */
template <int kLanes = 32>
__device__ __forceinline__ uint32_t
warp_max (uint32_t v)
{
#pragma unroll
  for (int d = kLanes / 2; d > 0; d /= 2)
    {
      uint32_t other = __shfl_xor_sync (0xffffffffu, v, d);
      v = other > v ? other : v;
    }
  return v;
}

/* The maximum of v over the block; every thread must call it. */
__device__ __forceinline__ uint32_t
block_max (uint32_t v, uint32_t *scratch)
{
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  v = warp_max (v);
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads ();
  v = lane < kQuantWarps ? scratch[lane] : 0;
  v = warp_max (v);
  __syncthreads ();   /* scratch may be reused at once */
  return v;
}

/* Writes the scale of block (bi, bj) of a scale grid of scale_cols columns. */
__device__ __forceinline__ void
store_scale (uint8_t                   *scales,
             int64_t                    index,
             uint32_t                   scale_size,
             const GmlpQuantBlockScale &s)
{
  if (scale_size == 1)
    scales[index] = s.e8m0;
  else
    ((float *) scales)[index] = s.scale_inv;
}

/* The scale blocks of geometry block_rows × block_cols (neither 0) inside
 * the tile at (r0, c0), tr × tc of it in range: their scales into out[]
 * (indexed (r / block_rows) × (kQuantTile / block_cols) + c / block_cols)
 * and into the scale grid. Every thread must call it. */
__device__ __forceinline__ void
tile_block_scales (const GroupedQuantizeParams &p,
                   const float                 *tile,
                   int64_t                      block_rows,
                   int64_t                      block_cols,
                   int64_t                      r0,
                   int64_t                      c0,
                   int                          tr,
                   int                          tc,
                   uint8_t                     *scales,
                   int64_t                      scale_cols,
                   GmlpQuantBlockScale         *out,
                   uint32_t                    *scratch)
{
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int br = (int) block_rows, bc = (int) block_cols;
  const int per_row = kQuantTile / bc;
  const int n_blocks = (kQuantTile / br) * per_row;

  if (br * bc == kQuantTile * kQuantTile)
    {
      /* One block, the whole tile: a block-wide reduction. */
      uint32_t amax = 0;

      for (int i = threadIdx.x; i < kQuantTile * kQuantTile; i += kQuantThreads)
        amax = gmlp_quant_amax_fold_for (p.recipe, amax, tile[(i / kQuantTile) * kQuantTilePitch + i % kQuantTile]);
      amax = block_max (amax, scratch);
      if (threadIdx.x == 0)
        {
          GmlpQuantBlockScale s = gmlp_quant_block_scale (p.recipe, p.flags, p.fp8_dtype, amax, 0.0f);
          out[0] = s;
          store_scale (scales, (r0 / br) * scale_cols + c0 / bc, p.scale_size, s);
        }
      return;
    }

  /* Blocks of 32 or 128 elements: a warp each. */
  for (int b = warp; b < n_blocks; b += kQuantWarps)
    {
      const int rb = (b / per_row) * br;
      const int cb = (b % per_row) * bc;
      uint32_t amax = 0;

      if (rb >= tr || cb >= tc)
        continue;                       /* wholly outside the member */
      for (int e = lane; e < br * bc; e += 32)
        amax = gmlp_quant_amax_fold_for (p.recipe, amax,
                                         tile[(rb + e / bc) * kQuantTilePitch + cb + e % bc]);
      amax = warp_max (amax);
      if (lane == 0)
        {
          GmlpQuantBlockScale s = gmlp_quant_block_scale (p.recipe, p.flags, p.fp8_dtype, amax, 0.0f);
          out[b] = s;
          store_scale (scales, ((r0 + rb) / br) * scale_cols + (c0 + cb) / bc, p.scale_size, s);
        }
    }
}

/* The scale that element (r, c) of the tile is quantized with, among the
 * scales of the blocks (neither dimension 0) inside it. */
__device__ __forceinline__ const GmlpQuantBlockScale &
tile_scale_at (const GmlpQuantBlockScale *scales,
               int64_t                    block_rows,
               int64_t                    block_cols,
               int                        r,
               int                        c)
{
  return scales[(r / (int) block_rows) * (kQuantTile / (int) block_cols) + c / (int) block_cols];
}

/* A stored value as float, bit for bit as gmlp_num_load_float() widens it:
 * the hardware's half conversion drops a NaN's sign, which FP8 keeps. */
template <int kDtype>
__device__ __forceinline__ float
widen_exact (StorageType<kDtype> v)
{
  if constexpr (kDtype == GMLP_NUM_FLOAT16)
    return (v & 0x7fffu) > 0x7c00u ? gmlp_num_half_to_float (v) : to_float<kDtype> (v);
  else
    return to_float<kDtype> (v);
}

/* Eight consecutive stored values of kDtype as loaded (16 or 32 bytes):
 * kept packed until they are used, which halves the registers that hold
 * a thread's loads in flight. */
template <int kDtype>
struct Chunk8
{
  using Part = Pack<StorageType<kDtype>, 16 / sizeof (StorageType<kDtype>)>;
  Part part[8 * sizeof (StorageType<kDtype>) / 16];
};

/* Elements (row, col .. col + 7) of a row-major array of kDtype, 16-byte
 * aligned: whole 16-byte loads. */
template <int kDtype>
__device__ __forceinline__ Chunk8<kDtype>
load_chunk8 (const StorageType<kDtype> *at)
{
  using Part = typename Chunk8<kDtype>::Part;
  Chunk8<kDtype> chunk;

#pragma unroll
  for (int i = 0; i < (int) (sizeof (chunk.part) / sizeof (Part)); i++)
    chunk.part[i] = ((const Part *) at)[i];
  return chunk;
}

/* A chunk's values as float. */
template <int kDtype>
__device__ __forceinline__ void
widen8 (const Chunk8<kDtype> &chunk, float v[8])
{
  constexpr int kPerPart = 16 / sizeof (StorageType<kDtype>);

#pragma unroll
  for (int e = 0; e < 8; e++)
    v[e] = widen_exact<kDtype> (chunk.part[e / kPerPart].v[e % kPerPart]);
}

/* Where a tile's values come from: quantize_grouped_tiles() asks its
 * Source for element (r0 + r, c0 + c) of the group's member of the source
 * (whose bytes start at member; k columns to a row of the output), as
 * float, and for eight at once, (row, col .. col + 7), when p.vector_ok
 * says the rows allow 16-byte loads: load8() loads them as a Chunk,
 * values8() gives their values. StoredSource reads the
 * stored values; ActivatedSource (grouped_activation_quantize.cuh)
 * computes them. */
template <int kDtype>
struct StoredSource
{
  const GroupedQuantizeParams &p;

  __device__ __forceinline__ float
  operator() (const uint8_t *member, int64_t k, int64_t r0, int64_t c0, int r, int c) const
  {
    return widen_exact<kDtype> (((const StorageType<kDtype> *) member)[(uint64_t) (r0 + r) * (uint64_t) k +
                                                                        (uint64_t) (c0 + c)]);
  }

  using Chunk = Chunk8<kDtype>;

  __device__ __forceinline__ Chunk
  load8 (const uint8_t *member, int64_t k, int64_t row, int64_t col) const
  {
    return load_chunk8<kDtype> ((const StorageType<kDtype> *) member + (uint64_t) row * (uint64_t) k +
                                (uint64_t) col);
  }

  __device__ __forceinline__ void
  values8 (const Chunk &chunk, float v[8]) const
  {
    widen8<kDtype> (chunk, v);
  }
};

/* a × multiplier_a and b × multiplier_b to FP8, as gmlp_quant_encode()
 * does it for scales other than an MX block's NaN scale (per-tensor and
 * blockwise recipes). From
 * sm_89 on, the hardware's conversion, two at a time: it rounds to nearest
 * even and saturates (satfinite: ±Inf and overflow give ±max) exactly as
 * gmlp_num_float_to_fp8() does; NaN keeps its sign and becomes 0x7f as
 * there (scripts/dev/check-fp8-encode.cu compares the two on every float). */
__device__ __forceinline__ uint32_t
encode_pair (float a, float b, float multiplier_a, float multiplier_b, int fp8_dtype)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const float2 v = make_float2 (__fmul_rn (a, multiplier_a), __fmul_rn (b, multiplier_b));
  uint32_t pair = fp8_dtype == GMLP_NUM_FLOAT8_E5M2 ? __nv_cvt_float2_to_fp8x2 (v, __NV_SATFINITE, __NV_E5M2)
                                                    : __nv_cvt_float2_to_fp8x2 (v, __NV_SATFINITE, __NV_E4M3);
  const uint32_t ua = __float_as_uint (a), ub = __float_as_uint (b);

  if ((ua & 0x7fffffffu) > GMLP_QUANT_INF_BITS)
    pair = (pair & 0xff00u) | ((ua >> 24) & 0x80u) | 0x7fu;
  if ((ub & 0x7fffffffu) > GMLP_QUANT_INF_BITS)
    pair = (pair & 0x00ffu) | ((((ub >> 24) & 0x80u) | 0x7fu) << 8);
  return pair;
#else
  GmlpQuantBlockScale sa, sb;

  sa.multiplier = multiplier_a;
  sb.multiplier = multiplier_b;
  sa.nan_block = sb.nan_block = 0;
  return (uint32_t) gmlp_quant_encode (a, &sa, fp8_dtype) | ((uint32_t) gmlp_quant_encode (b, &sb, fp8_dtype) << 8);
#endif
}

/* Where an MX block has the NaN scale (a NaN or an infinity among its
 * values), its multiplier is a NaN: the byte gmlp_quant_encode() gives x
 * then, the NaN scale's 0x7f or x's own NaN. */
__device__ __forceinline__ uint32_t
nan_block_byte (float x)
{
  const uint32_t u = __float_as_uint (x);

  return (u & 0x7fffffffu) > GMLP_QUANT_INF_BITS ? ((u >> 24) & 0x80u) | 0x7fu : 0x7fu;
}

/* encode_pair() with MX multipliers, a NaN one standing for a NaN block. */
__device__ __forceinline__ uint32_t
encode_pair_mx (float a, float b, float multiplier_a, float multiplier_b, int fp8_dtype)
{
  uint32_t pair = encode_pair (a, b, multiplier_a, multiplier_b, fp8_dtype);

  if (isnan (multiplier_a))
    pair = (pair & 0xff00u) | nan_block_byte (a);
  if (isnan (multiplier_b))
    pair = (pair & 0x00ffu) | (nan_block_byte (b) << 8);
  return pair;
}

/* Eight values to FP8, v[e] × multiplier[e], as two words; with kMx by
 * encode_pair_mx() (MX multipliers, a NaN one for a NaN block). */
template <bool kMx = false>
__device__ __forceinline__ uint2
encode8 (const float v[8], const float multiplier[8], int fp8_dtype)
{
  uint32_t pair[4];

#pragma unroll
  for (int i = 0; i < 4; i++)
    pair[i] = kMx ? encode_pair_mx (v[2 * i], v[2 * i + 1], multiplier[2 * i], multiplier[2 * i + 1], fp8_dtype)
                  : encode_pair (v[2 * i], v[2 * i + 1], multiplier[2 * i], multiplier[2 * i + 1], fp8_dtype);
  return make_uint2 (pair[0] | (pair[1] << 16), pair[2] | (pair[3] << 16));
}

/* The same with one multiplier for all eight. */
template <bool kMx = false>
__device__ __forceinline__ uint2
encode8 (const float v[8], float multiplier, int fp8_dtype)
{
  const float each[8] = { multiplier, multiplier, multiplier, multiplier,
                          multiplier, multiplier, multiplier, multiplier };

  return encode8<kMx> (v, each, fp8_dtype);
}

/* Byte j of each of four words, the first word's in the lowest byte. */
__device__ __forceinline__ uint32_t
gather_byte (uint32_t a, uint32_t b, uint32_t c, uint32_t d, int j)
{
  const uint32_t select = (uint32_t) j | ((uint32_t) (j + 4) << 4);

  return __byte_perm (__byte_perm (a, b, select), __byte_perm (c, d, select), 0x5410);
}

/* Bytes of the per-tensor recipes' staged tile: its FP8 values, row-major. */
constexpr size_t kQuantByteTileBytes = (size_t) kQuantTile * kQuantTile;

static_assert (kQuantThreads == 256 && kQuantTile == 128,
               "the per-tensor tile: eight 8-value chunks a thread; 32 × 4 columns by 8 × 16 rows");

/* The staged FP8 tile into the columnwise copy, whose member is k rows of
 * m bytes: thread t moves columns 4 (t % 32) .. + 3 and rows 16 (t / 32)
 * .. + 15 of the tile. The warp reads 32 consecutive words of each row (no
 * bank conflict) and, where its rows are all in the member and m is a
 * multiple of 16, writes one 16-byte run of each of its four columns. */
__device__ __forceinline__ void
write_columnwise_tile (const uint8_t *staged,
                       uint8_t       *columnwise,
                       int64_t        m,
                       int64_t        r0,
                       int64_t        c0,
                       int            tr,
                       int            tc)
{
  const int w = threadIdx.x % 32;
  const int r = 16 * (threadIdx.x / 32), c = 4 * w;

  if (m % 16 == 0 && r + 16 <= tr && c + 4 <= tc)
    {
      uint32_t word[16];

#pragma unroll
      for (int i = 0; i < 16; i++)
        word[i] = ((const uint32_t *) staged)[(r + i) * (kQuantTile / 4) + w];
#pragma unroll
      for (int j = 0; j < 4; j++)
        {
          uint4 out;

          out.x = gather_byte (word[0], word[1], word[2], word[3], j);
          out.y = gather_byte (word[4], word[5], word[6], word[7], j);
          out.z = gather_byte (word[8], word[9], word[10], word[11], j);
          out.w = gather_byte (word[12], word[13], word[14], word[15], j);
          *(uint4 *) (columnwise + (uint64_t) (c0 + c + j) * (uint64_t) m + (uint64_t) (r0 + r)) = out;
        }
      return;
    }

  for (int j = 0; j < 4; j++)
    for (int i = 0; i < 16; i++)
      if (r + i < tr && c + j < tc)
        columnwise[(uint64_t) (c0 + c + j) * (uint64_t) m + (uint64_t) (r0 + r + i)] =
          staged[(r + i) * kQuantTile + c + j];
}

/* One tile of a per-tensor recipe (DELAYED, CURRENT): the scale is the
 * group's, so each value is encoded straight from the registers it was
 * loaded into, once, for both copies; the FP8 bytes are staged only for
 * the columnwise copy's transpose. Folds the tile's amax into amax_target
 * where there is one; the amax pass writes nothing else. Every thread must
 * call it. */
template <typename Source>
__device__ __forceinline__ void
quantize_tile_per_tensor (const GroupedQuantizeParams &p,
                          const Source                &source,
                          bool                         amax_pass,
                          const uint8_t               *src,
                          uint8_t                     *data,
                          uint8_t                     *columnwise,
                          int64_t                      m,
                          int64_t                      r0,
                          int64_t                      c0,
                          int                          tr,
                          int                          tc,
                          float                        multiplier,
                          uint32_t                    *amax_target,
                          uint8_t                     *staged,
                          uint32_t                    *scratch)
{
  constexpr int kChunks = kQuantTile * kQuantTile / 8 / kQuantThreads;
  const int64_t k = p.cols;
  const bool stage = !amax_pass && columnwise != nullptr;
  uint32_t amax = 0;

  if (p.vector_ok)
    {
      /* Every load first, so that all of them are in flight at once. The
       * columns of a tile are a multiple of 8 here, so chunks are wholly in
       * the member or wholly out. */
      typename Source::Chunk chunks[kChunks];

#pragma unroll
      for (int i = 0; i < kChunks; i++)
        {
          const int q = threadIdx.x + i * kQuantThreads;
          const int r = q / (kQuantTile / 8), c = (q % (kQuantTile / 8)) * 8;

          if (r < tr && c < tc)
            chunks[i] = source.load8 (src, k, r0 + r, c0 + c);
        }
#pragma unroll
      for (int i = 0; i < kChunks; i++)
        {
          const int q = threadIdx.x + i * kQuantThreads;
          const int r = q / (kQuantTile / 8), c = (q % (kQuantTile / 8)) * 8;
          float v[8];

          if (r >= tr || c >= tc)
            continue;
          source.values8 (chunks[i], v);
          if (amax_target != nullptr)
            for (int e = 0; e < 8; e++)
              amax = gmlp_quant_amax_fold (amax, v[e]);
          if (!amax_pass)
            {
              const uint2 bytes = encode8 (v, multiplier, p.fp8_dtype);

              *(uint2 *) (data + (uint64_t) (r0 + r) * (uint64_t) k + (uint64_t) (c0 + c)) = bytes;
              if (stage)
                *(uint2 *) (staged + r * kQuantTile + c) = bytes;
            }
        }
    }
  else
    {
      for (int i = threadIdx.x; i < kQuantTile * kQuantTile; i += kQuantThreads)
        {
          const int r = i / kQuantTile, c = i % kQuantTile;

          if (r < tr && c < tc)
            {
              const float x = source (src, k, r0, c0, r, c);

              if (amax_target != nullptr)
                amax = gmlp_quant_amax_fold (amax, x);
              if (!amax_pass)
                {
                  const uint8_t b = (uint8_t) encode_pair (x, 0.0f, multiplier, multiplier, p.fp8_dtype);

                  data[(uint64_t) (r0 + r) * (uint64_t) k + (uint64_t) (c0 + c)] = b;
                  if (stage)
                    staged[r * kQuantTile + c] = b;
                }
            }
        }
    }

  if (amax_target != nullptr)
    {
      amax = block_max (amax, scratch);
      if (threadIdx.x == 0 && amax != 0)
        atomicMax (amax_target, amax);
    }
  if (stage)
    {
      __syncthreads ();
      write_columnwise_tile (staged, columnwise, m, r0, c0, tr, tc);
    }
}

/* Where chunk i of this thread lies in a tile: row i × 16 + thread / 16,
 * columns 8 (thread % 16) .. + 7. A half-warp holds a whole row
 * (warp_max<16> () reduces over it). */
__device__ __forceinline__ int
chunk_row (int i)
{
  return (threadIdx.x + i * kQuantThreads) / (kQuantTile / 8);
}

__device__ __forceinline__ int
chunk_col ()
{
  return (threadIdx.x % (kQuantTile / 8)) * 8;
}


/* Rows of a tile one step of chunks covers (a thread's chunks lie this
 * many rows apart), and the dynamic shared memory of the blockwise path:
 * the staged bytes, then each step's partial column amaxes and the
 * columns' multipliers. */
constexpr int kQuantRowsPerStep = kQuantThreads / (kQuantTile / 8);
constexpr size_t kQuantBlockwiseStagingBytes = kQuantByteTileBytes +
                                              sizeof (uint32_t) * kQuantRowsPerStep * kQuantTile +
                                              sizeof (float) * kQuantTile;

/* One tile of BLOCKWISE where rows are whole 16-byte units: from the
 * registers the tile was loaded into, as the per-tensor path. The scale of
 * a 1 × 128 block (a tile row) comes from a half-warp reduction, that of a
 * 128 × 128 block from the whole block; the columnwise copy of 1 × 128
 * activations has 128 × 1 blocks, whose amaxes are reduced through shared
 * memory (col_amax, 16 partial maxima a column) before the columnwise
 * values are encoded with them and staged; weight tiles share their one
 * scale with the copy. Same scales and bytes as quantize_tile_blocks().
 * Every thread must call it. */
template <typename Source>
__device__ __forceinline__ void
quantize_tile_blockwise (const GroupedQuantizeParams &p,
                         const Source                &source,
                         const GroupPlace            &place,
                         int64_t                      r0,
                         int64_t                      c0,
                         int                          tr,
                         int                          tc,
                         uint8_t                     *staged,
                         uint32_t                    *scratch)
{
  constexpr int kChunks = kQuantTile * kQuantTile / 8 / kQuantThreads;
  /* After the staged bytes (kQuantBlockwiseStagingBytes in all). */
  uint32_t (*const col_amax)[kQuantTile] = (uint32_t (*)[kQuantTile]) (staged + kQuantByteTileBytes);
  float *const col_multiplier = (float *) (col_amax + kQuantRowsPerStep);
  const bool weight_tiles = p.block_rows == kQuantTile;
  const int64_t k = p.cols;
  const int c = chunk_col ();
  const uint8_t *src = p.src + place.offset[kLayoutSrc];
  uint8_t *const data = p.data + place.offset[kLayoutData];
  uint8_t *const scales = p.scale_inv + place.offset[kLayoutScale];
  uint8_t *const columnwise = p.columnwise != nullptr ? p.columnwise + place.offset[kLayoutData] : nullptr;
  typename Source::Chunk chunks[kChunks];
  uint32_t amax[kChunks];
  uint32_t tile_amax = 0;
  float multiplier[kChunks];

#pragma unroll
  for (int i = 0; i < kChunks; i++)
    if (chunk_row (i) < tr && c < tc)
      chunks[i] = source.load8 (src, k, r0 + chunk_row (i), c0 + c);

  /* The amax of each chunk, and partial column amaxes. */
  {
    uint32_t column[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };

#pragma unroll
    for (int i = 0; i < kChunks; i++)
      {
        float v[8];

        amax[i] = 0;
        if (chunk_row (i) >= tr || c >= tc)
          continue;
        source.values8 (chunks[i], v);
#pragma unroll
        for (int e = 0; e < 8; e++)
          {
            amax[i] = gmlp_quant_amax_fold (amax[i], v[e]);
            column[e] = gmlp_quant_amax_fold (column[e], v[e]);
          }
        tile_amax = amax[i] > tile_amax ? amax[i] : tile_amax;
      }
    if (!weight_tiles && columnwise != nullptr)
#pragma unroll
      for (int e = 0; e < 8; e++)
        col_amax[threadIdx.x / (kQuantTile / 8)][c + e] = column[e];
  }

  /* The rowwise scales: one a row, or one for the tile. */
  if (weight_tiles)
    {
      const uint32_t whole = block_max (tile_amax, scratch);
      const GmlpQuantBlockScale s = gmlp_quant_block_scale (p.recipe, p.flags, p.fp8_dtype, whole, 0.0f);

      if (threadIdx.x == 0)
        store_scale (scales, (r0 / kQuantTile) * p.scale_cols + c0 / kQuantTile, p.scale_size, s);
#pragma unroll
      for (int i = 0; i < kChunks; i++)
        multiplier[i] = s.multiplier;
    }
  else
    {
#pragma unroll
      for (int i = 0; i < kChunks; i++)
        {
          const GmlpQuantBlockScale s = gmlp_quant_block_scale (p.recipe, p.flags, p.fp8_dtype,
                                                                warp_max<kQuantTile / 8> (amax[i]), 0.0f);

          multiplier[i] = s.multiplier;
          if (threadIdx.x % (kQuantTile / 8) == 0 && chunk_row (i) < tr)
            store_scale (scales, (r0 + chunk_row (i)) * p.scale_cols + c0 / kQuantTile, p.scale_size, s);
        }
    }

  /* The rowwise values; the columnwise ones share them under one scale. */
#pragma unroll
  for (int i = 0; i < kChunks; i++)
    {
      const int r = chunk_row (i);
      float v[8];

      if (r >= tr || c >= tc)
        continue;
      source.values8 (chunks[i], v);
      const uint2 bytes = encode8 (v, multiplier[i], p.fp8_dtype);

      *(uint2 *) (data + (uint64_t) (r0 + r) * (uint64_t) k + (uint64_t) (c0 + c)) = bytes;
      if (weight_tiles && columnwise != nullptr)
        *(uint2 *) (staged + r * kQuantTile + c) = bytes;
    }
  if (columnwise == nullptr)
    return;

  if (!weight_tiles)
    {
      /* The 128 × 1 blocks of the copy: a column's amax, its scale (into
       * the copy's scale grid), then its values. */
      __syncthreads ();
      if (threadIdx.x < kQuantTile && threadIdx.x < tc)
        {
          uint32_t a = 0;

          for (int j = 0; j < kQuantRowsPerStep; j++)
            a = col_amax[j][threadIdx.x] > a ? col_amax[j][threadIdx.x] : a;
          const GmlpQuantBlockScale s = gmlp_quant_block_scale (p.recipe, p.flags, p.fp8_dtype, a, 0.0f);

          col_multiplier[threadIdx.x] = s.multiplier;
          store_scale (p.columnwise_scale_inv + place.offset[kLayoutColumnScale],
                       (r0 / kQuantTile) * p.col_scale_cols + c0 + threadIdx.x, p.scale_size, s);
        }
      __syncthreads ();
#pragma unroll
      for (int i = 0; i < kChunks; i++)
        {
          const int r = chunk_row (i);
          float v[8];

          if (r >= tr || c >= tc)
            continue;
          source.values8 (chunks[i], v);
          *(uint2 *) (staged + r * kQuantTile + c) = encode8 (v, col_multiplier + c, p.fp8_dtype);
        }
    }
  __syncthreads ();
  write_columnwise_tile (staged, columnwise, place.rows, r0, c0, tr, tc);
}

/* An MX block's scale and the multiplier its values are encoded with (a
 * NaN for the NaN scale). */
__device__ __forceinline__ float
mx_multiplier (const GmlpQuantBlockScale &s)
{
  return s.nan_block ? __uint_as_float (0x7fffffffu) : s.multiplier;
}

/* Staging of the MX path, after the staged bytes: each warp's partial
 * amaxes of the copy's 32 × 1 blocks (4 down a tile) and their
 * multipliers. */
constexpr int kQuantMxBlocksDown = kQuantTile / kGmlpQuantMxBlock;
constexpr size_t kQuantMxStagingBytes = kQuantByteTileBytes +
                                       sizeof (uint32_t) * kQuantWarps * kQuantMxBlocksDown * kQuantTile +
                                       sizeof (float) * kQuantMxBlocksDown * kQuantTile;

static_assert (kQuantMxStagingBytes <= kQuantTileBytes, "the MX path stages within the block recipes' tile");

/* Whether quantize_tile_mx() takes the tiles: MXFP8 over whole 16-byte
 * units, the columnwise copy (if any) with scales of its own. */
__device__ __forceinline__ bool
mx_fast_path (const GroupedQuantizeParams &p)
{
  return p.recipe == GMLP_QUANT_MXFP8 && p.vector_ok && p.block_rows == 1 &&
         p.block_cols == kGmlpQuantMxBlock &&
         (p.columnwise == nullptr ||
          (p.columnwise_scale_inv != nullptr && p.col_block_rows == kGmlpQuantMxBlock && p.col_block_cols == 1));
}

/* One tile of MXFP8 where rows are whole 16-byte units: from the registers
 * the tile was loaded into, as the blockwise path. A row's 1 × 32 blocks
 * are four lanes' chunks (a reduction over those lanes); the columnwise
 * copy's 32 × 1 blocks are two chunks of one thread down each column in
 * every warp, reduced through shared memory. Same scales and bytes as
 * quantize_tile_blocks(). Every thread must call it. */
template <typename Source>
__device__ __forceinline__ void
quantize_tile_mx (const GroupedQuantizeParams &p,
                  const Source                &source,
                  const GroupPlace            &place,
                  int64_t                      r0,
                  int64_t                      c0,
                  int                          tr,
                  int                          tc,
                  uint8_t                     *staged,
                  uint32_t                    *scratch)
{
  constexpr int kChunks = kQuantTile * kQuantTile / 8 / kQuantThreads;
  static_assert (kChunks == 2 * kQuantMxBlocksDown && kGmlpQuantMxBlock == 32,
                 "chunks 2j and 2j + 1 of a thread lie in block j down its columns");
  /* After the staged bytes (kQuantMxStagingBytes in all). */
  uint32_t (*const col_amax)[kQuantMxBlocksDown][kQuantTile] =
    (uint32_t (*)[kQuantMxBlocksDown][kQuantTile]) (staged + kQuantByteTileBytes);
  float (*const col_multiplier)[kQuantTile] = (float (*)[kQuantTile]) (col_amax + kQuantWarps);
  const int64_t k = p.cols;
  const int c = chunk_col ();
  const int warp = threadIdx.x / 32;
  const uint8_t *src = p.src + place.offset[kLayoutSrc];
  uint8_t *const data = p.data + place.offset[kLayoutData];
  uint8_t *const scales = p.scale_inv + place.offset[kLayoutScale];
  uint8_t *const columnwise = p.columnwise != nullptr ? p.columnwise + place.offset[kLayoutData] : nullptr;
  typename Source::Chunk chunks[kChunks];
  uint32_t column[8];

#pragma unroll
  for (int i = 0; i < kChunks; i++)
    if (chunk_row (i) < tr && c < tc)
      chunks[i] = source.load8 (src, k, r0 + chunk_row (i), c0 + c);

  /* The rowwise blocks: amax, scale and values, chunk by chunk; and the
   * copy's 32 × 1 blocks folded over each pair of chunks, then over the
   * warp's two half-warps, into the warp's partial amaxes. */
#pragma unroll
  for (int i = 0; i < kChunks; i++)
    {
      const int r = chunk_row (i);
      const bool in = r < tr && c < tc;
      uint32_t amax = 0;
      float v[8];

      if (i % 2 == 0)
#pragma unroll
        for (int e = 0; e < 8; e++)
          column[e] = 0;
      if (in)
        {
          source.values8 (chunks[i], v);
#pragma unroll
          for (int e = 0; e < 8; e++)
            {
              amax = gmlp_quant_amax_fold_mx (amax, v[e]);
              column[e] = gmlp_quant_amax_fold_mx (column[e], v[e]);
            }
        }
      if (i % 2 == 1 && columnwise != nullptr)
#pragma unroll
        for (int e = 0; e < 8; e++)
          {
            const uint32_t other = __shfl_xor_sync (0xffffffffu, column[e], 16);

            if (threadIdx.x % 32 < 16)
              col_amax[warp][i / 2][c + e] = other > column[e] ? other : column[e];
          }
      const GmlpQuantBlockScale s = gmlp_quant_block_scale (p.recipe, p.flags, p.fp8_dtype,
                                                            warp_max<4> (amax), 0.0f);
      const float m = mx_multiplier (s);

      if (!in)
        continue;
      if (threadIdx.x % 4 == 0)
        store_scale (scales, (r0 + r) * p.scale_cols + (c0 + c) / kGmlpQuantMxBlock, p.scale_size, s);

      *(uint2 *) (data + (uint64_t) (r0 + r) * (uint64_t) k + (uint64_t) (c0 + c)) =
        encode8<true> (v, m, p.fp8_dtype);
    }
  if (columnwise == nullptr)
    return;

  /* The copy's blocks: a block's amax over the warps, its scale and
   * multiplier. */
  __syncthreads ();
  for (int b = threadIdx.x; b < kQuantMxBlocksDown * kQuantTile; b += kQuantThreads)
    {
      const int j = b / kQuantTile, col = b % kQuantTile;
      uint32_t amax = 0;

      for (int w = 0; w < kQuantWarps; w++)
        amax = col_amax[w][j][col] > amax ? col_amax[w][j][col] : amax;
      const GmlpQuantBlockScale s = gmlp_quant_block_scale (p.recipe, p.flags, p.fp8_dtype, amax, 0.0f);

      col_multiplier[j][col] = mx_multiplier (s);
      if (j * kGmlpQuantMxBlock < tr && col < tc)
        store_scale (p.columnwise_scale_inv + place.offset[kLayoutColumnScale],
                     (r0 / kGmlpQuantMxBlock + j) * p.col_scale_cols + c0 + col, p.scale_size, s);
    }
  __syncthreads ();
#pragma unroll
  for (int i = 0; i < kChunks; i++)
    {
      const int r = chunk_row (i);
      float v[8];

      if (r >= tr || c >= tc)
        continue;
      source.values8 (chunks[i], v);
      *(uint2 *) (staged + r * kQuantTile + c) = encode8<true> (v, col_multiplier[i / 2] + c, p.fp8_dtype);
    }
  __syncthreads ();
  write_columnwise_tile (staged, columnwise, place.rows, r0, c0, tr, tc);
}

/* One tile of a block recipe (BLOCKWISE, MXFP8): staged as float, the
 * scales of the blocks inside it worked out from the staged values and
 * written, then the rowwise FP8 values and, in the same pass, the
 * columnwise ones, both coalesced (the tile's row pitch of 129 floats keeps
 * the column reads free of bank conflicts). Every thread must call it. */
template <typename Source>
__device__ __forceinline__ void
quantize_tile_blocks (const GroupedQuantizeParams &p,
                      const Source                &source,
                      const GroupPlace            &place,
                      int64_t                      r0,
                      int64_t                      c0,
                      int                          tr,
                      int                          tc,
                      float                       *tile,
                      uint32_t                    *scratch)
{
  /* After the float tile (kQuantTileBytes in all). */
  GmlpQuantBlockScale *const row_scales = (GmlpQuantBlockScale *) (tile + kQuantTile * kQuantTilePitch);
  GmlpQuantBlockScale *const col_scales = row_scales + kQuantMaxTileBlocks;
  const bool own_column_scales = p.columnwise_scale_inv != nullptr;
  const int64_t m = place.rows, k = p.cols;
  const uint8_t *src = p.src + place.offset[kLayoutSrc];

  /* Stage the tile as float; what lies outside the member is 0, which no
   * amax notices. */
  if (p.vector_ok)
    {
      for (int q = threadIdx.x; q < kQuantTile * kQuantTile / 8; q += kQuantThreads)
        {
          const int r = q / (kQuantTile / 8), c = (q % (kQuantTile / 8)) * 8;
          float v[8] = { 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f };

          if (r < tr && c < tc)
            source.values8 (source.load8 (src, k, r0 + r, c0 + c), v);
#pragma unroll
          for (int e = 0; e < 8; e++)
            tile[r * kQuantTilePitch + c + e] = v[e];
        }
    }
  else
    {
      for (int i = threadIdx.x; i < kQuantTile * kQuantTile; i += kQuantThreads)
        {
          const int r = i / kQuantTile, c = i % kQuantTile;

          tile[r * kQuantTilePitch + c] = r < tr && c < tc ? source (src, k, r0, c0, r, c) : 0.0f;
        }
    }
  __syncthreads ();

  tile_block_scales (p, tile, p.block_rows, p.block_cols, r0, c0, tr, tc,
                     p.scale_inv + place.offset[kLayoutScale], p.scale_cols, row_scales, scratch);
  if (own_column_scales && p.columnwise != nullptr)
    tile_block_scales (p, tile, p.col_block_rows, p.col_block_cols, r0, c0, tr, tc,
                       p.columnwise_scale_inv + place.offset[kLayoutColumnScale],
                       p.col_scale_cols, col_scales, scratch);
  __syncthreads ();

  {
    uint8_t *data = p.data + place.offset[kLayoutData];

    for (int i = threadIdx.x; i < kQuantTile * kQuantTile; i += kQuantThreads)
      {
        const int r = i / kQuantTile, c = i % kQuantTile;

        if (r < tr && c < tc)
          data[(uint64_t) (r0 + r) * (uint64_t) k + (uint64_t) (c0 + c)] =
            gmlp_quant_encode (tile[r * kQuantTilePitch + c],
                               &tile_scale_at (row_scales, p.block_rows, p.block_cols, r, c),
                               p.fp8_dtype);
      }
  }

  if (p.columnwise != nullptr)
    {
      /* Member i of the copy is k × m: element (r, c) goes to (c, r).
       * Consecutive threads take consecutive r, so the writes are
       * coalesced and the column reads hit distinct banks. */
      uint8_t *columnwise = p.columnwise + place.offset[kLayoutData];
      const GmlpQuantBlockScale *scales = own_column_scales ? col_scales : row_scales;
      const int64_t br = own_column_scales ? p.col_block_rows : p.block_rows;
      const int64_t bc = own_column_scales ? p.col_block_cols : p.block_cols;

      for (int i = threadIdx.x; i < kQuantTile * kQuantTile; i += kQuantThreads)
        {
          const int c = i / kQuantTile, r = i % kQuantTile;

          if (r < tr && c < tc)
            columnwise[(uint64_t) (c0 + c) * (uint64_t) m + (uint64_t) (r0 + r)] =
              gmlp_quant_encode (tile[r * kQuantTilePitch + c], &tile_scale_at (scales, br, bc, r, c),
                                 p.fp8_dtype);
        }
    }
}

/* ---- The walk over the launch's tiles ------------------------------------
 *
 * The tiles of a launch are every group's 128-row bands, in group order,
 * each band cut into the tiles across the columns. Block b takes one
 * contiguous run of them, an equal share of the total, so that a group
 * holding most rows gets most blocks and a block meets few group
 * boundaries; empty groups have no bands. The total depends on the sizes,
 * which are on the device: every block works it out (scan_group_bands()). */

/* Visits every group in order with its clamped rows, the 128-row bands of
 * the groups before it and its own: visit (j, rows, band_start, bands),
 * one group a thread. Returns the bands of all groups. Every thread must
 * call it. A group gets the rows that are left of the capacity after the
 * groups before it, as locate_group() has it. */
template <typename Visit>
__device__ __forceinline__ int64_t
scan_group_bands (const GroupedQuantizeParams &p, Visit visit)
{
  using Scan = cub::BlockScan<int64_t, kQuantThreads>;
  __shared__ typename Scan::TempStorage temp;
  int64_t rows_before = 0, bands_before = 0;

  for (uint32_t base = 0; base < p.n_groups; base += kQuantThreads)
    {
      const uint32_t j = base + threadIdx.x;
      int64_t r = j < p.n_groups ? p.device_rows[j] : 0;
      int64_t excl, total, bands, band_start, band_total;

      r = r < 0 ? 0 : (r > p.row_capacity ? p.row_capacity : r);
      Scan (temp).ExclusiveSum (r, excl, total);
      __syncthreads ();
      excl += rows_before;
      r = excl >= p.row_capacity ? 0 : (r < p.row_capacity - excl ? r : p.row_capacity - excl);
      bands = gmlp_quant_blocks_along (r, kQuantTile);
      Scan (temp).ExclusiveSum (bands, band_start, band_total);
      __syncthreads ();
      if (j < p.n_groups)
        visit (j, r, bands_before + band_start, bands);
      /* Sums of at most 65535 clamped sizes of at most 2^40: no overflow. */
      rows_before += total;
      bands_before += band_total;
    }
  return bands_before;
}

/* Where a block is in its run of tiles; in shared memory. */
struct TileWalk
{
  GroupPlace  place;          /* the group of the current tile */
  uint32_t    group;
  int64_t     band_start;     /* the group's first band in the launch */
  uint64_t    next, end;      /* the tiles left: [next, end) */
  uint32_t    scaled_group;   /* the group scale and amax_target are of */
  float       multiplier;     /* per-tensor recipes */
  uint32_t   *amax_target;
};

/* Sets walk to this block's run of tiles and the group of its first. Every
 * thread must call it. */
__device__ __forceinline__ void
start_walk (const GroupedQuantizeParams &p, uint64_t tiles_across, TileWalk *walk)
{
  const uint64_t units = (uint64_t) scan_group_bands (p, [] (uint32_t, int64_t, int64_t, int64_t) {}) *
                         tiles_across;
  const uint64_t share = div_up (units, gridDim.x);
  const uint64_t first = (uint64_t) blockIdx.x * share < units ? (uint64_t) blockIdx.x * share : units;
  const int64_t first_band = (int64_t) (first / tiles_across);

  if (threadIdx.x == 0)
    {
      walk->next = first;
      walk->end = first + share < units ? first + share : units;
      walk->group = 0;
      walk->band_start = 0;
      walk->scaled_group = UINT32_MAX;
    }
  __syncthreads ();
  if (first < units)
    {
      scan_group_bands (p, [&] (uint32_t j, int64_t, int64_t band_start, int64_t bands) {
        if (band_start <= first_band && first_band < band_start + bands)
          {
            walk->group = j;
            walk->band_start = band_start;
          }
      });
      __syncthreads ();
      if (threadIdx.x < 32)
        locate_group (p.device_rows, p.row_capacity, p.layouts, p.n_layouts, walk->group, &walk->place);
    }
  __syncthreads ();
}

/* Moves walk on to the next group that has rows (one thread): its offsets
 * follow from the current group's, its rows from what is left. */
__device__ __forceinline__ void
advance_group (const GroupedQuantizeParams &p, TileWalk *walk)
{
  GroupPlace &place = walk->place;

  walk->band_start += gmlp_quant_blocks_along (place.rows, kQuantTile);
  do
    {
      int64_t r;

      for (int l = 0; l < p.n_layouts; l++)
        place.offset[l] += gmlp_num_member_stride (gmlp_quant_blocks_along (place.rows, p.layouts[l].row_block),
                                                   p.layouts[l].row_bytes);
      place.before += place.rows;
      walk->group++;
      r = p.device_rows[walk->group];
      r = r < 0 ? 0 : r;
      place.rows = r < p.row_capacity - place.before ? r : p.row_capacity - place.before;
    }
  while (place.rows == 0 && walk->group + 1 < p.n_groups);
}

/* The scale a per-tensor recipe quantizes group g with. */
__device__ __forceinline__ GmlpQuantBlockScale
member_scale (const GroupedQuantizeParams &p, uint32_t g)
{
  const float delayed = p.recipe == GMLP_QUANT_DELAYED ?
                        p.state[(uint64_t) g * p.state_stride + GMLP_QUANT_STATE_SCALE] : 0.0f;
  const uint32_t amax = p.recipe == GMLP_QUANT_CURRENT ? p.amax[g] : 0u;

  return gmlp_quant_block_scale (p.recipe, p.flags, p.fp8_dtype, amax, delayed);
}

/* What every group needs whatever its rows, once: a per-tensor recipe's
 * scale (an empty group has one too) and the derived sizes. The blocks
 * share the groups out. */
__device__ __forceinline__ void
write_group_headers (const GroupedQuantizeParams &p)
{
  __shared__ GroupPlace place;

  for (uint32_t g = blockIdx.x; g < p.n_groups; g += gridDim.x)
    {
      if (threadIdx.x < 32)
        locate_group (p.device_rows, p.row_capacity, p.layouts, p.n_layouts, g, &place);
      __syncthreads ();
      if (threadIdx.x == 0)
        {
          if (p.block_rows == 0)
            store_scale (p.scale_inv + place.offset[kLayoutScale], 0, p.scale_size, member_scale (p, g));
          if (p.derived_rows != nullptr)
            p.derived_rows[g] = gmlp_quant_blocks_along (place.rows, p.derived_block);
        }
      __syncthreads ();
    }
}

/* The body of the quantize kernels: the block's run of tiles, each from
 * source. Per-tensor recipes stage the FP8 bytes of a tile
 * (kQuantByteTileBytes of dynamic shared memory), block recipes its float
 * values (kQuantTileBytes). The amax pass (CURRENT's first launch) writes
 * nothing but the amaxes. */
template <typename Source>
__device__ __forceinline__ void
quantize_grouped_tiles (const GroupedQuantizeParams &p,
                        const bool                   amax_pass,
                        const Source                &source)
{
  extern __shared__ __align__ (16) uint8_t staging[];
  __shared__ TileWalk walk;
  __shared__ uint32_t scratch[kQuantWarps];
  const bool per_tensor = p.block_rows == 0;
  const uint64_t tiles_across = (uint64_t) gmlp_quant_blocks_along (p.cols, kQuantTile);

  if (!amax_pass)
    write_group_headers (p);
  start_walk (p, tiles_across, &walk);

  for (;;)
    {
      if (threadIdx.x == 0 && walk.next < walk.end)
        {
          const int64_t band = (int64_t) (walk.next / tiles_across);

          while (band >= walk.band_start + gmlp_quant_blocks_along (walk.place.rows, kQuantTile))
            advance_group (p, &walk);
          if (per_tensor && walk.scaled_group != walk.group)
            {
              const uint32_t g = walk.group;

              walk.scaled_group = g;
              walk.multiplier = amax_pass ? 0.0f : member_scale (p, g).multiplier;
              walk.amax_target = p.recipe == GMLP_QUANT_DELAYED ?
                                 (uint32_t *) (p.state + (uint64_t) g * p.state_stride + GMLP_QUANT_STATE_AMAX) :
                                 amax_pass ? p.amax + g : nullptr;
            }
        }
      __syncthreads ();
      if (walk.next >= walk.end)
        break;

      const uint64_t u = walk.next;
      const GroupPlace place = walk.place;
      const int64_t r0 = ((int64_t) (u / tiles_across) - walk.band_start) * kQuantTile;
      const int64_t c0 = (int64_t) (u % tiles_across) * kQuantTile;
      const int tr = (int) (place.rows - r0 < kQuantTile ? place.rows - r0 : kQuantTile);
      const int tc = (int) (p.cols - c0 < kQuantTile ? p.cols - c0 : kQuantTile);
      const float multiplier = walk.multiplier;
      uint32_t *const amax_target = walk.amax_target;

      __syncthreads ();   /* everyone has read walk */
      if (threadIdx.x == 0)
        walk.next = u + 1;

      if (per_tensor)
        quantize_tile_per_tensor (p, source, amax_pass, p.src + place.offset[kLayoutSrc],
                                  p.data + place.offset[kLayoutData],
                                  p.columnwise != nullptr ? p.columnwise + place.offset[kLayoutData] : nullptr,
                                  place.rows, r0, c0, tr, tc, multiplier, amax_target, staging, scratch);
      else if (p.recipe == GMLP_QUANT_BLOCKWISE && p.vector_ok)
        quantize_tile_blockwise (p, source, place, r0, c0, tr, tc, staging, scratch);
      else if (mx_fast_path (p))
        quantize_tile_mx (p, source, place, r0, c0, tr, tc, staging, scratch);
      else
        quantize_tile_blocks (p, source, place, r0, c0, tr, tc, (float *) staging, scratch);
      __syncthreads ();   /* the staging is rewritten next */
    }
}

template <int kPass, int kDtype>
__global__ void __launch_bounds__ (kQuantThreads, kQuantMinBlocks)
grouped_quantize_kernel (const __grid_constant__ GroupedQuantizeParams p)
{
  quantize_grouped_tiles (p, kPass == kPassAmax, StoredSource<kDtype> { p });
}

/* static: defined in a header that several .cu files include. */
static __global__ void __launch_bounds__ (kQuantThreads)
grouped_dequantize_kernel (const __grid_constant__ GroupedDequantizeParams p)
{
  __shared__ GroupPlace place;
  const uint32_t g = blockIdx.y;

  if (threadIdx.x < 32)
    locate_group (p.device_rows, p.row_capacity, p.layouts, p.n_layouts, g, &place);
  __syncthreads ();

  const uint64_t k = (uint64_t) p.cols;
  const uint64_t n = (uint64_t) place.rows * k;
  const uint8_t *data = p.data + place.offset[kLayoutData];
  const uint8_t *scales = p.scale_inv + place.offset[kLayoutScale];
  uint8_t *dst = p.dst + place.offset[kLayoutDst];

  for (uint64_t i = (uint64_t) blockIdx.x * kQuantThreads + threadIdx.x; i < n;
       i += (uint64_t) gridDim.x * kQuantThreads)
    {
      const uint64_t r = i / k, c = i % k;
      const uint64_t bi = p.block_rows ? r / (uint64_t) p.block_rows : 0;
      const uint64_t bj = p.block_cols ? c / (uint64_t) p.block_cols : 0;
      const uint64_t s = bi * (uint64_t) p.scale_cols + bj;
      const float scale_inv = p.recipe == GMLP_QUANT_MXFP8 ? gmlp_quant_e8m0_to_float (scales[s])
                                                           : ((const float *) scales)[s];

      gmlp_num_store_float (dst, p.dst_dtype, i, gmlp_quant_decode (data[i], scale_inv, p.fp8_dtype));
    }
}

/* One thread per group: gmlp_quant_delayed_update() of its state row. */
static __global__ void
quantizer_update_kernel (float   *state,
                         uint32_t n_groups,
                         uint32_t history_length,
                         int      fp8_dtype,
                         int      margin)
{
  const uint64_t g = (uint64_t) blockIdx.x * blockDim.x + threadIdx.x;

  if (g < n_groups)
    gmlp_quant_delayed_update (state + g * gmlp_quant_state_stride (history_length),
                               history_length, fp8_dtype, margin);
}

}  // namespace gmlp
