/* gmlp-quantize-numeric.h: the arithmetic of FP8 quantization, shared by the
 * CPU backend and the CUDA kernels so that both give the same bits
 *
 * Plain C99 over gmlp-numeric.h; every function works on host and device.
 * Nothing here depends on the order in which elements are visited: an amax
 * is a maximum (exact, order-free), and every scale and every element is a
 * pure function of its inputs. Each product is a single multiplication (no
 * a·b + c that a compiler could contract into an FMA) and each quotient an
 * IEEE division (__fdiv_rn on the device), so the CPU and the GPU round the
 * same way.
 *
 * The recipes and their formulas are described in docs/fp8.md.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#ifndef GMLP_QUANTIZE_NUMERIC_H
#define GMLP_QUANTIZE_NUMERIC_H

#include "gmlp-numeric.h"

/* Recipe codes; the values equal GmlpScalingRecipe's. */
enum {
  GMLP_QUANT_NONE = 0,
  GMLP_QUANT_DELAYED = 1,
  GMLP_QUANT_CURRENT = 2,
  GMLP_QUANT_BLOCKWISE = 3,
  GMLP_QUANT_MXFP8 = 4,
};

/* Flags of a quantize call. */
enum {
  /* BLOCKWISE: 128×128 tiles (weights) instead of 1×128 (activations and
   * gradients). */
  GMLP_QUANT_FLAG_WEIGHT_TILES = 1 << 0,
  /* CURRENT and BLOCKWISE: scales rounded down to a power of two. */
  GMLP_QUANT_FLAG_POW2_SCALES = 1 << 1,
};

enum {
  kGmlpQuantTile = 128,        /* BLOCKWISE block edge */
  kGmlpQuantMxBlock = 32,      /* MXFP8 block length */
  kGmlpE8m0One = 127,          /* E8M0 encoding of 2^0 */
  kGmlpE8m0Nan = 255,          /* E8M0 NaN */
  kGmlpQuantMaxMargin = 64,
  kGmlpQuantMaxHistory = 1024,
};

/* The state of a delayed-scaling quantizer is one row of floats per group:
 * the scale in use, the amax seen since the last update (a maximum), then
 * the amax history, newest first. */
enum {
  GMLP_QUANT_STATE_SCALE = 0,
  GMLP_QUANT_STATE_AMAX = 1,
  GMLP_QUANT_STATE_HISTORY = 2,
};

GMLP_HD uint32_t
gmlp_quant_state_stride (uint32_t history_length)
{
  return GMLP_QUANT_STATE_HISTORY + history_length;
}

#define GMLP_QUANT_FLOAT_MAX_BITS 0x7f7fffffu   /* FLT_MAX */
#define GMLP_QUANT_FLOAT_MIN_BITS 0x00800000u   /* FLT_MIN, 2^-126 */
#define GMLP_QUANT_INF_BITS       0x7f800000u
#define GMLP_QUANT_QNAN_BITS      0x7fc00000u

/* a / b rounded to nearest even, the same on host and device. */
GMLP_HD float
gmlp_quant_div (float a, float b)
{
#if defined(__CUDA_ARCH__)
  return __fdiv_rn (a, b);
#else
  return a / b;
#endif
}

/* a × b rounded to nearest even, never contracted with a later addition. */
GMLP_HD float
gmlp_quant_mul (float a, float b)
{
#if defined(__CUDA_ARCH__)
  return __fmul_rn (a, b);
#else
  return a * b;
#endif
}

GMLP_HD float
gmlp_quant_fp8_max (int fp8_dtype)
{
  return fp8_dtype == GMLP_NUM_FLOAT8_E5M2 ? 57344.0f : 448.0f;
}

/* The exponent of the largest normal of the element format (emax_elem of
 * the OCP MX specification). */
GMLP_HD int32_t
gmlp_quant_fp8_emax (int fp8_dtype)
{
  return fp8_dtype == GMLP_NUM_FLOAT8_E5M2 ? 15 : 8;
}

/* Amaxes are carried as the bit patterns of non-negative floats: for those,
 * unsigned order is float order (and NaN patterns sort above +Inf), so a
 * maximum, an atomicMax on the device included, is exact and order-free. */
GMLP_HD uint32_t
gmlp_quant_abs_bits (float x)
{
  return gmlp_num_float_bits (x) & 0x7fffffffu;
}

