/* check-fp8-encode.cu: the FP8 encoding of the quantize kernels' per-tensor
 * path (encode_pair(): the hardware's satfinite conversion from sm_89 on)
 * against gmlp_quant_encode() (the arithmetic the CPU backend runs) on all
 * 2^32 float inputs, for E4M3 and E5M2. Prints the mismatches; exits 1 if
 * there are any. On the GPU host:
 *
 *   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels \
 *     -o /tmp/check-fp8-encode scripts/dev/check-fp8-encode.cu && /tmp/check-fp8-encode
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <cstdio>

#include "impls/grouped_quantize.cuh"

namespace {

struct Mismatch
{
  unsigned long long count;
  uint32_t           first_bits;
  uint32_t           got, want;
};

__global__ void
check (int fp8_dtype, Mismatch *out)
{
  GmlpQuantBlockScale one;

  one.multiplier = 1.0f;
  one.nan_block = 0;
  for (uint64_t i = (uint64_t) blockIdx.x * blockDim.x + threadIdx.x; i < (uint64_t (1) << 32);
       i += (uint64_t) gridDim.x * blockDim.x)
    {
      /* Both halves of the pair: i low, i with its halves swapped high. */
      const uint32_t lo = (uint32_t) i, hi = (lo << 16) | (lo >> 16);
      const uint32_t got = gmlp::encode_pair (__uint_as_float (lo), __uint_as_float (hi), 1.0f, 1.0f, fp8_dtype);
      const uint32_t want = (uint32_t) gmlp_quant_encode (__uint_as_float (lo), &one, fp8_dtype) |
                            ((uint32_t) gmlp_quant_encode (__uint_as_float (hi), &one, fp8_dtype) << 8);

      if (got != want && atomicAdd (&out->count, 1ull) == 0)
        {
          out->first_bits = lo;
          out->got = got;
          out->want = want;
        }
    }
}

}  // namespace

int
main (void)
{
  static const struct { int dtype; const char *name; } formats[] = {
    { GMLP_NUM_FLOAT8_E4M3, "E4M3" },
    { GMLP_NUM_FLOAT8_E5M2, "E5M2" },
  };
  Mismatch *m;
  int bad = 0;

  cudaMallocManaged (&m, sizeof (Mismatch));
  for (const auto &f : formats)
    {
      *m = Mismatch {};
      check<<<4096, 256>>> (f.dtype, m);
      if (cudaDeviceSynchronize () != cudaSuccess)
        {
          std::printf ("CUDA error\n");
          return 2;
        }
      std::printf ("%s: %llu mismatches of 2^32", f.name, m->count);
      if (m->count != 0)
        std::printf (" (first: input 0x%08x, hardware 0x%04x, reference 0x%04x)", m->first_bits, m->got,
                     m->want);
      std::printf ("\n");
      bad |= m->count != 0;
    }
  return bad;
}
