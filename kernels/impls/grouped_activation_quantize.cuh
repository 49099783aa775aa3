/* impls/grouped_activation_quantize.cuh: the activation of a grouped MLP
 * and the FP8 quantization of its output, in one pass
 *
 * The body of the quantize kernels (quantize_grouped_tiles() of
 * grouped_quantize.cuh) with another Source for the values of each
 * 128 × 128 tile: instead of loading the source, a thread loads FC1's
 * output (a, and b f columns further on for the gated activations),
 * evaluates the activation exactly as activation_kernel does (act_eval,
 * the same expression, the result rounded to the dtype and widened again)
 * and quantizes that. Everything after the loads (the block scales, the
 * rowwise and columnwise FP8 values, the amax of delayed scaling) is the
 * quantize kernels' code over the same tile, so the bytes are those of the
 * activation kernel followed by the quantize kernel; only the activation's
 * output never goes through memory.
 *
 * The blocks share the tiles out as the quantize kernels' do, reading the
 * sizes on the device only. CURRENT runs the kernel twice: the amax pass
 * (amax_pass set) reduces the tiles and writes nothing but the amaxes; the
 * second pass computes the activation again.
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

/* For launch_grouped_quantize(), which sets the amaxes' workspace. */
static inline GroupedQuantizeParams &
quantize_part (ActivationQuantizeParams &ap)
{
  return ap.q;
}

/* The Source of quantize_grouped_tiles() for the activation of in:
 * act(a) [× b], b k (= f) columns after a in the input's rows of in_cols
 * values, as activation_kernel computes and stores it. */
template <int kDtype, int kActivation>
struct ActivatedSource
{
  const ActivationQuantizeParams &ap;

  __device__ __forceinline__ float
  operator() (const uint8_t *member, int64_t k, int64_t r0, int64_t c0, int r, int c) const
  {
    using Type = StorageType<kDtype>;
    const Type *const row = (const Type *) member + (uint64_t) (r0 + r) * ap.in_cols + (uint64_t) (c0 + c);
    float y = act_eval<kActivation> (to_float<kDtype> (row[0])).value;

    if constexpr (is_gated_activation (kActivation))
      y *= to_float<kDtype> (row[k]);
    return to_float<kDtype> (from_float<kDtype> (y));
  }

  /* The same for (row, col .. col + 7), with 16-byte loads: a and b
   * (b unused without a gate). */
  struct Chunk
  {
    Chunk8<kDtype> a, b;
  };

  __device__ __forceinline__ Chunk
  load8 (const uint8_t *member, int64_t k, int64_t row, int64_t col) const
  {
    const StorageType<kDtype> *const at = (const StorageType<kDtype> *) member + (uint64_t) row * ap.in_cols +
                                          (uint64_t) col;
    Chunk chunk;

    chunk.a = load_chunk8<kDtype> (at);
    if constexpr (is_gated_activation (kActivation))
      chunk.b = load_chunk8<kDtype> (at + k);
    return chunk;
  }

  __device__ __forceinline__ void
  values8 (const Chunk &chunk, float v[8]) const
  {
    float a[8], b[8];

    widen8<kDtype> (chunk.a, a);
    if constexpr (is_gated_activation (kActivation))
      widen8<kDtype> (chunk.b, b);
#pragma unroll
    for (int e = 0; e < 8; e++)
      {
        float y = act_eval<kActivation> (a[e]).value;

        if constexpr (is_gated_activation (kActivation))
          y *= b[e];
        v[e] = to_float<kDtype> (from_float<kDtype> (y));
      }
  }
};

template <int kDtype, int kActivation>
__global__ void __launch_bounds__ (kQuantThreads, kQuantMinBlocks)
grouped_activation_quantize_kernel (const __grid_constant__ ActivationQuantizeParams ap)
{
  quantize_grouped_tiles (ap.q, ap.amax_pass != 0, ActivatedSource<kDtype, kActivation> { ap });
}

}  // namespace gmlp