/* Folds |x| into an amax the way Transformer Engine does (fmaxf): NaN is
 * left out, ±Inf counts. For the per-tensor and blockwise recipes. */
GMLP_HD uint32_t
gmlp_quant_amax_fold (uint32_t amax, float x)
{
  uint32_t a = gmlp_quant_abs_bits (x);

  return (a <= GMLP_QUANT_INF_BITS && a > amax) ? a : amax;
}

/* Folds |x| into the amax of an MX block: NaN is kept (it sorts above
 * +Inf), because a block holding NaN or Inf gets the NaN scale. */
GMLP_HD uint32_t
gmlp_quant_amax_fold_mx (uint32_t amax, float x)
{
  uint32_t a = gmlp_quant_abs_bits (x);

  return a > amax ? a : amax;
}

GMLP_HD uint32_t
gmlp_quant_amax_fold_for (int recipe, uint32_t amax, float x)
{
  return recipe == GMLP_QUANT_MXFP8 ? gmlp_quant_amax_fold_mx (amax, x)
                                    : gmlp_quant_amax_fold (amax, x);
}

/* Keeps an FP32 scale finite and its inverse finite: [2^-126, FLT_MAX]. */
GMLP_HD float
gmlp_quant_clamp_scale (float scale)
{
  uint32_t u = gmlp_num_float_bits (scale);

  if (u >= GMLP_QUANT_INF_BITS)
    return gmlp_num_bits_float (GMLP_QUANT_FLOAT_MAX_BITS);
  if (u < GMLP_QUANT_FLOAT_MIN_BITS)
    return gmlp_num_bits_float (GMLP_QUANT_FLOAT_MIN_BITS);
  return scale;
}

/* The scale of current and blockwise scaling (Transformer Engine's
 * compute_scale_from_amax): fp8_max / amax, or 1 when amax is 0 or Inf (a
 * zero tensor must not get an infinite scale, and Inf leaves nothing to
 * fit); clamped as above; optionally rounded down to a power of two. */
GMLP_HD float
gmlp_quant_scale_from_amax (uint32_t amax_bits, int fp8_dtype, int pow2)
{
  float scale;

  if (amax_bits == 0 || amax_bits >= GMLP_QUANT_INF_BITS)
    return 1.0f;
  scale = gmlp_quant_div (gmlp_quant_fp8_max (fp8_dtype), gmlp_num_bits_float (amax_bits));
  scale = gmlp_quant_clamp_scale (scale);
  if (pow2)
    scale = gmlp_num_bits_float (gmlp_num_float_bits (scale) & 0xff800000u);
  return scale;
}

/* The E8M0 scale of an MX block (OCP MX v1.0, section 6.3):
 * X = 2^(floor(log2(amax)) - emax_elem), clamped to 2^-127 .. 2^127. A block
 * holding NaN or ±Inf gets the NaN scale; a block of zeros gets 2^0. */
GMLP_HD uint8_t
gmlp_quant_mx_scale (uint32_t amax_bits, int fp8_dtype)
{
  int32_t e;

  if (amax_bits >= GMLP_QUANT_INF_BITS)
    return (uint8_t) kGmlpE8m0Nan;
  if (amax_bits == 0)
    return (uint8_t) kGmlpE8m0One;
  if (amax_bits >= GMLP_QUANT_FLOAT_MIN_BITS)
    {
      e = (int32_t) (amax_bits >> 23) - 127;
    }
  else
    {
      /* A subnormal: m × 2^-149, floor(log2) from its highest set bit. */
      uint32_t m = amax_bits;
      int32_t top = 22;

      while (!(m & (1u << top)))
        top--;
      e = top - 149;
    }
  e -= gmlp_quant_fp8_emax (fp8_dtype);
  if (e < -127)
    e = -127;
  if (e > 127)
    e = 127;
  return (uint8_t) (e + 127);
}

/* 2^(b - 127), the value of an E8M0 scale; NaN for 255. */
GMLP_HD float
gmlp_quant_e8m0_to_float (uint8_t b)
{
  if (b == kGmlpE8m0Nan)
    return gmlp_num_bits_float (GMLP_QUANT_QNAN_BITS);
  if (b == 0)
    return gmlp_num_bits_float (0x00400000u);          /* 2^-127, a subnormal */
  return gmlp_num_bits_float ((uint32_t) b << 23);
}

