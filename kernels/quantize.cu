/* quantize.cu: gmlp_kernel_grouped_quantize(), gmlp_kernel_grouped_dequantize()
 * and gmlp_kernel_quantizer_update()
 *
 * Checks the arguments, describes the layouts and sizes the grids; the
 * device code is in impls/grouped_quantize.cuh, the arithmetic in
 * gmlp-quantize-numeric.h.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "gmlp-quantize-numeric.h"
#include "impls/common.cuh"
#include "impls/grouped_quantize.cuh"

namespace gmlp {
namespace {

/* gridDim.y is the group. */
constexpr uint32_t kMaxGroups = 65535;
/* Sizes beyond these are refused: they keep every offset far from overflow
 * (the grouped tensors of libgmlp stay well below). */
constexpr int64_t kMaxRows = int64_t (1) << 40;
constexpr int64_t kMaxCols = int64_t (1) << 31;

bool
is_source_dtype (int dtype)
{
  return dtype == GMLP_NUM_FLOAT32 || dtype == GMLP_NUM_FLOAT16 || dtype == GMLP_NUM_BFLOAT16;
}

bool
is_fp8_dtype (int dtype)
{
  return dtype == GMLP_NUM_FLOAT8_E4M3 || dtype == GMLP_NUM_FLOAT8_E5M2;
}

bool
is_recipe (int recipe)
{
  return recipe >= GMLP_QUANT_DELAYED && recipe <= GMLP_QUANT_MXFP8;
}

bool
shape_ok (const GmlpKernelGroupedShape &shape)
{
  return shape.device_rows != nullptr && shape.n_groups >= 1 && shape.cols >= 1 &&
         shape.cols <= kMaxCols && shape.row_capacity >= 0 && shape.row_capacity <= kMaxRows;
}

/* Blocks along x for each group: enough to fill the GPU for one group that
 * holds every row, no more than that group could use. */
cudaError_t
blocks_per_group (uint64_t work_units, int resident_per_sm, unsigned *blocks)
{
  int sm_count = 1;
  cudaError_t err = current_sm_count (&sm_count);
  uint64_t cap;

  if (err != cudaSuccess)
    return err;
  cap = (uint64_t) sm_count * (uint64_t) (resident_per_sm > 0 ? resident_per_sm : 1);
  if (work_units > cap)
    work_units = cap;
  *blocks = (unsigned) (work_units > 0 ? work_units : 1);
  return cudaSuccess;
}

