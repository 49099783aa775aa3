/* split.cu: FP32 values as sums of BF16 parts, and sums of FP32 parts
 *
 * The router's gate multiplies FP32 values on BF16 tensor cores: each FP32
 * operand is split into BF16 parts (gmlp_num_split_bfloat16(), whose bits
 * the CPU backend shares), the products of the parts are exact in FP32,
 * and the blocks of the FP32 result that belong to one value are added
 * back (sum_parts). gmlp-kernels.h states both contracts.
 *
 * split_kernel walks 32 × 32 tiles of the source, 256 threads a tile, each
 * thread four values of a column (the loads coalesced along the rows). An
 * output laid out along the columns is stored at once; one laid out along
 * the rows (row stride 1: the matrix transposed, as a product's K-major
 * operand wants it) goes through shared memory, so that a warp stores 32
 * consecutive values of it too.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "impls/common.cuh"

namespace {

using namespace gmlp;

constexpr int kTile = 32;
constexpr int kThreads = 256;
constexpr int kRowsPerThread = kTile * kTile / kThreads;
static_assert (kThreads % kTile == 0 && kRowsPerThread * (kThreads / kTile) == kTile,
               "a tile is the block's threads times kRowsPerThread");

struct SplitParams
{
  int64_t         rows;
  int64_t         cols;
  const float    *src;
  int64_t         src_stride;
  int             n_parts;
  uint16_t       *dst;
  int64_t         dst_row_stride;
  int64_t         dst_col_stride;
  int             n_outputs;
  int             part[GMLP_KERNEL_MAX_SPLIT_OUTPUTS];
  int64_t         offset[GMLP_KERNEL_MAX_SPLIT_OUTPUTS];
  uint64_t        col_tiles;
  uint64_t        n_tiles;
};

template <bool kTransposed>
__global__ void __launch_bounds__ (kThreads)
split_kernel (const __grid_constant__ SplitParams p)
{
  /* 32-bit slots (+1 column): a column of the tile read across a warp
   * hits 32 banks. */
  __shared__ uint32_t staged[kTransposed ? GMLP_KERNEL_MAX_SPLIT_PARTS : 1][kTile][kTile + 1];
  const int tx = threadIdx.x % kTile;
  const int ty = threadIdx.x / kTile;

  for (uint64_t t = blockIdx.x; t < p.n_tiles; t += gridDim.x)
    {
      const int64_t r0 = (int64_t) (t / p.col_tiles) * kTile;
      const int64_t c0 = (int64_t) (t % p.col_tiles) * kTile;

#pragma unroll
      for (int i = 0; i < kRowsPerThread; i++)
        {
          const int lr = ty + i * (kThreads / kTile);
          const int64_t r = r0 + lr;
          const int64_t c = c0 + tx;
          uint16_t parts[GMLP_KERNEL_MAX_SPLIT_PARTS];

          if (r >= p.rows || c >= p.cols)
            continue;
          gmlp_num_split_bfloat16 (p.src[r * p.src_stride + c], p.n_parts, parts);
          if (kTransposed)
            {
              for (int q = 0; q < p.n_parts; q++)
                staged[q][lr][tx] = parts[q];
            }
          else
            {
              const int64_t at = r * p.dst_row_stride + c * p.dst_col_stride;

              for (int j = 0; j < p.n_outputs; j++)
                p.dst[p.offset[j] + at] = parts[p.part[j]];
            }
        }

      if (kTransposed)
        {
          __syncthreads ();
          /* Thread tx now stores row r0 + tx: consecutive in the output. */
#pragma unroll
          for (int i = 0; i < kRowsPerThread; i++)
            {
              const int lc = ty + i * (kThreads / kTile);
              const int64_t r = r0 + tx;
              const int64_t c = c0 + lc;

              if (r >= p.rows || c >= p.cols)
                continue;
              {
                const int64_t at = r * p.dst_row_stride + c * p.dst_col_stride;

                for (int j = 0; j < p.n_outputs; j++)
                  p.dst[p.offset[j] + at] = (uint16_t) staged[p.part[j]][tx][lc];
              }
            }
          __syncthreads ();
        }
    }
}

struct SumParams
{
  int64_t         rows;
  int64_t         cols;
  const float    *src;
  int64_t         src_stride;
  int             n_parts;
  int64_t         offset[GMLP_KERNEL_MAX_SPLIT_OUTPUTS];
  float          *dst;
  int64_t         dst_stride;
  int             accumulate;
};

