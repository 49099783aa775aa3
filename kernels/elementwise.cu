/* elementwise.cu: y = alpha x + beta y and sums of squares over grouped
 * tensors whose sizes are on the device (the arithmetic of the demo's loss
 * and optimizer step)
 *
 * One launch each: blockIdx.y is the group, and the blocks of a group find
 * its member offsets in both layouts with a warp-wide scan over the sizes
 * of the groups before it (clamped to the row capacity as every kernel
 * clamps them), then stride over its elements. Sums of squares are written
 * per block, and the host adds them in a fixed order, so the result is the
 * same on every run.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-activation-numeric.h"
#include "gmlp-kernels.h"
#include "impls/common.cuh"

namespace {

using namespace gmlp;

constexpr int kThreads = kElementwiseThreads;
/* Blocks per group along x: enough to fill the GPU for one large group. */
constexpr unsigned kMaxBlocksPerGroup = 1024;

struct ElementwiseParams
{
  const int64_t *rows;
  uint32_t       n_groups;
  int64_t        cols;
  int64_t        row_capacity;
  const void    *x;
  int            x_dtype;
  void          *y;
  int            y_dtype;
  float          alpha;
  float          beta;
  double        *partials;   /* sum_squares: one per block */
};

/* The first warp computes the member offsets of group g in the layouts of
 * two element sizes, and its clamped row count. */
__device__ void
member_offsets (const ElementwiseParams &p, uint32_t g, uint64_t *offset_x, uint64_t *offset_y,
                int64_t *rows_g)
{
  const int lane = threadIdx.x % 32;
  const uint64_t row_x = (uint64_t) p.cols * gmlp_num_dtype_size (p.x_dtype);
  const uint64_t row_y = (uint64_t) p.cols * gmlp_num_dtype_size (p.y_dtype);
  int64_t before = 0;          /* rows of the groups so far, clamped */
  uint64_t ox = 0, oy = 0;

  for (uint32_t base = 0; base < g; base += 32)
    {
      uint32_t j = base + lane;
      int64_t r = j < g ? p.rows[j] : 0;
      int64_t incl, clamped;

      r = r > 0 ? r : 0;
      if (r > p.row_capacity)
        r = p.row_capacity;
      incl = r;
#pragma unroll
      for (int d = 1; d < 32; d *= 2)
        {
          int64_t other = __shfl_up_sync (0xffffffffu, incl, d);
          if (lane >= d)
            incl += other;
        }
      /* rows before j, clamped; then j's own share of what is left */
      {
        int64_t excl = before + incl - r;
        int64_t left = p.row_capacity - (excl < p.row_capacity ? excl : p.row_capacity);
        clamped = r < left ? r : left;
      }
      {
        uint64_t sx = gmlp_num_member_stride (clamped, row_x);
        uint64_t sy = gmlp_num_member_stride (clamped, row_y);
#pragma unroll
        for (int d = 16; d > 0; d /= 2)
          {
            sx += __shfl_down_sync (0xffffffffu, sx, d);
            sy += __shfl_down_sync (0xffffffffu, sy, d);
          }
        ox += __shfl_sync (0xffffffffu, sx, 0);
        oy += __shfl_sync (0xffffffffu, sy, 0);
      }
      before += __shfl_sync (0xffffffffu, incl, 31);
      if (before > p.row_capacity)
        before = p.row_capacity;
    }

  {
    int64_t r = p.rows[g] > 0 ? p.rows[g] : 0;
    int64_t left = p.row_capacity - before;
    *rows_g = r < left ? r : left;
  }
  *offset_x = ox;
  *offset_y = oy;
}

/* Eight elements from element i (a multiple of 8) of a 16-byte aligned
 * base, in one or two 16-byte loads. */
__device__ __forceinline__ void
load8 (const uint8_t *base, int dtype, uint64_t i, float v[8])
{
  uint4 q[2];
  const uint4 *src = (const uint4 *) (base + i * gmlp_num_dtype_size (dtype));

  q[0] = src[0];
  if (dtype == GMLP_NUM_FLOAT32)
    q[1] = src[1];
#pragma unroll
  for (int k = 0; k < 8; k++)
    v[k] = gmlp_num_load_float (q, dtype, k);
}

