/* impls/grouped_gemm_simt.cuh: the portable grouped GEMM for group sizes
 * that only the device knows
 *
 * Plain CUDA cores, no arch-specific instruction, so it runs on every GPU
 * the library is built for. impls/device_groups.cuh has already numbered the
 * output tiles of all groups in one list; the grid strides over that list,
 * so the work is spread evenly however the routing split the rows, and each
 * block finds its group with a binary search of the group table.
 *
 * A tile is kSimtTileM × kSimtTileN outputs of one group. The block stages
 * kSimtTileK-deep slices of both operands in shared memory as float (any
 * storage type widens exactly) and each thread accumulates a
 * kSimtMicroM × kSimtMicroN block of outputs in FP32 registers, in the same
 * order on every run. Rows and columns past the edges load as zero and are
 * never stored.
 *
 * The three products, as C (M × N) = Σ_K opA (M × K) · opB (K × N):
 *
 *   kind   M      N   K      opA (i, kk)         opB (kk, j)      C
 *   FPROP  m_i    n   k      x_i[i, kk]          W_i[j, kk]       y_i
 *   DGRAD  m_i    k   n      dy_i[i, kk]         W_i[kk, j]       dx_i
 *   WGRAD  n      k   m_i    dy_i[kk, i]         x_i[kk, j]       dW_i
 *
 * The epilogue adds bias_i[j] (FPROP) or the old dW_i (WGRAD, accumulating)
 * in FP32 and rounds once to C's type.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/common.cuh"
#include "impls/device_groups.cuh"

namespace gmlp {

constexpr int kSimtTileM = 64;
constexpr int kSimtTileN = 64;
constexpr int kSimtTileK = 16;
constexpr int kSimtThreads = 256;
constexpr int kSimtThreadsN = 16;                              /* threads across a tile's columns */
constexpr int kSimtThreadsM = kSimtThreads / kSimtThreadsN;    /* and down its rows */
constexpr int kSimtMicroM = kSimtTileM / kSimtThreadsM;
constexpr int kSimtMicroN = kSimtTileN / kSimtThreadsN;
/* Elements of each operand slice a thread stages. */
constexpr int kSimtLoadsA = kSimtTileM * kSimtTileK / kSimtThreads;
constexpr int kSimtLoadsB = kSimtTileN * kSimtTileK / kSimtThreads;

static_assert (kSimtThreads % kSimtThreadsN == 0, "whole rows of threads");
static_assert (kSimtTileM % kSimtThreadsM == 0 && kSimtTileN % kSimtThreadsN == 0,
               "every thread gets the same outputs");
static_assert ((kSimtTileM * kSimtTileK) % kSimtThreads == 0 &&
               (kSimtTileN * kSimtTileK) % kSimtThreads == 0,
               "every thread stages the same number of elements");

struct DeviceGemmParams
{
  const DeviceGroup  *groups;       /* from device_groups_kernel */
  const uint64_t     *total_tiles;
  uint32_t            n_groups;
  int64_t             n;            /* out_features */
  int64_t             k;            /* in_features */
  uint64_t            col_tiles;    /* tiles across C's columns */
  const uint8_t      *rows_a;       /* x (FPROP) or dy: DeviceGroup.offset[0] */
  uint8_t            *rows_b;       /* y, dx (written) or x (WGRAD, read): offset[1] */
  /* Device copies of the caller's host arrays, in the workspace. */
  void * const       *fixed;        /* W_i, or dW_i for WGRAD */
  const void * const *bias;         /* FPROP, or nullptr */
  const uint8_t      *accumulate;   /* WGRAD, or nullptr */
};

