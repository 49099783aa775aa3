/* impls/grouped_quantize_host.cuh: the host side of the grouped FP8
 * quantization kernels (impls/grouped_quantize.cuh), shared by quantize.cu
 * and activation_quantize.cu: the argument checks, the workspace, the
 * grid and the launch.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/device_cache.cuh"
#include "impls/grouped_quantize.cuh"

namespace gmlp {

/* gridDim.y is the group. */
constexpr uint32_t kQuantMaxGroups = 65535;
/* Sizes beyond these are refused: they keep every offset far from overflow
 * (the grouped tensors of libgmlp stay well below). kQuantMaxCols bounds the
 * rows of the source (2f for a gated activation's input). */
constexpr int64_t kQuantMaxRows = int64_t (1) << 40;
constexpr int64_t kQuantMaxCols = int64_t (1) << 31;

static inline bool
is_quant_source_dtype (int dtype)
{
  return dtype == GMLP_NUM_FLOAT32 || dtype == GMLP_NUM_FLOAT16 || dtype == GMLP_NUM_BFLOAT16;
}

static inline bool
is_fp8_dtype (int dtype)
{
  return dtype == GMLP_NUM_FLOAT8_E4M3 || dtype == GMLP_NUM_FLOAT8_E5M2;
}

static inline bool
is_quant_recipe (int recipe)
{
  return recipe >= GMLP_QUANT_DELAYED && recipe <= GMLP_QUANT_MXFP8;
}

/* Sizes on the device, at least one group and one column, and rows within
 * kQuantMaxRows; the callers bound the columns. */
static inline bool
grouped_quant_shape_ok (const GmlpKernelGroupedShape &shape)
{
  return shape.device_rows != nullptr && shape.n_groups >= 1 && shape.cols >= 1 &&
         shape.row_capacity >= 0 && shape.row_capacity <= kQuantMaxRows;
}

static inline GmlpKernelStatus
refuse (const char **reason, const char *why, GmlpKernelStatus status)
{
  *reason = why;
  return status;
}

/* Checks the quantization of a call whose shape the caller has checked and
 * fills in *p; *reason says what is wrong. q is a GmlpKernelQuantize or a
 * GmlpKernelActivationQuantize, which name their shape, scaling and outputs
 * alike; the source is src, src_cols values of src_dtype per row. */