__device__ __forceinline__ void
store8 (uint8_t *base, int dtype, uint64_t i, const float v[8])
{
  uint4 q[2];
  uint4 *dst = (uint4 *) (base + i * gmlp_num_dtype_size (dtype));

#pragma unroll
  for (int k = 0; k < 8; k++)
    gmlp_num_store_float (q, dtype, k, v[k]);
  dst[0] = q[0];
  if (dtype == GMLP_NUM_FLOAT32)
    dst[1] = q[1];
}

template <bool kSumSquares>
__global__ void __launch_bounds__ (kThreads)
elementwise_kernel (const __grid_constant__ ElementwiseParams p)
{
  __shared__ uint64_t offset_x, offset_y;
  __shared__ int64_t rows_g;
  __shared__ double warp_sums[kThreads / 32];
  const uint32_t g = blockIdx.y;
  double sum = 0.0;

  if (threadIdx.x < 32)
    {
      uint64_t ox, oy;
      int64_t r;

      member_offsets (p, g, &ox, &oy, &r);
      if (threadIdx.x == 0)
        offset_x = ox, offset_y = oy, rows_g = r;
    }
  __syncthreads ();

  {
    const uint64_t n = (uint64_t) rows_g * (uint64_t) p.cols;
    const uint8_t *x = (const uint8_t *) p.x + offset_x;
    uint8_t *y = (uint8_t *) p.y + offset_y;

    uint64_t first = 0;

    /* Eight elements at a time where both members start 16-byte aligned
     * (the memory-bound case: vector loads), the rest one by one. */
    if (!kSumSquares &&
        ((((uintptr_t) y) | (p.x != NULL ? (uintptr_t) x : (uintptr_t) 0)) & 15) == 0)
      {
        const uint64_t n8 = n / 8;

        for (uint64_t j = (uint64_t) blockIdx.x * kThreads + threadIdx.x; j < n8;
             j += (uint64_t) gridDim.x * kThreads)
          {
            float yv[8], xv[8];

            load8 (y, p.y_dtype, j * 8, yv);
            if (p.x != NULL)
              load8 (x, p.x_dtype, j * 8, xv);
#pragma unroll
            for (int k = 0; k < 8; k++)
              {
                /* As below: rounded products and sum, never an FMA. */
                float v = gmlp_act_mul (p.beta, yv[k]);
                if (p.x != NULL)
                  v = gmlp_act_add (v, gmlp_act_mul (p.alpha, xv[k]));
                yv[k] = v;
              }
            store8 (y, p.y_dtype, j * 8, yv);
          }
        first = n8 * 8;
      }

    for (uint64_t i = first + (uint64_t) blockIdx.x * kThreads + threadIdx.x; i < n;
         i += (uint64_t) gridDim.x * kThreads)
      {
        if (kSumSquares)
          {
            /* Squared in FP64 as the CPU does: a float square overflows
             * past 1.8e19. */
            double v = gmlp_num_load_float (x, p.x_dtype, i);
            sum += v * v;
          }
        else
          {
            /* Rounded products and sum, never an FMA: the CPU's bits. */
            float v = gmlp_act_mul (p.beta, gmlp_num_load_float (y, p.y_dtype, i));
            if (p.x != NULL)
              v = gmlp_act_add (v, gmlp_act_mul (p.alpha, gmlp_num_load_float (x, p.x_dtype, i)));
            gmlp_num_store_float (y, p.y_dtype, i, v);
          }
      }
  }

  if (kSumSquares)
    {
#pragma unroll
      for (int d = 16; d > 0; d /= 2)
        sum += __shfl_down_sync (0xffffffffu, sum, d);
      if (threadIdx.x % 32 == 0)
        warp_sums[threadIdx.x / 32] = sum;
      __syncthreads ();
      if (threadIdx.x == 0)
        {
          double total = 0.0;
          for (int w = 0; w < kThreads / 32; w++)
            total += warp_sums[w];
          p.partials[(uint64_t) g * gridDim.x + blockIdx.x] = total;
        }
    }
}