/* Shared memory: the staged tile (dynamic) beside the kernel's own. */
cudaError_t
shared_memory_ok (bool *ok)
{
  int device = 0, optin = 0;
  cudaFuncAttributes attrs;
  cudaError_t err;

  err = cudaGetDevice (&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute (&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess)
    err = cudaFuncGetAttributes (&attrs, grouped_quantize_kernel<kPassQuantize>);
  if (err != cudaSuccess)
    return err;
  *ok = attrs.sharedSizeBytes + kQuantTileBytes <= (size_t) optin;
  return cudaSuccess;
}

GmlpKernelStatus
refuse (const char **reason, const char *why, GmlpKernelStatus status)
{
  *reason = why;
  return status;
}

/* Checks a quantize call and fills in the kernels' parameters; *reason
 * says what is wrong. */
GmlpKernelStatus
describe (const GmlpKernelQuantize *q, GroupedQuantizeParams *p, const char **reason)
{
  int64_t derived;

  *reason = nullptr;
  if (q == nullptr || !shape_ok (q->shape))
    return refuse (reason, "invalid shape", GMLP_KERNEL_INVALID_VALUE);
  if (!is_recipe (q->recipe))
    return refuse (reason, "unknown scaling recipe", GMLP_KERNEL_INVALID_VALUE);
  if (!is_source_dtype (q->src_dtype))
    return refuse (reason, "the source must be float32, float16 or bfloat16", GMLP_KERNEL_INVALID_VALUE);
  if (!is_fp8_dtype (q->fp8_dtype))
    return refuse (reason, "the target must be an FP8 dtype", GMLP_KERNEL_INVALID_VALUE);
  if (q->shape.n_groups > kMaxGroups)
    return refuse (reason, "more than 65535 groups", GMLP_KERNEL_UNSUPPORTED);
  if (q->src == nullptr || q->data == nullptr || q->scale_inv == nullptr)
    return refuse (reason, "missing operand", GMLP_KERNEL_INVALID_VALUE);
  if (q->recipe == GMLP_QUANT_DELAYED &&
      (q->state == nullptr || q->history_length < 1 || q->history_length > kGmlpQuantMaxHistory))
    return refuse (reason, "delayed scaling needs its state", GMLP_KERNEL_INVALID_VALUE);
  if (q->columnwise != nullptr && gmlp_quant_columnwise_has_scales (q->recipe, q->flags) &&
      q->columnwise_scale_inv == nullptr)
    return refuse (reason, "the columnwise copy needs its scales", GMLP_KERNEL_INVALID_VALUE);

  p->device_rows = q->shape.device_rows;
  p->n_groups = q->shape.n_groups;
  p->cols = q->shape.cols;
  p->row_capacity = q->shape.row_capacity;
  p->recipe = q->recipe;
  p->flags = q->flags;
  p->src_dtype = q->src_dtype;
  p->fp8_dtype = q->fp8_dtype;
  p->src = (const uint8_t *) q->src;
  p->data = (uint8_t *) q->data;
  p->scale_inv = (uint8_t *) q->scale_inv;
  p->columnwise = (uint8_t *) q->columnwise;
  p->columnwise_scale_inv = q->columnwise != nullptr &&
                            gmlp_quant_columnwise_has_scales (q->recipe, q->flags) ?
                            (uint8_t *) q->columnwise_scale_inv : nullptr;
  derived = gmlp_quant_derived_row_block (q->recipe, q->flags, q->columnwise != nullptr);
  p->derived_rows = derived > 0 ? q->derived_rows : nullptr;
  p->derived_block = derived;
  p->state = q->state;
  p->state_stride = gmlp_quant_state_stride (q->history_length);
  p->amax = nullptr;
  gmlp_quant_blocks (q->recipe, q->flags, 0, &p->block_rows, &p->block_cols);
  gmlp_quant_blocks (q->recipe, q->flags, 1, &p->col_block_rows, &p->col_block_cols);
  p->scale_cols = gmlp_quant_blocks_along (q->shape.cols, p->block_cols);
  p->col_scale_cols = gmlp_quant_blocks_along (q->shape.cols, p->col_block_cols);
  p->scale_size = gmlp_quant_scale_size (q->recipe);

  p->n_layouts = p->columnwise_scale_inv != nullptr ? 4 : 3;
  p->layouts[kLayoutSrc] = { 1, (uint64_t) q->shape.cols * gmlp_num_dtype_size (q->src_dtype) };
  p->layouts[kLayoutData] = { 1, (uint64_t) q->shape.cols };
  p->layouts[kLayoutScale] = { p->block_rows, (uint64_t) p->scale_cols * p->scale_size };
  p->layouts[kLayoutColumnScale] = { p->col_block_rows, (uint64_t) p->col_scale_cols * p->scale_size };
  return GMLP_KERNEL_SUCCESS;
}

}  // namespace
}  // namespace gmlp

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_quantize_check (const GmlpKernelQuantize *q,
                                    const char              **reason)
{
  using namespace gmlp;
  GroupedQuantizeParams params;
  const char *why = nullptr;
  GmlpKernelStatus status = describe (q, &params, &why);
  bool smem = false;
  cudaError_t err;

  if (status == GMLP_KERNEL_SUCCESS)
    {
      err = shared_memory_ok (&smem);
      if (err != cudaSuccess)
        {
          status = record_cuda_error (err);
          why = "cannot query the device";
        }
      else if (!smem)
        {
          status = GMLP_KERNEL_UNSUPPORTED;
          why = "the GPU has too little shared memory per block (about 80 KB needed)";
        }
    }
  if (reason != nullptr)
    *reason = why;
  return status;
}

