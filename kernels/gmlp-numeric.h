/* gmlp-numeric.h: scalar conversions and the counter-based random generator,
 * shared by the CPU backend and the CUDA kernels so that both produce the same
 * bits. Plain C99, no GLib; every function is usable on host and device.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#ifndef GMLP_NUMERIC_H
#define GMLP_NUMERIC_H

#include <stdint.h>

#if defined(__CUDACC__)
# define GMLP_HD __host__ __device__ __forceinline__
#else
# define GMLP_HD static inline
#endif

/* Storage dtype codes; the values equal GmlpDType's. */
enum {
  GMLP_NUM_FLOAT32 = 0,
  GMLP_NUM_FLOAT16 = 1,
  GMLP_NUM_BFLOAT16 = 2,
  GMLP_NUM_FLOAT8_E4M3 = 3,
  GMLP_NUM_FLOAT8_E5M2 = 4,
  GMLP_NUM_INT32 = 5,
  GMLP_NUM_INT64 = 6,
};

enum {
  kGmlpMemberAlignment = 256,
};

GMLP_HD uint32_t
gmlp_num_float_bits (float f)
{
  union { float f; uint32_t u; } v;
  v.f = f;
  return v.u;
}

GMLP_HD float
gmlp_num_bits_float (uint32_t u)
{
  union { float f; uint32_t u; } v;
  v.u = u;
  return v.f;
}

/* Rounds the integer mant / 2^shift to nearest, ties to even. */
GMLP_HD uint32_t
gmlp_num_shift_rne (uint32_t mant, uint32_t shift)
{
  uint32_t q, rem, half;

  if (shift == 0)
    return mant;
  if (shift >= 32)
    return 0;
  q = mant >> shift;
  rem = mant & ((1u << shift) - 1u);
  half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u)))
    q++;
  return q;
}

GMLP_HD uint16_t
gmlp_num_float_to_bfloat16 (float f)
{
  uint32_t u = gmlp_num_float_bits (f);

  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t) ((u >> 16) | 0x0040u);     /* quiet the NaN, keep sign */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t) (u >> 16);
}

GMLP_HD float
gmlp_num_bfloat16_to_float (uint16_t h)
{
  return gmlp_num_bits_float ((uint32_t) h << 16);
}

/* The BF16 parts of an FP32 value v, so that v = part_0 + part_1 + ...
 * as nearly as n parts can hold it: part_0 is v rounded to BF16 (nearest,
 * ties to even), and each next part the rounding of what the parts before
 * it leave, r − part, which FP32 holds exactly. Each part takes 8 bits or
 * more of the 24, so three hold every finite v exactly whose last bit is
 * not below BF16's smallest subnormal (|v| ≥ 2^-110), and two within
 * 2^-16 relative. Two exceptions: a finite remainder that would round to ±Inf
 * gives ±the largest finite BF16 instead (so near FLT_MAX the parts stay
 * finite and still add up), and once a part is not finite (v is ±Inf or
 * NaN: part_0 is that value, a NaN quieted) the parts after it are +0, so
 * that a product of the parts gives what the FP32 product would. Bits
 * below BF16's smallest subnormal (2^-133) are lost. The splitting entry
 * of every backend (split_bfloat16) writes these bits. */
GMLP_HD void
gmlp_num_split_bfloat16 (float v, int n_parts, uint16_t *parts)
{
  float rest = v;
  int finite = 1;

  for (int p = 0; p < n_parts; p++)
    {
      uint16_t h;

      if (!finite)
        {
          parts[p] = 0;
          continue;
        }
      h = gmlp_num_float_to_bfloat16 (rest);
      if ((h & 0x7fffu) == 0x7f80u && (gmlp_num_float_bits (rest) & 0x7fffffffu) < 0x7f800000u)
        h = (uint16_t) ((h & 0x8000u) | 0x7f7fu);   /* a finite remainder stays finite */
      parts[p] = h;
      if ((h & 0x7f80u) == 0x7f80u)
        finite = 0;
      else
        rest = rest - gmlp_num_bfloat16_to_float (h);
    }
}