template <typename Call>
inline GmlpKernelStatus
describe_grouped_quantize (const Call            &q,
                           const void            *src,
                           int                    src_dtype,
                           int64_t                src_cols,
                           GroupedQuantizeParams *p,
                           const char           **reason)
{
  int64_t derived;

  if (!is_quant_recipe (q.recipe))
    return refuse (reason, "unknown scaling recipe", GMLP_KERNEL_INVALID_VALUE);
  if (!is_quant_source_dtype (src_dtype))
    return refuse (reason, "the source must be float32, float16 or bfloat16", GMLP_KERNEL_INVALID_VALUE);
  if (!is_fp8_dtype (q.fp8_dtype))
    return refuse (reason, "the target must be an FP8 dtype", GMLP_KERNEL_INVALID_VALUE);
  if (q.shape.n_groups > kQuantMaxGroups)
    return refuse (reason, "more than 65535 groups", GMLP_KERNEL_UNSUPPORTED);
  if (src == nullptr || q.data == nullptr || q.scale_inv == nullptr)
    return refuse (reason, "missing operand", GMLP_KERNEL_INVALID_VALUE);
  if (q.recipe == GMLP_QUANT_DELAYED &&
      (q.state == nullptr || q.history_length < 1 || q.history_length > kGmlpQuantMaxHistory))
    return refuse (reason, "delayed scaling needs its state", GMLP_KERNEL_INVALID_VALUE);
  if (q.columnwise != nullptr && gmlp_quant_columnwise_has_scales (q.recipe, q.flags) &&
      q.columnwise_scale_inv == nullptr)
    return refuse (reason, "the columnwise copy needs its scales", GMLP_KERNEL_INVALID_VALUE);

  p->device_rows = q.shape.device_rows;
  p->n_groups = q.shape.n_groups;
  p->cols = q.shape.cols;
  p->row_capacity = q.shape.row_capacity;
  p->recipe = q.recipe;
  p->flags = q.flags;
  p->src_dtype = src_dtype;
  p->fp8_dtype = q.fp8_dtype;
  p->src = (const uint8_t *) src;
  p->data = (uint8_t *) q.data;
  p->scale_inv = (uint8_t *) q.scale_inv;
  p->columnwise = (uint8_t *) q.columnwise;
  p->columnwise_scale_inv = q.columnwise != nullptr &&
                            gmlp_quant_columnwise_has_scales (q.recipe, q.flags) ?
                            (uint8_t *) q.columnwise_scale_inv : nullptr;
  derived = gmlp_quant_derived_row_block (q.recipe, q.flags, q.columnwise != nullptr);
  p->derived_rows = derived > 0 ? q.derived_rows : nullptr;
  p->derived_block = derived;
  p->state = q.state;
  p->state_stride = gmlp_quant_state_stride (q.history_length);
  p->amax = nullptr;
  gmlp_quant_blocks (q.recipe, q.flags, 0, &p->block_rows, &p->block_cols);
  gmlp_quant_blocks (q.recipe, q.flags, 1, &p->col_block_rows, &p->col_block_cols);
  p->scale_cols = gmlp_quant_blocks_along (q.shape.cols, p->block_cols);
  p->col_scale_cols = gmlp_quant_blocks_along (q.shape.cols, p->col_block_cols);
  p->scale_size = gmlp_quant_scale_size (q.recipe);

  p->vector_ok = q.shape.cols % 8 == 0 && src_cols % 8 == 0 && is_aligned (src, 16) &&
                 is_aligned (q.data, 16) && (q.columnwise == nullptr || is_aligned (q.columnwise, 16));
  p->n_layouts = p->columnwise_scale_inv != nullptr ? 4 : 3;
  p->layouts[kLayoutSrc] = { 1, (uint64_t) src_cols * gmlp_num_dtype_size (src_dtype) };
  p->layouts[kLayoutData] = { 1, (uint64_t) q.shape.cols };
  p->layouts[kLayoutScale] = { p->block_rows, (uint64_t) p->scale_cols * p->scale_size };
  p->layouts[kLayoutColumnScale] = { p->col_block_rows, (uint64_t) p->col_scale_cols * p->scale_size };
  return GMLP_KERNEL_SUCCESS;
}

/* CURRENT's amax workspace: one amax per group. */
template <typename Call>
inline size_t
grouped_quantize_workspace_bytes (const Call *q)
{
  if (q == nullptr || q->recipe != GMLP_QUANT_CURRENT)
    return 0;
  return sizeof (uint32_t) * q->shape.n_groups;
}

/* Whether the GPU gives kernel its staged tile (dynamic shared memory)
 * beside the kernel's own shared memory; *why says why not. Both sizes are
 * asked once per device (device_cache.cuh). */
template <typename Params>
inline GmlpKernelStatus
quantize_kernel_fits (void (*kernel) (Params), const char **why)
{
  int optin = 0;
  size_t static_smem = 0;
  cudaError_t err;

  err = current_device_attribute (cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin);
  if (err == cudaSuccess)
    err = current_static_smem ((const void *) kernel, &static_smem);
  if (err != cudaSuccess)
    return refuse (why, "cannot query the device", record_cuda_error (err));
  if (static_smem + kQuantTileBytes > (size_t) optin)
    return refuse (why, "the GPU has too little shared memory per block (about 80 KB needed)",
                   GMLP_KERNEL_UNSUPPORTED);
  return GMLP_KERNEL_SUCCESS;
}