__global__ void __launch_bounds__ (kThreads)
sum_parts_kernel (const __grid_constant__ SumParams p)
{
  const uint64_t n = (uint64_t) p.rows * (uint64_t) p.cols;

  for (uint64_t i = (uint64_t) blockIdx.x * kThreads + threadIdx.x; i < n;
       i += (uint64_t) gridDim.x * kThreads)
    {
      const int64_t r = (int64_t) (i / (uint64_t) p.cols);
      const int64_t c = (int64_t) (i % (uint64_t) p.cols);
      const int64_t at = r * p.src_stride + c;
      float v = p.src[p.offset[p.n_parts - 1] + at];
      float *out = p.dst + r * p.dst_stride + c;

      /* The order of the contract: the last part first. Additions only:
       * nothing to contract into an FMA, the CPU's bits. */
      for (int q = p.n_parts - 1; q > 0; q--)
        v = v + p.src[p.offset[q - 1] + at];
      *out = p.accumulate ? *out + v : v;
    }
}

unsigned
grid_blocks (uint64_t wanted)
{
  int sms = 132;
  uint64_t cap;

  (void) current_sm_count (&sms);
  cap = (uint64_t) sms * kBlocksPerSm;
  if (wanted > cap)
    wanted = cap;
  return wanted > 0 ? (unsigned) wanted : 1u;
}

}  // namespace

extern "C" GmlpKernelStatus
gmlp_kernel_split_bfloat16 (const GmlpKernelSplit *split,
                            cudaStream_t           stream)
{
  SplitParams p;
  uint64_t row_tiles;
  bool transposed;

  if (split == NULL || split->rows < 0 || split->cols < 0 || split->n_parts < 1 ||
      split->n_parts > GMLP_KERNEL_MAX_SPLIT_PARTS || split->n_outputs < 1 ||
      split->n_outputs > GMLP_KERNEL_MAX_SPLIT_OUTPUTS)
    return GMLP_KERNEL_INVALID_VALUE;
  for (uint32_t j = 0; j < split->n_outputs; j++)
    if (split->part[j] >= split->n_parts || split->offset[j] < 0)
      return GMLP_KERNEL_INVALID_VALUE;
  if (split->rows == 0 || split->cols == 0)
    return GMLP_KERNEL_SUCCESS;
  if (split->src == NULL || split->dst == NULL)
    return GMLP_KERNEL_INVALID_VALUE;

  p.rows = split->rows;
  p.cols = split->cols;
  p.src = split->src;
  p.src_stride = split->src_stride;
  p.n_parts = (int) split->n_parts;
  p.dst = split->dst;
  p.dst_row_stride = split->dst_row_stride;
  p.dst_col_stride = split->dst_col_stride;
  p.n_outputs = (int) split->n_outputs;
  for (int j = 0; j < GMLP_KERNEL_MAX_SPLIT_OUTPUTS; j++)
    {
      p.part[j] = j < p.n_outputs ? (int) split->part[j] : 0;
      p.offset[j] = j < p.n_outputs ? split->offset[j] : 0;
    }
  row_tiles = div_up ((uint64_t) p.rows, kTile);
  p.col_tiles = div_up ((uint64_t) p.cols, kTile);
  p.n_tiles = row_tiles * p.col_tiles;

  /* NOTE: an output whose rows are its unit stride is the transposed
   * layout; written directly its stores would be kTile values apart. */
  transposed = p.dst_row_stride == 1 && p.dst_col_stride != 1;
  if (transposed)
    split_kernel<true><<<grid_blocks (p.n_tiles), kThreads, 0, stream>>> (p);
  else
    split_kernel<false><<<grid_blocks (p.n_tiles), kThreads, 0, stream>>> (p);
  return check_launch ();
}

extern "C" GmlpKernelStatus
gmlp_kernel_sum_parts (const GmlpKernelSumParts *sum,
                       cudaStream_t              stream)
{
  SumParams p;

  if (sum == NULL || sum->rows < 0 || sum->cols < 0 || sum->n_parts < 1 ||
      sum->n_parts > GMLP_KERNEL_MAX_SPLIT_OUTPUTS)
    return GMLP_KERNEL_INVALID_VALUE;
  if (sum->rows == 0 || sum->cols == 0)
    return GMLP_KERNEL_SUCCESS;
  if (sum->src == NULL || sum->dst == NULL)
    return GMLP_KERNEL_INVALID_VALUE;

  p.rows = sum->rows;
  p.cols = sum->cols;
  p.src = sum->src;
  p.src_stride = sum->src_stride;
  p.n_parts = (int) sum->n_parts;
  for (int q = 0; q < GMLP_KERNEL_MAX_SPLIT_OUTPUTS; q++)
    p.offset[q] = q < p.n_parts ? sum->offset[q] : 0;
  p.dst = sum->dst;
  p.dst_stride = sum->dst_stride;
  p.accumulate = sum->accumulate;
  sum_parts_kernel<<<grid_blocks (div_up ((uint64_t) p.rows * (uint64_t) p.cols, kThreads)),
                     kThreads, 0, stream>>> (p);
  return check_launch ();
}
