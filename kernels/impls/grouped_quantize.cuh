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

template <int kPass>
__global__ void __launch_bounds__ (kQuantThreads)
grouped_quantize_kernel (const __grid_constant__ GroupedQuantizeParams p)
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
  else if (p.recipe == GMLP_QUANT_CURRENT && kPass == kPassAmax)
    amax_target = p.amax + g;

  if (kPass == kPassQuantize && threadIdx.x == 0)
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
            v = gmlp_num_load_float (src, p.src_dtype, (uint64_t) (r0 + r) * (uint64_t) k + (uint64_t) (c0 + c));
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
          if (kPass == kPassAmax)
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