/* 1 / X = 2^(127 - b) for an E8M0 scale b < 255: exact, a power of two. */
GMLP_HD float
gmlp_quant_e8m0_multiplier (uint8_t b)
{
  if (b == 254)
    return gmlp_num_bits_float (0x00400000u);          /* 2^-127 */
  return gmlp_num_bits_float ((uint32_t) (254 - b) << 23);
}

/* What a block (or a whole member) is quantized with. */
typedef struct {
  float    multiplier;   /* x × multiplier is rounded to FP8 */
  float    scale_inv;    /* FP32 recipes: what dequantization multiplies by */
  uint8_t  e8m0;         /* MXFP8: the stored scale */
  uint8_t  nan_block;    /* MXFP8: the block's scale is NaN */
} GmlpQuantBlockScale;

/* The scale of a block from its amax (folded with gmlp_quant_amax_fold_for);
 * for DELAYED, from the scale of the quantizer's state instead. */
GMLP_HD GmlpQuantBlockScale
gmlp_quant_block_scale (int recipe, int flags, int fp8_dtype, uint32_t amax_bits,
                        float delayed_scale)
{
  GmlpQuantBlockScale s;

  s.e8m0 = 0;
  s.nan_block = 0;
  if (recipe == GMLP_QUANT_MXFP8)
    {
      s.e8m0 = gmlp_quant_mx_scale (amax_bits, fp8_dtype);
      s.nan_block = s.e8m0 == kGmlpE8m0Nan;
      s.multiplier = s.nan_block ? 0.0f : gmlp_quant_e8m0_multiplier (s.e8m0);
      s.scale_inv = gmlp_quant_e8m0_to_float (s.e8m0);
      return s;
    }
  if (recipe == GMLP_QUANT_DELAYED)
    s.multiplier = delayed_scale;
  else
    s.multiplier = gmlp_quant_scale_from_amax (amax_bits, fp8_dtype,
                                               (flags & GMLP_QUANT_FLAG_POW2_SCALES) != 0);
  s.scale_inv = gmlp_quant_div (1.0f, s.multiplier);
  return s;
}

/* x × multiplier rounded to FP8 (nearest even, saturating: ±Inf and values
 * beyond the range give ±max). NaN gives 0x7f with the sign of x, decided
 * here rather than by the NaN a multiplication happens to produce (which
 * differs between CPUs and GPUs). Elements of an MX block with the NaN scale
 * are 0x7f. */
GMLP_HD uint8_t
gmlp_quant_encode (float x, const GmlpQuantBlockScale *s, int fp8_dtype)
{
  uint32_t u = gmlp_num_float_bits (x);
  float v;

  if ((u & 0x7fffffffu) > GMLP_QUANT_INF_BITS)
    return (uint8_t) (((u >> 24) & 0x80u) | 0x7fu);
  if (s->nan_block)
    return 0x7fu;
  v = gmlp_quant_mul (x, s->multiplier);
  return fp8_dtype == GMLP_NUM_FLOAT8_E5M2 ? gmlp_num_float_to_e5m2 (v)
                                           : gmlp_num_float_to_e4m3 (v);
}

/* q × scale_inv; a NaN element stays that NaN, a NaN scale gives the quiet
 * NaN 0x7fc00000 (defined bits, whatever the hardware's NaN is). */
GMLP_HD float
gmlp_quant_decode (uint8_t q, float scale_inv, int fp8_dtype)
{
  float v = fp8_dtype == GMLP_NUM_FLOAT8_E5M2 ? gmlp_num_e5m2_to_float (q)
                                              : gmlp_num_e4m3_to_float (q);

  if ((gmlp_num_float_bits (v) & 0x7fffffffu) > GMLP_QUANT_INF_BITS)
    return v;
  if ((gmlp_num_float_bits (scale_inv) & 0x7fffffffu) > GMLP_QUANT_INF_BITS)
    return gmlp_num_bits_float (GMLP_QUANT_QNAN_BITS);
  return gmlp_quant_mul (v, scale_inv);
}

/* Block geometry, in the orientation of the source (m rows × k cols): a
 * block is block_rows × block_cols elements; 0 means the whole extent (a
 * per-tensor scale). columnwise selects the blocks of the columnwise
 * (transposed) copy, which runs its 1 × N blocks down the columns. */