extern "C" size_t
gmlp_kernel_grouped_quantize_workspace_bytes (const GmlpKernelQuantize *q)
{
  if (q == nullptr || q->recipe != GMLP_QUANT_CURRENT)
    return 0;
  return sizeof (uint32_t) * q->shape.n_groups;
}

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_quantize (const GmlpKernelQuantize *q,
                              void                     *workspace,
                              cudaStream_t              stream)
{
  using namespace gmlp;
  GroupedQuantizeParams params;
  const char *reason = nullptr;
  GmlpKernelStatus status = gmlp_kernel_grouped_quantize_check (q, &reason);
  int resident = 0;
  unsigned blocks = 1;
  uint64_t tiles;
  cudaError_t err;

  if (status != GMLP_KERNEL_SUCCESS)
    return status;
  (void) describe (q, &params, &reason);
  if (q->recipe == GMLP_QUANT_CURRENT)
    {
      if (workspace == nullptr)
        return GMLP_KERNEL_INVALID_VALUE;
      params.amax = (uint32_t *) workspace;
    }

  err = cudaFuncSetAttribute (grouped_quantize_kernel<kPassQuantize>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, (int) kQuantTileBytes);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute (grouped_quantize_kernel<kPassAmax>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, (int) kQuantTileBytes);
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor (&resident, grouped_quantize_kernel<kPassQuantize>,
                                                         kQuantThreads, kQuantTileBytes);
  /* The tiles one group could have if it held every row. */
  tiles = (uint64_t) gmlp_quant_blocks_along (q->shape.row_capacity, kQuantTile) *
          (uint64_t) gmlp_quant_blocks_along (q->shape.cols, kQuantTile);
  if (err == cudaSuccess)
    err = blocks_per_group (tiles, resident, &blocks);
  if (err != cudaSuccess)
    return record_cuda_error (err);

  {
    const dim3 grid (blocks, q->shape.n_groups);

    if (q->recipe == GMLP_QUANT_CURRENT)
      {
        /* The amaxes first: a per-tensor scale needs the whole group. */
        err = cudaMemsetAsync (workspace, 0, sizeof (uint32_t) * q->shape.n_groups, stream);
        if (err != cudaSuccess)
          return record_cuda_error (err);
        grouped_quantize_kernel<kPassAmax><<<grid, kQuantThreads, kQuantTileBytes, stream>>> (params);
        status = check_launch ();
        if (status != GMLP_KERNEL_SUCCESS)
          return status;
      }
    grouped_quantize_kernel<kPassQuantize><<<grid, kQuantThreads, kQuantTileBytes, stream>>> (params);
  }
  return check_launch ();
}

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_dequantize (const GmlpKernelDequantize *d,
                                cudaStream_t                stream)
{
  using namespace gmlp;
  GroupedDequantizeParams p;
  unsigned blocks = 1;
  cudaError_t err;

  if (d == nullptr || !shape_ok (d->shape) || !is_recipe (d->recipe) || !is_fp8_dtype (d->fp8_dtype) ||
      !is_source_dtype (d->dst_dtype) || d->data == nullptr || d->scale_inv == nullptr ||
      d->dst == nullptr)
    return GMLP_KERNEL_INVALID_VALUE;
  if (d->shape.n_groups > kMaxGroups)
    return GMLP_KERNEL_UNSUPPORTED;

  p.device_rows = d->shape.device_rows;
  p.n_groups = d->shape.n_groups;
  p.cols = d->shape.cols;
  p.row_capacity = d->shape.row_capacity;
  p.recipe = d->recipe;
  p.fp8_dtype = d->fp8_dtype;
  p.dst_dtype = d->dst_dtype;
  p.data = (const uint8_t *) d->data;
  p.scale_inv = (const uint8_t *) d->scale_inv;
  p.dst = (uint8_t *) d->dst;
  gmlp_quant_blocks (d->recipe, d->flags, 0, &p.block_rows, &p.block_cols);
  p.scale_cols = gmlp_quant_blocks_along (d->shape.cols, p.block_cols);
  p.n_layouts = 4;
  p.layouts[kLayoutSrc] = { 1, 0 };   /* unused */
  p.layouts[kLayoutData] = { 1, (uint64_t) d->shape.cols };
  p.layouts[kLayoutScale] = { p.block_rows, (uint64_t) p.scale_cols * gmlp_quant_scale_size (d->recipe) };
  p.layouts[kLayoutDst] = { 1, (uint64_t) d->shape.cols * gmlp_num_dtype_size (d->dst_dtype) };

  err = blocks_per_group (div_up ((uint64_t) d->shape.row_capacity * (uint64_t) d->shape.cols, kQuantThreads),
                          kBlocksPerSm, &blocks);
  if (err != cudaSuccess)
    return record_cuda_error (err);
  grouped_dequantize_kernel<<<dim3 (blocks, d->shape.n_groups), kQuantThreads, 0, stream>>> (p);
  return check_launch ();
}

extern "C" GmlpKernelStatus
gmlp_kernel_quantizer_update (float        *state,
                              uint32_t      n_groups,
                              uint32_t      history_length,
                              int           fp8_dtype,
                              int           margin,
                              cudaStream_t  stream)
{
  using namespace gmlp;

  if (state == nullptr || !is_fp8_dtype (fp8_dtype) || history_length < 1 ||
      history_length > kGmlpQuantMaxHistory || margin < 0 || margin > kGmlpQuantMaxMargin)
    return GMLP_KERNEL_INVALID_VALUE;
  if (n_groups == 0)
    return GMLP_KERNEL_SUCCESS;
  quantizer_update_kernel<<<(unsigned) div_up (n_groups, kQuantThreads), kQuantThreads, 0, stream>>>
    (state, n_groups, history_length, fp8_dtype, margin);
  return check_launch ();
}
