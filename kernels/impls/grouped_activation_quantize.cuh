/* impls/grouped_activation_quantize.cuh: the activation of a grouped MLP
 * and the FP8 quantization of its output, in one pass
 *
 * The quantize kernel of grouped_quantize.cuh, with the staging of each
 * 128 × 128 tile replaced: instead of loading the source, a thread loads
 * FC1's output (a, and b f columns further on for the gated activations),
 * evaluates the activation exactly as activation_kernel does (act_eval,
 * the same expression, the result rounded to the dtype and widened again)
 * and stages that. Everything after the staging (the block scales, the
 * rowwise and columnwise FP8 values, the amax of delayed scaling) is the
 * quantize kernel's code over the same tile, so the bytes are those of the
 * activation kernel followed by the quantize kernel; only the activation's
 * output never goes through memory.
 *
 * blockIdx.y is the group and a group's blocks stride over its tiles; a
 * block finds its group's rows and member offsets with locate_group(), so
 * the sizes are read on the device only. CURRENT runs the kernel twice: the
 * amax pass (amax_pass set) stages and reduces the tiles and writes
 * nothing but the amaxes; the second pass computes the activation again.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-activation-numeric.h"
#include "gmlp-quantize-numeric.h"
#include "impls/common.cuh"
#include "impls/grouped_activation.cuh"
#include "impls/grouped_quantize.cuh"

namespace gmlp {

struct ActivationQuantizeParams
{
  /* The quantization, as the quantize kernel takes it: q.src is the
   * activation's input, q.layouts[kLayoutSrc] its rows (in_cols values of
   * the dtype), q.cols = f. */
  GroupedQuantizeParams  q;
  uint64_t               in_cols;    /* f, or 2f when gated */
  int                    amax_pass;  /* CURRENT, first launch: the amaxes only */
};

template <int kDtype, int kActivation>
__global__ void __launch_bounds__ (kQuantThreads)
grouped_activation_quantize_kernel (const __grid_constant__ ActivationQuantizeParams ap)
{
  using Type = StorageType<kDtype>;
  constexpr bool kGated = is_gated_activation (kActivation);

  extern __shared__ float tile[];                      /* kQuantTile × kQuantTilePitch */
  __shared__ GmlpQuantBlockScale row_scales[kQuantMaxTileBlocks];
  __shared__ GmlpQuantBlockScale col_scales[kQuantMaxTileBlocks];
  __shared__ GmlpQuantBlockScale member_scale;
  __shared__ GroupPlace place;
  __shared__ uint32_t scratch[kQuantWarps];

  const GroupedQuantizeParams &p = ap.q;
  const bool amax_pass = ap.amax_pass != 0;
  const uint32_t g = blockIdx.y;
  const bool per_tensor = p.block_rows == 0;
  const bool own_column_scales = p.columnwise_scale_inv != nullptr;
  uint32_t *amax_target = nullptr;

  if (threadIdx.x < 32)
    locate_group (p.device_rows, p.row_capacity, p.layouts, p.n_layouts, g, &place);
  __syncthreads ();

  const int64_t m = place.rows;
  const int64_t k = p.cols;                            /* f */
  const Type *in = (const Type *) (p.src + place.offset[kLayoutSrc]);

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

      /* Stage act(a) [× b] of the tile, as activation_kernel computes and
       * stores it; outside the member, 0, which no amax notices. */
      for (int i = threadIdx.x; i < kQuantTile * kQuantTile; i += kQuantThreads)
        {
          const int r = i / kQuantTile, c = i % kQuantTile;
          float v = 0.0f;

          if (r < tr && c < tc)
            {
              const Type *const row = in + (uint64_t) (r0 + r) * ap.in_cols + (uint64_t) (c0 + c);
              float y = act_eval<kActivation> (act_to_float<kDtype> (row[0])).value;

              if constexpr (kGated)
                y *= act_to_float<kDtype> (row[k]);
              v = act_to_float<kDtype> (act_from_float<kDtype> (y));
            }
          tile[r * kQuantTilePitch + c] = v;
        }
      __syncthreads ();

      /* From here on, the quantize kernel's steps over the staged tile. */
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
          /* Member i of the copy is f × m: element (r, c) goes to (c, r),
           * consecutive threads on consecutive r (coalesced writes). */
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

}  // namespace gmlp
