/* impls/grouped_quantize.cuh: FP8 quantization of a grouped tensor
 *
 * One launch quantizes every group: blockIdx.y is the group, and the blocks
 * of a group stride over its 128 × 128 tiles. A block first finds its
 * group's clamped row count and where the group's members lie in every
 * output (a warp-wide scan over the sizes of the groups before it, clamped
 * to the row capacity as every kernel clamps them), so the group sizes are
 * read on the device only. Each tile is staged in shared memory as float;
 * the block then works out the scales of the blocks inside the tile
 * (1 × 32, 1 × 128, 32 × 1, 128 × 1 or the whole 128 × 128 tile), writes
 * them, and writes the rowwise FP8 values and, in the same pass, the
 * columnwise (transposed) ones, both coalesced (the tile's row pitch of 129
 * floats keeps the column reads free of bank conflicts).
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

#include "gmlp-quantize-numeric.h"
#include "impls/common.cuh"

namespace gmlp {

constexpr int kQuantThreads = 256;
constexpr int kQuantWarps = kQuantThreads / 32;
constexpr int kQuantTile = kGmlpQuantTile;
/* NOTE: one float of padding per row: a warp reading down a column hits 32
 * different banks. */
constexpr int kQuantTilePitch = kQuantTile + 1;
constexpr size_t kQuantTileBytes = sizeof (float) * kQuantTile * kQuantTilePitch;
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

/* Where a group lies: its clamped rows and its member offsets. */
struct GroupPlace
{
  int64_t   rows;
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
      for (int l = 0; l < kMaxLayouts; l++)
        place->offset[l] = offset[l];
    }
}