GMLP_HD void
gmlp_quant_blocks (int      recipe,
                   int      flags,
                   int      columnwise,
                   int64_t *block_rows,
                   int64_t *block_cols)
{
  int64_t along = 0, across = 0;   /* along the quantized rows, and across them */

  switch (recipe)
    {
    case GMLP_QUANT_BLOCKWISE:
      along = kGmlpQuantTile;
      across = (flags & GMLP_QUANT_FLAG_WEIGHT_TILES) ? kGmlpQuantTile : 1;
      break;
    case GMLP_QUANT_MXFP8:
      along = kGmlpQuantMxBlock;
      across = 1;
      break;
    default:
      break;
    }
  *block_rows = columnwise ? along : across;
  *block_cols = columnwise ? across : along;
}

/* Blocks along an extent of n: ceil (n / block), or 1 for block 0. */
GMLP_HD int64_t
gmlp_quant_blocks_along (int64_t n, int64_t block)
{
  if (block == 0)
    return 1;
  return n > 0 ? (n + block - 1) / block : 0;
}

/* The row capacity of a tensor of row blocks (block > 1) of a tensor with
 * device-only sizes of capacity rows in n_groups groups: Σ ceil (m_i /
 * block) over clamped sizes, which add up to at most capacity. The
 * quantizer allocates the scales of such blocks with it, and the products
 * that read them describe them with it. */
GMLP_HD int64_t
gmlp_quant_blocked_capacity (int64_t capacity, int64_t n_groups, int64_t block)
{
  return (capacity + n_groups * (block - 1)) / block;
}

/* Whether the columnwise copy needs scales of its own, or shares the
 * rowwise ones (per-tensor scales and square tiles). */
GMLP_HD int
gmlp_quant_columnwise_has_scales (int recipe, int flags)
{
  int64_t rr, rc, cr, cc;

  gmlp_quant_blocks (recipe, flags, 0, &rr, &rc);
  gmlp_quant_blocks (recipe, flags, 1, &cr, &cc);
  return rr != cr || rc != cc;
}

/* Bytes of one scale: FP32, or one E8M0 byte for MXFP8. */
GMLP_HD uint32_t
gmlp_quant_scale_size (int recipe)
{
  return recipe == GMLP_QUANT_MXFP8 ? 1u : 4u;
}

/* The rows of block rows of a group of m rows (see docs/fp8.md): when they
 * are neither m nor 1, a tensor with device-only sizes gets a derived sizes
 * tensor, written by the quantize call. Returns that block (32 or 128), or 0
 * when no scale tensor needs one. */
GMLP_HD int64_t
gmlp_quant_derived_row_block (int recipe, int flags, int columnwise)
{
  int64_t br, bc;

  gmlp_quant_blocks (recipe, flags, 0, &br, &bc);
  if (br > 1)
    return br;
  if (columnwise && gmlp_quant_columnwise_has_scales (recipe, flags))
    {
      gmlp_quant_blocks (recipe, flags, 1, &br, &bc);
      if (br > 1)
        return br;
    }
  return 0;
}

/* One delayed-scaling update of a group's state row (see above): the amax
 * seen since the last update becomes the newest history entry, the oldest
 * drops out, and the scale becomes fp8_max / max(history) / 2^margin. A
 * history whose maximum is 0 or not finite keeps the scale as it was
 * (Transformer Engine's rule). */
GMLP_HD void
gmlp_quant_delayed_update (float *row, uint32_t history_length, int fp8_dtype, int32_t margin)
{
  float *history = row + GMLP_QUANT_STATE_HISTORY;
  uint32_t amax = 0;
  uint32_t i;

  for (i = history_length - 1; i > 0; i--)
    history[i] = history[i - 1];
  history[0] = row[GMLP_QUANT_STATE_AMAX];
  row[GMLP_QUANT_STATE_AMAX] = 0.0f;

  for (i = 0; i < history_length; i++)
    amax = gmlp_quant_amax_fold (amax, history[i]);

  if (amax != 0 && amax < GMLP_QUANT_INF_BITS)
    {
      float scale = gmlp_quant_div (gmlp_quant_fp8_max (fp8_dtype), gmlp_num_bits_float (amax));
      /* 2^-margin, exact for 0 <= margin <= kGmlpQuantMaxMargin */
      scale = gmlp_quant_mul (scale, gmlp_num_bits_float ((uint32_t) (127 - margin) << 23));
      row[GMLP_QUANT_STATE_SCALE] = gmlp_quant_clamp_scale (scale);
    }
}

#endif /* GMLP_QUANTIZE_NUMERIC_H */