bool
supported (int dtype)
{
  return dtype == GMLP_NUM_FLOAT32 || dtype == GMLP_NUM_FLOAT16 || dtype == GMLP_NUM_BFLOAT16;
}

unsigned
blocks_per_group (const GmlpKernelGroupedShape *shape)
{
  int sms = 132;
  uint64_t per_group, blocks;

  (void) current_sm_count (&sms);
  /* A group may hold every row: size for the capacity, spread over the
   * groups, within what fills the GPU. */
  per_group = (uint64_t) shape->row_capacity * (uint64_t) shape->cols;
  blocks = div_up (per_group, (uint64_t) kThreads * 4);
  if (blocks > (uint64_t) sms * kBlocksPerSm)
    blocks = (uint64_t) sms * kBlocksPerSm;
  if (blocks > kMaxBlocksPerGroup)
    blocks = kMaxBlocksPerGroup;
  return blocks > 0 ? (unsigned) blocks : 1u;
}

GmlpKernelStatus
launch (const GmlpKernelGroupedShape *shape, const ElementwiseParams &p, bool sum_squares,
        unsigned blocks, cudaStream_t stream)
{
  dim3 grid (blocks, shape->n_groups);
  cudaError_t err;

  if (sum_squares)
    elementwise_kernel<true><<<grid, kThreads, 0, stream>>> (p);
  else
    elementwise_kernel<false><<<grid, kThreads, 0, stream>>> (p);
  err = cudaGetLastError ();
  return err == cudaSuccess ? GMLP_KERNEL_SUCCESS : record_cuda_error (err);
}

bool
valid_shape (const GmlpKernelGroupedShape *shape)
{
  return shape != NULL && (shape->n_groups == 0 || shape->device_rows != NULL) &&
         shape->cols >= 0 && shape->row_capacity >= 0 && shape->n_groups <= 65535;
}

}  // namespace

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_axpby (const GmlpKernelGroupedShape *shape,
                           const void                   *x,
                           int                           x_dtype,
                           void                         *y,
                           int                           y_dtype,
                           float                         alpha,
                           float                         beta,
                           cudaStream_t                  stream)
{
  ElementwiseParams p;

  if (!valid_shape (shape) || y == NULL)
    return GMLP_KERNEL_INVALID_VALUE;
  if (!supported (y_dtype) || (x != NULL && !supported (x_dtype)))
    return GMLP_KERNEL_UNSUPPORTED;
  if (shape->n_groups == 0 || shape->cols == 0 || shape->row_capacity == 0)
    return GMLP_KERNEL_SUCCESS;

  p = { shape->device_rows, shape->n_groups, shape->cols, shape->row_capacity,
        x, x != NULL ? x_dtype : y_dtype, y, y_dtype, alpha, beta, NULL };
  return launch (shape, p, false, blocks_per_group (shape), stream);
}

extern "C" size_t
gmlp_kernel_grouped_sum_squares_partials (const GmlpKernelGroupedShape *shape)
{
  if (!valid_shape (shape) || shape->n_groups == 0)
    return 0;
  return (size_t) blocks_per_group (shape) * shape->n_groups;
}

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_sum_squares (const GmlpKernelGroupedShape *shape,
                                 const void                   *x,
                                 int                           dtype,
                                 double                       *partials,
                                 cudaStream_t                  stream)
{
  ElementwiseParams p;

  if (!valid_shape (shape) || x == NULL || partials == NULL)
    return GMLP_KERNEL_INVALID_VALUE;
  if (!supported (dtype))
    return GMLP_KERNEL_UNSUPPORTED;
  if (shape->n_groups == 0)
    return GMLP_KERNEL_SUCCESS;

  p = { shape->device_rows, shape->n_groups, shape->cols, shape->row_capacity,
        x, dtype, NULL, dtype, 0.0f, 0.0f, partials };
  return launch (shape, p, true, blocks_per_group (shape), stream);
}