GMLP_HD uint16_t
gmlp_num_float_to_half (float f)
{
  uint32_t u = gmlp_num_float_bits (f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;

  if (a > 0x7f800000u)
    return (uint16_t) (sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  /* 65520 = 0x477ff000 is the halfway point above 65504 and rounds to inf. */
  if (a >= 0x477ff000u)
    return (uint16_t) (sign | 0x7c00u);
  if (a < 0x38800000u)
    {
      /* Below 2^-14: a half subnormal, round(|f| * 2^24). */
      uint32_t e = a >> 23;
      uint32_t mant = (a & 0x7fffffu) | (e ? 0x800000u : 0u);
      if (e < 100)
        return (uint16_t) sign;
      return (uint16_t) (sign | gmlp_num_shift_rne (mant, 126u - e));
    }
  a += 0xfffu + ((a >> 13) & 1u);
  return (uint16_t) (sign | ((a >> 13) - 0x1c000u));
}

GMLP_HD float
gmlp_num_half_to_float (uint16_t h)
{
  uint32_t sign = ((uint32_t) h & 0x8000u) << 16;
  uint32_t e = ((uint32_t) h >> 10) & 0x1fu;
  uint32_t m = (uint32_t) h & 0x3ffu;

  if (e == 0x1f)
    return gmlp_num_bits_float (sign | 0x7f800000u | (m << 13));
  if (e == 0)
    {
      float v = (float) m * (1.0f / 16777216.0f);   /* m * 2^-24, exact */
      return sign ? -v : v;
    }
  return gmlp_num_bits_float (sign | ((e + 112u) << 23) | (m << 13));
}

/* Float to an OCP FP8 format with mbits mantissa bits and the given bias, in
 * the saturating mode: overflow and infinities give the largest finite
 * encoding max_enc, NaN gives 0x7f with the input's sign. */
GMLP_HD uint8_t
gmlp_num_float_to_fp8 (float f, uint32_t mbits, int32_t bias, uint32_t max_enc)
{
  uint32_t u = gmlp_num_float_bits (f);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7fffffffu;
  int32_t emin = 1 - bias;                       /* exponent of the smallest normal */
  uint32_t min_normal = (uint32_t) (emin + 127) << 23;
  uint32_t drop = 23u - mbits;
  int32_t enc;

  if (a > 0x7f800000u)
    return (uint8_t) (sign | 0x7fu);
  if (a == 0x7f800000u)
    return (uint8_t) (sign | max_enc);
  if (a < min_normal)
    {
      /* Subnormal target: round(|f| / 2^(emin - mbits)). The result may be
       * 2^mbits, which is the encoding of the smallest normal. */
      int32_t e = (int32_t) (a >> 23);
      uint32_t mant = (a & 0x7fffffu) | (e ? 0x800000u : 0u);
      int32_t shift = 150 - (e ? e : 1) - (int32_t) mbits + emin;
      if (shift >= 32)
        return (uint8_t) sign;
      return (uint8_t) (sign | gmlp_num_shift_rne (mant, (uint32_t) shift));
    }
  if (a >= 0x7f000000u)                          /* far beyond any FP8 range */
    return (uint8_t) (sign | max_enc);
  a += ((1u << (drop - 1u)) - 1u) + ((a >> drop) & 1u);
  enc = (int32_t) (a >> drop) - ((127 - bias) << mbits);
  if (enc > (int32_t) max_enc)
    enc = (int32_t) max_enc;
  return (uint8_t) (sign | (uint32_t) enc);
}

GMLP_HD float
gmlp_num_fp8_to_float (uint8_t b, uint32_t mbits, int32_t bias, int has_inf)
{
  uint32_t sign = ((uint32_t) b & 0x80u) << 24;
  uint32_t ebits = 7u - mbits;
  uint32_t e = ((uint32_t) b >> mbits) & ((1u << ebits) - 1u);
  uint32_t m = (uint32_t) b & ((1u << mbits) - 1u);
  uint32_t emax_field = (1u << ebits) - 1u;

  if (has_inf && e == emax_field)
    return gmlp_num_bits_float (sign | 0x7f800000u | (m ? 0x400000u : 0u));
  if (!has_inf && e == emax_field && m == (1u << mbits) - 1u)
    return gmlp_num_bits_float (sign | 0x7fc00000u);
  if (e == 0)
    {
      /* m * 2^(1 - bias - mbits): build the power of two exactly. */
      float scale = gmlp_num_bits_float ((uint32_t) (127 + 1 - bias - (int32_t) mbits) << 23);
      float v = (float) m * scale;
      return sign ? -v : v;
    }
  return gmlp_num_bits_float (sign | ((uint32_t) ((int32_t) e - bias + 127) << 23) |
                              (m << (23u - mbits)));
}

GMLP_HD uint8_t
gmlp_num_float_to_e4m3 (float f)
{
  return gmlp_num_float_to_fp8 (f, 3u, 7, 0x7eu);
}

GMLP_HD uint8_t
gmlp_num_float_to_e5m2 (float f)
{
  return gmlp_num_float_to_fp8 (f, 2u, 15, 0x7bu);
}

GMLP_HD float
gmlp_num_e4m3_to_float (uint8_t b)
{
  return gmlp_num_fp8_to_float (b, 3u, 7, 0);
}

GMLP_HD float
gmlp_num_e5m2_to_float (uint8_t b)
{
  return gmlp_num_fp8_to_float (b, 2u, 15, 1);
}

/* INT64 to INT32, saturating: values beyond the INT32 range become its
 * nearest end, as conversions to FP8 saturate, rather than wrap. */
GMLP_HD int32_t
gmlp_num_int64_to_int32 (int64_t v)
{
  if (v > 2147483647)
    return 2147483647;
  if (v < -2147483647 - 1)
    return -2147483647 - 1;
  return (int32_t) v;
}

/* Loads element i of a floating-point array of the given dtype as float. */
GMLP_HD float
gmlp_num_load_float (const void *p, int dtype, uint64_t i)
{
  switch (dtype)
    {
    case GMLP_NUM_FLOAT32: return ((const float *) p)[i];
    case GMLP_NUM_FLOAT16: return gmlp_num_half_to_float (((const uint16_t *) p)[i]);
    case GMLP_NUM_BFLOAT16: return gmlp_num_bfloat16_to_float (((const uint16_t *) p)[i]);
    case GMLP_NUM_FLOAT8_E4M3: return gmlp_num_e4m3_to_float (((const uint8_t *) p)[i]);
    case GMLP_NUM_FLOAT8_E5M2: return gmlp_num_e5m2_to_float (((const uint8_t *) p)[i]);
    default: return 0.0f;
    }
}

/* Stores v as element i of a floating-point array of the given dtype. */
GMLP_HD void
gmlp_num_store_float (void *p, int dtype, uint64_t i, float v)
{
  switch (dtype)
    {
    case GMLP_NUM_FLOAT32: ((float *) p)[i] = v; break;
    case GMLP_NUM_FLOAT16: ((uint16_t *) p)[i] = gmlp_num_float_to_half (v); break;
    case GMLP_NUM_BFLOAT16: ((uint16_t *) p)[i] = gmlp_num_float_to_bfloat16 (v); break;
    case GMLP_NUM_FLOAT8_E4M3: ((uint8_t *) p)[i] = gmlp_num_float_to_e4m3 (v); break;
    case GMLP_NUM_FLOAT8_E5M2: ((uint8_t *) p)[i] = gmlp_num_float_to_e5m2 (v); break;
    default: break;
    }
}

GMLP_HD uint32_t
gmlp_num_dtype_size (int dtype)
{
  switch (dtype)
    {
    case GMLP_NUM_FLOAT32: case GMLP_NUM_INT32: return 4;
    case GMLP_NUM_FLOAT16: case GMLP_NUM_BFLOAT16: return 2;
    case GMLP_NUM_FLOAT8_E4M3: case GMLP_NUM_FLOAT8_E5M2: return 1;
    case GMLP_NUM_INT64: return 8;
    default: return 0;
    }
}

GMLP_HD int
gmlp_num_dtype_is_fp8 (int dtype)
{
  return dtype == GMLP_NUM_FLOAT8_E4M3 || dtype == GMLP_NUM_FLOAT8_E5M2;
}

/* Bytes a member of `rows` rows of `row_bytes` bytes takes, padded so that the
 * next member starts on a kGmlpMemberAlignment boundary. The host and the
 * device lay grouped tensors out with this one rule. */
GMLP_HD uint64_t
gmlp_num_member_stride (int64_t rows, uint64_t row_bytes)
{
  uint64_t bytes = (uint64_t) (rows > 0 ? rows : 0) * row_bytes;
  return (bytes + (kGmlpMemberAlignment - 1)) & ~(uint64_t) (kGmlpMemberAlignment - 1);
}

/* Bytes the allocation of a grouped tensor whose sizes are only on the
 * device takes: row_capacity rows, plus up to kGmlpMemberAlignment - 1
 * bytes of padding per member unless rows are whole multiples of the
 * alignment, rounded up to the alignment (docs/memory-layout.md). The
 * caller keeps row_capacity × row_bytes and the padding in range. */
GMLP_HD uint64_t
gmlp_num_device_sized_bytes (uint32_t n_groups, int64_t row_capacity, uint64_t row_bytes)
{
  uint64_t bytes = (uint64_t) (row_capacity > 0 ? row_capacity : 0) * row_bytes;

  if (row_bytes % kGmlpMemberAlignment != 0)
    bytes += (uint64_t) n_groups * (kGmlpMemberAlignment - 1);
  return (bytes + (kGmlpMemberAlignment - 1)) & ~(uint64_t) (kGmlpMemberAlignment - 1);
}

/* splitmix64 finaliser: a counter-based generator, so element i's value does
 * not depend on how the work is split between threads. */
GMLP_HD uint64_t
gmlp_num_mix64 (uint64_t z)
{
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [-scale, scale): 24 random bits, exact up to the one rounding of
 * the final product, so CPU and GPU agree bit for bit. */
GMLP_HD float
gmlp_num_random_uniform (uint64_t seed, uint64_t index, float scale)
{
  uint64_t h = gmlp_num_mix64 (gmlp_num_mix64 (seed) + index * 0x9e3779b97f4a7c15ull);
  float u = (float) (uint32_t) (h >> 40) * (1.0f / 8388608.0f) - 1.0f;   /* [-1, 1) */
  return u * scale;
}

#endif /* GMLP_NUMERIC_H */
