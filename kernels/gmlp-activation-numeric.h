/* gmlp-activation-numeric.h: the activations of a grouped MLP, with the same
 * bits on the CPU and the GPU
 *
 * Plain C99 over gmlp-numeric.h, usable on host and device. The CPU
 * backend's activation, the CUDA activation kernels and the fused
 * activation + FP8 quantization (both backends) all evaluate these
 * functions, so that an FP8 MLP quantizes the same activation values
 * wherever it runs (quantization itself is gmlp-quantize-numeric.h's).
 *
 * Neither libm's expf/tanhf nor CUDA's agree bit for bit with each other,
 * so the one transcendental needed, exp, is computed here from IEEE
 * operations alone: each sum, product and quotient rounded once to nearest
 * even (the _rn intrinsics on the device, which the compiler never
 * contracts), each a·b + c an explicit fused multiply-add (fmaf on the
 * host, correctly rounded by C99; fma.rn on the device), and rintf, exact
 * on both. NOTE: host builds for targets with FMA instructions must not
 * let the compiler contract a product and a sum that are written apart
 * (libgmlp is built with -ffp-contract=off for that reason).
 *
 * GELU is the tanh approximation, evaluated through the identity
 * 1 + tanh (y) = 2 σ (2y):
 *   gelu (x)  = x/2 (1 + tanh (y)) = x / (1 + exp (-2y)),
 *               y = sqrt(2/pi) (x + 0.044715 x³),
 *   gelu' (x) = s + 2 sqrt(2/pi) x s (1 − s) (1 + 3 · 0.044715 x²),
 *               s = σ (2y) = 1 / (1 + exp (-2y));
 *   silu (x)  = x / (1 + exp (-x)), silu' (x) = s (1 + x (1 − s)), s = σ (x);
 *   relu (x)  = x > 0 ? x : 0 (NaN and -0 give +0), srelu (x) = relu (x)².
 * No tanh is needed, and no NaN arises for finite x: exp (-2y) overflows to
 * +Inf for very negative x, giving s = 0 and a value of -0.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#ifndef GMLP_ACTIVATION_NUMERIC_H
#define GMLP_ACTIVATION_NUMERIC_H

#if !defined(__CUDA_ARCH__)
# include <math.h>
#endif

#include "gmlp-numeric.h"

/* Activation codes; the values equal GmlpActivation's. */
enum {
  GMLP_NUM_ACT_GELU = 0,
  GMLP_NUM_ACT_RELU = 1,
  GMLP_NUM_ACT_SRELU = 2,
  GMLP_NUM_ACT_SWIGLU = 3,
  GMLP_NUM_ACT_GEGLU = 4,
};

GMLP_HD int
gmlp_act_is_gated (int activation)
{
  return activation == GMLP_NUM_ACT_SWIGLU || activation == GMLP_NUM_ACT_GEGLU;
}

GMLP_HD float
gmlp_act_add (float a, float b)
{
#if defined(__CUDA_ARCH__)
  return __fadd_rn (a, b);
#else
  return a + b;
#endif
}

GMLP_HD float
gmlp_act_sub (float a, float b)
{
#if defined(__CUDA_ARCH__)
  return __fsub_rn (a, b);
#else
  return a - b;
#endif
}

GMLP_HD float
gmlp_act_mul (float a, float b)
{
#if defined(__CUDA_ARCH__)
  return __fmul_rn (a, b);
#else
  return a * b;
#endif
}

GMLP_HD float
gmlp_act_div (float a, float b)
{
#if defined(__CUDA_ARCH__)
  return __fdiv_rn (a, b);
#else
  return a / b;
#endif
}

/* a × b + c rounded once. */
GMLP_HD float
gmlp_act_fma (float a, float b, float c)
{
#if defined(__CUDA_ARCH__)
  return __fmaf_rn (a, b, c);
#else
  return fmaf (a, b, c);
#endif
}

/* Nearest integer, ties to even (the default rounding mode on the host). */
GMLP_HD float
gmlp_act_rint (float x)
{
  return rintf (x);
}

/* 2^n for -126 <= n <= 127, exactly. */
GMLP_HD float
gmlp_act_pow2 (int32_t n)
{
  return gmlp_num_bits_float ((uint32_t) (n + 127) << 23);
}

/* e^x within about one unit in the last place: x = k ln2 + r with
 * |r| <= ln2/2 (Cody and Waite's two-part ln2, each step one fma), e^r by
 * the minimax polynomial of Cephes' expf, then × 2^k in two exact steps
 * (the second rounds only a subnormal or overflowing result). NaN stays
 * NaN. */