__device__ __forceinline__ uint32_t
warp_max (uint32_t v)
{
#pragma unroll
  for (int d = 16; d > 0; d /= 2)
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

/* The scale that element (r, c) of the tile is quantized with. */
__device__ __forceinline__ const GmlpQuantBlockScale &
tile_scale_at (const GmlpQuantBlockScale *scales,
               const GmlpQuantBlockScale &member,
               int64_t                    block_rows,
               int64_t                    block_cols,
               int                        r,
               int                        c)
{
  if (block_rows == 0)
    return member;
  return scales[(r / (int) block_rows) * (kQuantTile / (int) block_cols) + c / (int) block_cols];
}

/* Where a tile's values come from: quantize_grouped_tiles() asks its
 * Source for element (r0 + r, c0 + c) of the group's member of the source
 * (whose bytes start at member; k columns to a row of the output), as
 * float. StoredSource reads the stored values; ActivatedSource
 * (grouped_activation_quantize.cuh) computes them. */
struct StoredSource
{
  const GroupedQuantizeParams &p;

  __device__ __forceinline__ float
  operator() (const uint8_t *member, int64_t k, int64_t r0, int64_t c0, int r, int c) const
  {
    return gmlp_num_load_float (member, p.src_dtype, (uint64_t) (r0 + r) * (uint64_t) k + (uint64_t) (c0 + c));
  }
};

/* The body of the quantize kernels: the group's tiles, each staged from
 * source and quantized. The amax pass (CURRENT's first launch) stages and
 * reduces the tiles and writes nothing but the amaxes. */
template <typename Source>
__device__ __forceinline__ void
quantize_grouped_tiles (const GroupedQuantizeParams &p,
                        const bool                   amax_pass,
                        const Source                &source)
{
  extern __shared__ float tile[];                      /* kQuantTile × kQuantTilePitch */
  __shared__ GmlpQuantBlockScale row_scales[kQuantMaxTileBlocks];
  __shared__ GmlpQuantBlockScale col_scales[kQuantMaxTileBlocks];
  __shared__ GmlpQuantBlockScale member_scale;
  __shared__ GroupPlace place;
  __shared__ uint32_t scratch[kQuantWarps];

  const uint32_t g = blockIdx.y;
  const bool per_tensor = p.block_rows == 0;
  const bool own_column_scales = p.columnwise_scale_inv != nullptr;
  uint32_t *amax_target = nullptr;

  if (threadIdx.x < 32)
    locate_group (p.device_rows, p.row_capacity, p.layouts, p.n_layouts, g, &place);
  __syncthreads ();

  const int64_t m = place.rows;
  const int64_t k = p.cols;
  const uint8_t *src = p.src + place.offset[kLayoutSrc];

  if (p.recipe == GMLP_QUANT_DELAYED)
    amax_target = (uint32_t *) (p.state + (uint64_t) g * p.state_stride + GMLP_QUANT_STATE_AMAX);
  else if (p.recipe == GMLP_QUANT_CURRENT && amax_pass)
    amax_target = p.amax + g;

  if (!amax_pass && threadIdx.x == 0)
    {
      if (per_tensor)
        {
          float delayed = p.recipe == GMLP_QUANT_DELAYED ?
                          p.state[(uint64_t) g * p.state_stride + GMLP_QUANT_STATE_SCALE] : 0.0f;
          uint32_t amax = p.recipe == GMLP_QUANT_CURRENT ? p.amax[g] : 0u;

          member_scale = gmlp_quant_block_scale (p.recipe, p.flags, p.fp8_dtype, amax, delayed);
          /* Every group has its scale, an empty one too. */
          if (blockIdx.x == 0)
            store_scale (p.scale_inv + place.offset[kLayoutScale], 0, p.scale_size, member_scale);
        }
      if (blockIdx.x == 0 && p.derived_rows != nullptr)
        p.derived_rows[g] = gmlp_quant_blocks_along (m, p.derived_block);
    }
  __syncthreads ();

  const uint64_t tiles_down = (uint64_t) gmlp_quant_blocks_along (m, kQuantTile);
  const uint64_t tiles_across = (uint64_t) gmlp_quant_blocks_along (k, kQuantTile);
  const uint64_t n_tiles = tiles_down * tiles_across;

  for (uint64_t t = blockIdx.x; t < n_tiles; t += gridDim.x)
    {
      const int64_t r0 = (int64_t) (t / tiles_across) * kQuantTile;
      const int64_t c0 = (int64_t) (t % tiles_across) * kQuantTile;
      const int tr = (int) (m - r0 < kQuantTile ? m - r0 : kQuantTile);
      const int tc = (int) (k - c0 < kQuantTile ? k - c0 : kQuantTile);

      /* Stage the tile as float; what lies outside the member is 0, which
       * no amax notices. */
      for (int i = threadIdx.x; i < kQuantTile * kQuantTile; i += kQuantThreads)
        {
          const int r = i / kQuantTile, c = i % kQuantTile;
          float v = 0.0f;

          if (r < tr && c < tc)
            v = source (src, k, r0, c0, r, c);
          tile[r * kQuantTilePitch + c] = v;
        }
      __syncthreads ();

      if (per_tensor)
        {
          if (amax_target != nullptr)
            {
              uint32_t amax = 0;

              for (int i = threadIdx.x; i < kQuantTile * kQuantTile; i += kQuantThreads)
                amax = gmlp_quant_amax_fold (amax, tile[(i / kQuantTile) * kQuantTilePitch + i % kQuantTile]);
              amax = block_max (amax, scratch);
              if (threadIdx.x == 0 && amax != 0)
                atomicMax (amax_target, amax);
            }
          if (amax_pass)
            {
              __syncthreads ();
              continue;
            }
        }
      else
        {
          tile_block_scales (p, tile, p.block_rows, p.block_cols, r0, c0, tr, tc,
                             p.scale_inv + place.offset[kLayoutScale], p.scale_cols, row_scales, scratch);
          if (own_column_scales && p.columnwise != nullptr)
            tile_block_scales (p, tile, p.col_block_rows, p.col_block_cols, r0, c0, tr, tc,
                               p.columnwise_scale_inv + place.offset[kLayoutColumnScale],
                               p.col_scale_cols, col_scales, scratch);
        }
      __syncthreads ();

      {
        uint8_t *data = p.data + place.offset[kLayoutData];

        for (int i = threadIdx.x; i < kQuantTile * kQuantTile; i += kQuantThreads)
          {
            const int r = i / kQuantTile, c = i % kQuantTile;

            if (r < tr && c < tc)
              data[(uint64_t) (r0 + r) * (uint64_t) k + (uint64_t) (c0 + c)] =
                gmlp_quant_encode (tile[r * kQuantTilePitch + c],
                                   &tile_scale_at (row_scales, member_scale, p.block_rows, p.block_cols, r, c),
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
                  gmlp_quant_encode (tile[r * kQuantTilePitch + c],
                                     &tile_scale_at (scales, member_scale, br, bc, r, c),
                                     p.fp8_dtype);
            }
        }
      __syncthreads ();   /* the tile and the scales are rewritten next */
    }
}

template <int kPass>
__global__ void __launch_bounds__ (kQuantThreads)
grouped_quantize_kernel (const __grid_constant__ GroupedQuantizeParams p)
{
  quantize_grouped_tiles (p, kPass == kPassAmax, StoredSource { p });
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

/* ---- Host side, shared by quantize.cu and activation_quantize.cu ---------- */

/* gridDim.y is the group. */
constexpr uint32_t kQuantMaxGroups = 65535;
/* Sizes beyond these are refused: they keep every offset far from overflow
 * (the grouped tensors of libgmlp stay well below). kQuantMaxCols bounds the
 * rows of the source (2f for a gated activation's input). */
constexpr int64_t kQuantMaxRows = int64_t (1) << 40;
constexpr int64_t kQuantMaxCols = int64_t (1) << 31;

static inline bool
is_quant_source_dtype (int dtype)
{
  return dtype == GMLP_NUM_FLOAT32 || dtype == GMLP_NUM_FLOAT16 || dtype == GMLP_NUM_BFLOAT16;
}

static inline bool
is_fp8_dtype (int dtype)
{
  return dtype == GMLP_NUM_FLOAT8_E4M3 || dtype == GMLP_NUM_FLOAT8_E5M2;
}

static inline bool
is_quant_recipe (int recipe)
{
  return recipe >= GMLP_QUANT_DELAYED && recipe <= GMLP_QUANT_MXFP8;
}

/* Sizes on the device, at least one group and one column, and rows within
 * kQuantMaxRows; the callers bound the columns. */
static inline bool
grouped_quant_shape_ok (const GmlpKernelGroupedShape &shape)
{
  return shape.device_rows != nullptr && shape.n_groups >= 1 && shape.cols >= 1 &&
         shape.row_capacity >= 0 && shape.row_capacity <= kQuantMaxRows;
}

static inline GmlpKernelStatus
refuse (const char **reason, const char *why, GmlpKernelStatus status)
{
  *reason = why;
  return status;
}

/* Checks the quantization of a call whose shape the caller has checked and
 * fills in *p; *reason says what is wrong. q is a GmlpKernelQuantize or a
 * GmlpKernelActivationQuantize, which name their shape, scaling and outputs
 * alike; the source is src, src_cols values of src_dtype per row. */
template <typename Call>
inline GmlpKernelStatus
describe_grouped_quantize (const Call            &q,
                           const void            *src,
                           int                    src_dtype,
                           int64_t                src_cols,
                           GroupedQuantizeParams *p,
                           const char           **reason)
{
  int64_t derived;

  if (!is_quant_recipe (q.recipe))
    return refuse (reason, "unknown scaling recipe", GMLP_KERNEL_INVALID_VALUE);
  if (!is_quant_source_dtype (src_dtype))
    return refuse (reason, "the source must be float32, float16 or bfloat16", GMLP_KERNEL_INVALID_VALUE);
  if (!is_fp8_dtype (q.fp8_dtype))
    return refuse (reason, "the target must be an FP8 dtype", GMLP_KERNEL_INVALID_VALUE);
  if (q.shape.n_groups > kQuantMaxGroups)
    return refuse (reason, "more than 65535 groups", GMLP_KERNEL_UNSUPPORTED);
  if (src == nullptr || q.data == nullptr || q.scale_inv == nullptr)
    return refuse (reason, "missing operand", GMLP_KERNEL_INVALID_VALUE);
  if (q.recipe == GMLP_QUANT_DELAYED &&
      (q.state == nullptr || q.history_length < 1 || q.history_length > kGmlpQuantMaxHistory))
    return refuse (reason, "delayed scaling needs its state", GMLP_KERNEL_INVALID_VALUE);
  if (q.columnwise != nullptr && gmlp_quant_columnwise_has_scales (q.recipe, q.flags) &&
      q.columnwise_scale_inv == nullptr)
    return refuse (reason, "the columnwise copy needs its scales", GMLP_KERNEL_INVALID_VALUE);

  p->device_rows = q.shape.device_rows;
  p->n_groups = q.shape.n_groups;
  p->cols = q.shape.cols;
  p->row_capacity = q.shape.row_capacity;
  p->recipe = q.recipe;
  p->flags = q.flags;
  p->src_dtype = src_dtype;
  p->fp8_dtype = q.fp8_dtype;
  p->src = (const uint8_t *) src;
  p->data = (uint8_t *) q.data;
  p->scale_inv = (uint8_t *) q.scale_inv;
  p->columnwise = (uint8_t *) q.columnwise;
  p->columnwise_scale_inv = q.columnwise != nullptr &&
                            gmlp_quant_columnwise_has_scales (q.recipe, q.flags) ?
                            (uint8_t *) q.columnwise_scale_inv : nullptr;
  derived = gmlp_quant_derived_row_block (q.recipe, q.flags, q.columnwise != nullptr);
  p->derived_rows = derived > 0 ? q.derived_rows : nullptr;
  p->derived_block = derived;
  p->state = q.state;
  p->state_stride = gmlp_quant_state_stride (q.history_length);
  p->amax = nullptr;
  gmlp_quant_blocks (q.recipe, q.flags, 0, &p->block_rows, &p->block_cols);
  gmlp_quant_blocks (q.recipe, q.flags, 1, &p->col_block_rows, &p->col_block_cols);
  p->scale_cols = gmlp_quant_blocks_along (q.shape.cols, p->block_cols);
  p->col_scale_cols = gmlp_quant_blocks_along (q.shape.cols, p->col_block_cols);
  p->scale_size = gmlp_quant_scale_size (q.recipe);

  p->n_layouts = p->columnwise_scale_inv != nullptr ? 4 : 3;
  p->layouts[kLayoutSrc] = { 1, (uint64_t) src_cols * gmlp_num_dtype_size (src_dtype) };
  p->layouts[kLayoutData] = { 1, (uint64_t) q.shape.cols };
  p->layouts[kLayoutScale] = { p->block_rows, (uint64_t) p->scale_cols * p->scale_size };
  p->layouts[kLayoutColumnScale] = { p->col_block_rows, (uint64_t) p->col_scale_cols * p->scale_size };
  return GMLP_KERNEL_SUCCESS;
}

/* CURRENT's amax workspace: one amax per group. */
template <typename Call>
inline size_t
grouped_quantize_workspace_bytes (const Call *q)
{
  if (q == nullptr || q->recipe != GMLP_QUANT_CURRENT)
    return 0;
  return sizeof (uint32_t) * q->shape.n_groups;
}

/* Whether the GPU gives kernel its staged tile (dynamic shared memory)
 * beside the kernel's own shared memory; *why says why not. */
template <typename Params>
inline GmlpKernelStatus
quantize_kernel_fits (void (*kernel) (Params), const char **why)
{
  int device = 0, optin = 0;
  cudaFuncAttributes attrs;
  cudaError_t err;

  err = cudaGetDevice (&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute (&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess)
    err = cudaFuncGetAttributes (&attrs, kernel);
  if (err != cudaSuccess)
    return refuse (why, "cannot query the device", record_cuda_error (err));
  if (attrs.sharedSizeBytes + kQuantTileBytes > (size_t) optin)
    return refuse (why, "the GPU has too little shared memory per block (about 80 KB needed)",
                   GMLP_KERNEL_UNSUPPORTED);
  return GMLP_KERNEL_SUCCESS;
}

/* What a _check() entry answers once describe() has said status (and why):
 * whether the kernel fits as well, and why not in *reason where asked. */
template <typename Params>
inline GmlpKernelStatus
quantize_check_result (GmlpKernelStatus   status,
                       void             (*kernel) (Params),
                       const char        *why,
                       const char       **reason)
{
  if (status == GMLP_KERNEL_SUCCESS)
    status = quantize_kernel_fits (kernel, &why);
  if (reason != nullptr)
    *reason = why;
  return status;
}

/* Blocks along x for each group: enough to fill the GPU for one group that
 * holds every row, no more than that group could use. */
static inline cudaError_t
quant_blocks_per_group (uint64_t work_units, int resident_per_sm, unsigned *blocks)
{
  int sm_count = 1;
  cudaError_t err = current_sm_count (&sm_count);
  uint64_t cap;

  if (err != cudaSuccess)
    return err;
  cap = (uint64_t) sm_count * (uint64_t) (resident_per_sm > 0 ? resident_per_sm : 1);
  if (work_units > cap)
    work_units = cap;
  *blocks = (unsigned) (work_units > 0 ? work_units : 1);
  return cudaSuccess;
}

/* For launch_grouped_quantize(), which sets the amaxes' workspace. */
static inline GroupedQuantizeParams &
quantize_part (GroupedQuantizeParams &p)
{
  return p;
}

/* Launches the quantization that params describe (describe_grouped_quantize()
 * of its quantize_part()), one block row per group: for CURRENT, the amax
 * pass (amax_kernel with amax_params) into workspace, zeroed first, then
 * kernel with params. */
template <typename Params>
inline GmlpKernelStatus
launch_grouped_quantize (void         (*kernel) (Params),
                         void         (*amax_kernel) (Params),
                         Params         params,
                         Params         amax_params,
                         void          *workspace,
                         cudaStream_t   stream)
{
  const GroupedQuantizeParams &p = quantize_part (params);
  int resident = 0;
  unsigned blocks = 1;
  uint64_t tiles;
  GmlpKernelStatus status;
  cudaError_t err;

  if (p.recipe == GMLP_QUANT_CURRENT)
    {
      if (workspace == nullptr)
        return GMLP_KERNEL_INVALID_VALUE;
      quantize_part (params).amax = (uint32_t *) workspace;
      quantize_part (amax_params).amax = (uint32_t *) workspace;
    }

  err = cudaFuncSetAttribute (kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) kQuantTileBytes);
  if (err == cudaSuccess && amax_kernel != kernel)
    err = cudaFuncSetAttribute (amax_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int) kQuantTileBytes);
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor (&resident, kernel, kQuantThreads, kQuantTileBytes);
  /* The tiles one group could have if it held every row. */
  tiles = (uint64_t) gmlp_quant_blocks_along (p.row_capacity, kQuantTile) *
          (uint64_t) gmlp_quant_blocks_along (p.cols, kQuantTile);
  if (err == cudaSuccess)
    err = quant_blocks_per_group (tiles, resident, &blocks);
  if (err != cudaSuccess)
    return record_cuda_error (err);

  const dim3 grid (blocks, p.n_groups);

  if (p.recipe == GMLP_QUANT_CURRENT)
    {
      /* The amaxes first: a per-tensor scale needs the whole group. */
      err = cudaMemsetAsync (workspace, 0, sizeof (uint32_t) * p.n_groups, stream);
      if (err != cudaSuccess)
        return record_cuda_error (err);
      amax_kernel<<<grid, kQuantThreads, kQuantTileBytes, stream>>> (amax_params);
      status = check_launch ();
      if (status != GMLP_KERNEL_SUCCESS)
        return status;
    }
  kernel<<<grid, kQuantThreads, kQuantTileBytes, stream>>> (params);
  return check_launch ();
}

}  // namespace gmlp