template <int kKind, int kAB, int kC>
__global__ void __launch_bounds__ (kSimtThreads)
device_gemm_simt_kernel (const __grid_constant__ DeviceGemmParams p)
{
  using ABType = StorageType<kAB>;
  using CType = StorageType<kC>;
  /* Which index of each operand walks consecutive elements: the staging
   * loops give those to consecutive threads. */
  constexpr bool kAAlongK = kKind != GMLP_KERNEL_GEMM_WGRAD;
  constexpr bool kBAlongK = kKind == GMLP_KERNEL_GEMM_FPROP;

  /* NOTE: one column of padding: threads that stage along K write down a
   * column, which would otherwise hit one bank. */
  __shared__ float a_tile[kSimtTileK][kSimtTileM + 1];
  __shared__ float b_tile[kSimtTileK][kSimtTileN + 1];

  const int tx = threadIdx.x % kSimtThreadsN;
  const int ty = threadIdx.x / kSimtThreadsN;
  const uint64_t total = *p.total_tiles;

  for (uint64_t tile = blockIdx.x; tile < total; tile += gridDim.x)
    {
      const uint32_t g = find_device_group (p.groups, p.n_groups, tile);
      const DeviceGroup group = p.groups[g];
      const uint64_t local = tile - device_group_first_tile (p.groups, g);
      const int64_t row0 = (int64_t) (local / p.col_tiles) * kSimtTileM;
      const int64_t col0 = (int64_t) (local % p.col_tiles) * kSimtTileN;
      const ABType *a, *b;
      CType *c;
      const CType *bias = nullptr;
      bool accumulate = false;
      int64_t m_dim, n_dim, k_dim;        /* M, N, K of the table above */
      int64_t a_si, a_sk, b_sk, b_sj;     /* element strides of opA and opB */
      float acc[kSimtMicroM][kSimtMicroN];

      if constexpr (kKind == GMLP_KERNEL_GEMM_FPROP)
        {
          m_dim = group.rows; n_dim = p.n; k_dim = p.k;
          a = (const ABType *) (p.rows_a + group.offset[0]);
          b = (const ABType *) p.fixed[g];
          c = (CType *) (p.rows_b + group.offset[1]);
          a_si = k_dim; a_sk = 1;
          b_sk = 1; b_sj = k_dim;
          if (p.bias != nullptr)
            bias = (const CType *) p.bias[g];
        }
      else if constexpr (kKind == GMLP_KERNEL_GEMM_DGRAD)
        {
          m_dim = group.rows; n_dim = p.k; k_dim = p.n;
          a = (const ABType *) (p.rows_a + group.offset[0]);
          b = (const ABType *) p.fixed[g];
          c = (CType *) (p.rows_b + group.offset[1]);
          a_si = k_dim; a_sk = 1;
          b_sk = n_dim; b_sj = 1;
        }
      else
        {
          m_dim = p.n; n_dim = p.k; k_dim = group.rows;
          a = (const ABType *) (p.rows_a + group.offset[0]);
          b = (const ABType *) (p.rows_b + group.offset[1]);
          c = (CType *) p.fixed[g];
          a_si = 1; a_sk = m_dim;
          b_sk = n_dim; b_sj = 1;
          accumulate = p.accumulate != nullptr && p.accumulate[g] != 0;
          /* No rows: dW_i stays as it is (the same for the whole block). */
          if (accumulate && k_dim == 0)
            continue;
        }

#pragma unroll
      for (int r = 0; r < kSimtMicroM; r++)
#pragma unroll
        for (int s = 0; s < kSimtMicroN; s++)
          acc[r][s] = 0.0f;

      for (int64_t k0 = 0; k0 < k_dim; k0 += kSimtTileK)
        {
#pragma unroll
          for (int l = 0; l < kSimtLoadsA; l++)
            {
              const int e = threadIdx.x + l * kSimtThreads;
              const int i = kAAlongK ? e / kSimtTileK : e % kSimtTileM;
              const int kk = kAAlongK ? e % kSimtTileK : e / kSimtTileM;
              const int64_t gi = row0 + i, gk = k0 + kk;

              a_tile[kk][i] = gi < m_dim && gk < k_dim ?
                              to_float<kAB> (a[gi * a_si + gk * a_sk]) : 0.0f;
            }
#pragma unroll
          for (int l = 0; l < kSimtLoadsB; l++)
            {
              const int e = threadIdx.x + l * kSimtThreads;
              const int j = kBAlongK ? e / kSimtTileK : e % kSimtTileN;
              const int kk = kBAlongK ? e % kSimtTileK : e / kSimtTileN;
              const int64_t gj = col0 + j, gk = k0 + kk;

              b_tile[kk][j] = gj < n_dim && gk < k_dim ?
                              to_float<kAB> (b[gk * b_sk + gj * b_sj]) : 0.0f;
            }
          __syncthreads ();

#pragma unroll
          for (int kk = 0; kk < kSimtTileK; kk++)
            {
              float av[kSimtMicroM], bv[kSimtMicroN];

#pragma unroll
              for (int r = 0; r < kSimtMicroM; r++)
                av[r] = a_tile[kk][ty + r * kSimtThreadsM];
#pragma unroll
              for (int s = 0; s < kSimtMicroN; s++)
                bv[s] = b_tile[kk][tx + s * kSimtThreadsN];
#pragma unroll
              for (int r = 0; r < kSimtMicroM; r++)
#pragma unroll
                for (int s = 0; s < kSimtMicroN; s++)
                  acc[r][s] = fmaf (av[r], bv[s], acc[r][s]);
            }
          __syncthreads ();   /* the slices are restaged next round */
        }

#pragma unroll
      for (int r = 0; r < kSimtMicroM; r++)
#pragma unroll
        for (int s = 0; s < kSimtMicroN; s++)
          {
            const int64_t gi = row0 + ty + r * kSimtThreadsM;
            const int64_t gj = col0 + tx + s * kSimtThreadsN;
            float v = acc[r][s];
            CType *out;

            if (gi >= m_dim || gj >= n_dim)
              continue;
            out = c + gi * n_dim + gj;
            if (bias != nullptr)
              v += to_float<kC> (bias[gj]);
            if (accumulate)
              v += to_float<kC> (*out);
            *out = from_float<kC> (v);
          }
    }
}

}  // namespace gmlp