GMLP_HD float
gmlp_act_exp (float x)
{
  const float log2e = 1.44269504088896341f;
  const float ln2_hi = 0.693359375f;          /* 355/512: k × ln2_hi is exact */
  const float ln2_lo = -2.12194440e-4f;
  float k, r, p;
  int32_t n, n1;

  if (x != x)
    return x;
  if (x > 88.72283935546875f)                 /* e^x > FLT_MAX */
    return gmlp_num_bits_float (0x7f800000u);
  if (x < -103.972084045410156f)              /* e^x < 2^-150: rounds to 0 */
    return 0.0f;

  k = gmlp_act_rint (gmlp_act_mul (x, log2e));   /* -150 .. 128 */
  r = gmlp_act_fma (-k, ln2_hi, x);
  r = gmlp_act_fma (-k, ln2_lo, r);

  p = 1.9875691500e-4f;
  p = gmlp_act_fma (p, r, 1.3981999507e-3f);
  p = gmlp_act_fma (p, r, 8.3334519073e-3f);
  p = gmlp_act_fma (p, r, 4.1665795894e-2f);
  p = gmlp_act_fma (p, r, 1.6666665459e-1f);
  p = gmlp_act_fma (p, r, 5.0000001201e-1f);
  p = gmlp_act_fma (p, gmlp_act_mul (r, r), r);
  p = gmlp_act_add (p, 1.0f);

  n = (int32_t) k;
  /* p lies within [0.7, 1.42]: for n in -125 .. 127 both 2^n and p × 2^n
   * are normal, and one product is exact; the same value as the two
   * steps, in fewer instructions where nearly every x falls. */
  if (n >= -125 && n <= 127)
    return gmlp_act_mul (p, gmlp_act_pow2 (n));
  n1 = n / 2;                                 /* both halves within -75 .. 64 */
  return gmlp_act_mul (gmlp_act_mul (p, gmlp_act_pow2 (n1)), gmlp_act_pow2 (n - n1));
}

/* The value and the derivative of the (ungated) function behind an
 * activation; for the gated ones, of silu or gelu, which multiply b. */
typedef struct {
  float value;
  float grad;
} GmlpActValue;

/* The constants of the tanh approximation, written out so that no
 * compiler folds them: 2 sqrt(2/pi), 0.044715 and 3 × 0.044715. */
#define GMLP_ACT_GELU_2K 1.5957691216057308f
#define GMLP_ACT_GELU_C  0.044715f
#define GMLP_ACT_GELU_3C 0.134145f

GMLP_HD GmlpActValue
gmlp_act_eval (int activation, float x)
{
  GmlpActValue v;

  switch (activation)
    {
    case GMLP_NUM_ACT_GELU:
    case GMLP_NUM_ACT_GEGLU:
      {
        float x2 = gmlp_act_mul (x, x);
        float inner = gmlp_act_fma (gmlp_act_mul (GMLP_ACT_GELU_C, x2), x, x);   /* x + c x³ */
        float e = gmlp_act_exp (gmlp_act_mul (-GMLP_ACT_GELU_2K, inner));
        float d = gmlp_act_add (1.0f, e);
        float s = gmlp_act_div (1.0f, d);
        float slope = gmlp_act_mul (GMLP_ACT_GELU_2K,
                                    gmlp_act_fma (GMLP_ACT_GELU_3C, x2, 1.0f));

        v.value = gmlp_act_div (x, d);
        v.grad = gmlp_act_fma (gmlp_act_mul (gmlp_act_mul (x, s), gmlp_act_sub (1.0f, s)), slope, s);
        return v;
      }
    case GMLP_NUM_ACT_SWIGLU:
      {
        float d = gmlp_act_add (1.0f, gmlp_act_exp (-x));
        float s = gmlp_act_div (1.0f, d);

        v.value = gmlp_act_div (x, d);
        v.grad = gmlp_act_mul (s, gmlp_act_fma (x, gmlp_act_sub (1.0f, s), 1.0f));
        return v;
      }
    case GMLP_NUM_ACT_RELU:
      v.value = x > 0.0f ? x : 0.0f;
      v.grad = x > 0.0f ? 1.0f : 0.0f;
      return v;
    case GMLP_NUM_ACT_SRELU:
      {
        float relu = x > 0.0f ? x : 0.0f;

        v.value = gmlp_act_mul (relu, relu);
        v.grad = gmlp_act_mul (2.0f, relu);
        return v;
      }
    default:
      v.value = 0.0f;
      v.grad = 0.0f;
      return v;
    }
}

/* The forward value of a row element: act (a), or act (a) × b when gated. */
GMLP_HD float
gmlp_act_forward (int activation, float a, float b)
{
  float value = gmlp_act_eval (activation, a).value;

  return gmlp_act_is_gated (activation) ? gmlp_act_mul (value, b) : value;
}

#endif /* GMLP_ACTIVATION_NUMERIC_H */