/* What a _check() entry answers once describe() has said status (and why):
 * whether the kernel fits as well, and why not in *reason where asked. */
template <typename Params>
inline GmlpKernelStatus
quantize_check_result (GmlpKernelStatus   status,
                       void             (*kernel) (Params),
                       const char        *why,
                       const char       **reason)
{
  if (status == GMLP_KERNEL_SUCCESS)
    status = quantize_kernel_fits (kernel, &why);
  if (reason != nullptr)
    *reason = why;
  return status;
}

/* Blocks along x: enough to fill the GPU (resident_per_sm a multiprocessor),
 * no more than there are work units. */
static inline cudaError_t
quant_grid_blocks (uint64_t work_units, int resident_per_sm, unsigned *blocks)
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

/* For launch_grouped_quantize(), which sets the amaxes' workspace. */
static inline GroupedQuantizeParams &
quantize_part (GroupedQuantizeParams &p)
{
  return p;
}

/* Launches the quantization that params describe (describe_grouped_quantize()
 * of its quantize_part()): for CURRENT, the amax pass (amax_kernel with
 * amax_params) into workspace, zeroed first, then kernel with params. One
 * row of blocks, enough to fill the GPU, no more than the tiles could be;
 * the blocks share the tiles out themselves (start_walk()). */
template <typename Params>
inline GmlpKernelStatus
launch_grouped_quantize (void         (*kernel) (Params),
                         void         (*amax_kernel) (Params),
                         Params         params,
                         Params         amax_params,
                         void          *workspace,
                         cudaStream_t   stream)
{
  const GroupedQuantizeParams &p = quantize_part (params);
  const size_t staging = p.block_rows == 0 ? kQuantByteTileBytes :
                         p.recipe == GMLP_QUANT_BLOCKWISE && p.vector_ok ? kQuantBlockwiseStagingBytes :
                         kQuantTileBytes;
  int resident = 0;
  unsigned blocks = 1;
  uint64_t tiles;
  GmlpKernelStatus status;
  cudaError_t err;

  if (p.recipe == GMLP_QUANT_CURRENT)
    {
      if (workspace == nullptr)
        return GMLP_KERNEL_INVALID_VALUE;
      quantize_part (params).amax = (uint32_t *) workspace;
      quantize_part (amax_params).amax = (uint32_t *) workspace;
    }

  /* Once per kernel and device (device_cache.cuh). */
  err = current_max_dynamic_smem ((const void *) kernel, (int) kQuantTileBytes);
  if (err == cudaSuccess && amax_kernel != kernel)
    err = current_max_dynamic_smem ((const void *) amax_kernel, (int) kQuantTileBytes);
  if (err == cudaSuccess)
    err = current_blocks_per_sm ((const void *) kernel, kQuantThreads, staging, &resident);
  /* At most: every group's partial band and the capacity's whole ones. */
  tiles = ((uint64_t) gmlp_quant_blocks_along (p.row_capacity, kQuantTile) + p.n_groups) *
          (uint64_t) gmlp_quant_blocks_along (p.cols, kQuantTile);
  if (err == cudaSuccess)
    err = quant_grid_blocks (tiles, resident, &blocks);
  if (err != cudaSuccess)
    return record_cuda_error (err);

  if (p.recipe == GMLP_QUANT_CURRENT)
    {
      /* The amaxes first: a per-tensor scale needs the whole group. */
      err = cudaMemsetAsync (workspace, 0, sizeof (uint32_t) * p.n_groups, stream);
      if (err != cudaSuccess)
        return record_cuda_error (err);
      amax_kernel<<<blocks, kQuantThreads, staging, stream>>> (amax_params);
      status = check_launch ();
      if (status != GMLP_KERNEL_SUCCESS)
        return status;
    }
  kernel<<<blocks, kQuantThreads, staging, stream>>> (params);
  return check_launch ();
}

}  // namespace gmlp
