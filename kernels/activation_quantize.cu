/* activation_quantize.cu: gmlp_kernel_grouped_activation_quantize()
 *
 * Checks the arguments, describes the layouts as quantize.cu does (the
 * source being FC1's output, f or 2f columns wide), picks the kernel
 * instance for the dtype and activation and sizes the grid. The device code
 * is in impls/grouped_activation_quantize.cuh.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "gmlp-activation-numeric.h"
#include "gmlp-quantize-numeric.h"
#include "impls/common.cuh"
#include "impls/grouped_activation_quantize.cuh"

static_assert (GMLP_NUM_ACT_GELU == (int) GMLP_KERNEL_ACT_GELU, "activation codes");
static_assert (GMLP_NUM_ACT_RELU == (int) GMLP_KERNEL_ACT_RELU, "activation codes");
static_assert (GMLP_NUM_ACT_SRELU == (int) GMLP_KERNEL_ACT_SRELU, "activation codes");
static_assert (GMLP_NUM_ACT_SWIGLU == (int) GMLP_KERNEL_ACT_SWIGLU, "activation codes");
static_assert (GMLP_NUM_ACT_GEGLU == (int) GMLP_KERNEL_ACT_GEGLU, "activation codes");

namespace gmlp {
namespace {

/* gridDim.y is the group. */
constexpr uint32_t kMaxGroups = 65535;
/* As in quantize.cu: sizes beyond these keep every offset far from
 * overflow; kMaxCols bounds the input's rows (2f when gated). */
constexpr int64_t kMaxRows = int64_t (1) << 40;
constexpr int64_t kMaxCols = int64_t (1) << 31;

using ActivationQuantizeKernel = void (*) (const ActivationQuantizeParams);

template <int kDtype>
ActivationQuantizeKernel
pick_activation (int activation)
{
  switch (activation)
    {
    case GMLP_KERNEL_ACT_GELU:
      return grouped_activation_quantize_kernel<kDtype, GMLP_KERNEL_ACT_GELU>;
    case GMLP_KERNEL_ACT_RELU:
      return grouped_activation_quantize_kernel<kDtype, GMLP_KERNEL_ACT_RELU>;
    case GMLP_KERNEL_ACT_SRELU:
      return grouped_activation_quantize_kernel<kDtype, GMLP_KERNEL_ACT_SRELU>;
    case GMLP_KERNEL_ACT_SWIGLU:
      return grouped_activation_quantize_kernel<kDtype, GMLP_KERNEL_ACT_SWIGLU>;
    case GMLP_KERNEL_ACT_GEGLU:
      return grouped_activation_quantize_kernel<kDtype, GMLP_KERNEL_ACT_GEGLU>;
    default:
      return nullptr;
    }
}

ActivationQuantizeKernel
select_kernel (int dtype, int activation)
{
  switch (dtype)
    {
    case GMLP_NUM_FLOAT32:
      return pick_activation<GMLP_NUM_FLOAT32> (activation);
    case GMLP_NUM_FLOAT16:
      return pick_activation<GMLP_NUM_FLOAT16> (activation);
    case GMLP_NUM_BFLOAT16:
      return pick_activation<GMLP_NUM_BFLOAT16> (activation);
    default:
      return nullptr;
    }
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

GmlpKernelStatus
refuse (const char **reason, const char *why, GmlpKernelStatus status)
{
  *reason = why;
  return status;
}

/* Checks a call and fills in the kernel's parameters and instance; *reason
 * says what is wrong. The quantization's part is laid out exactly as
 * quantize.cu's describe() lays it out. */
GmlpKernelStatus
describe (const GmlpKernelActivationQuantize *q,
          ActivationQuantizeParams           *ap,
          ActivationQuantizeKernel           *kernel,
          const char                        **reason)
{
  GroupedQuantizeParams *p = &ap->q;
  int64_t derived, in_cols;

  *reason = nullptr;
  if (q == nullptr || q->shape.device_rows == nullptr || q->shape.n_groups < 1 ||
      q->shape.cols < 1 || q->shape.row_capacity < 0 || q->shape.row_capacity > kMaxRows)
    return refuse (reason, "invalid shape", GMLP_KERNEL_INVALID_VALUE);
  in_cols = is_gated_activation (q->activation) ? 2 * q->shape.cols : q->shape.cols;
  if (in_cols > kMaxCols)
    return refuse (reason, "rows too wide", GMLP_KERNEL_INVALID_VALUE);
  *kernel = select_kernel (q->dtype, q->activation);
  if (*kernel == nullptr)
    return refuse (reason, "the input must be float32, float16 or bfloat16, and the activation known",
                   GMLP_KERNEL_INVALID_VALUE);
  if (!is_recipe (q->recipe))
    return refuse (reason, "unknown scaling recipe", GMLP_KERNEL_INVALID_VALUE);
  if (!is_fp8_dtype (q->fp8_dtype))
    return refuse (reason, "the target must be an FP8 dtype", GMLP_KERNEL_INVALID_VALUE);
  if (q->shape.n_groups > kMaxGroups)
    return refuse (reason, "more than 65535 groups", GMLP_KERNEL_UNSUPPORTED);
  if (q->in == nullptr || q->data == nullptr || q->scale_inv == nullptr)
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
  p->src_dtype = q->dtype;
  p->fp8_dtype = q->fp8_dtype;
  p->src = (const uint8_t *) q->in;
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
  p->layouts[kLayoutSrc] = { 1, (uint64_t) in_cols * gmlp_num_dtype_size (q->dtype) };
  p->layouts[kLayoutData] = { 1, (uint64_t) q->shape.cols };
  p->layouts[kLayoutScale] = { p->block_rows, (uint64_t) p->scale_cols * p->scale_size };
  p->layouts[kLayoutColumnScale] = { p->col_block_rows, (uint64_t) p->col_scale_cols * p->scale_size };

  ap->in_cols = (uint64_t) in_cols;
  ap->amax_pass = 0;
  return GMLP_KERNEL_SUCCESS;
}

/* Shared memory: the staged tile (dynamic) beside the kernel's own. */
cudaError_t
shared_memory_ok (ActivationQuantizeKernel kernel, bool *ok)
{
  int device = 0, optin = 0;
  cudaFuncAttributes attrs;
  cudaError_t err;

  err = cudaGetDevice (&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute (&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess)
    err = cudaFuncGetAttributes (&attrs, kernel);
  if (err != cudaSuccess)
    return err;
  *ok = attrs.sharedSizeBytes + kQuantTileBytes <= (size_t) optin;
  return cudaSuccess;
}

/* Blocks along x for each group, as quantize.cu sizes them: enough to fill
 * the GPU for one group that holds every row, no more than it could use. */
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

}  // namespace
}  // namespace gmlp

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_activation_quantize_check (const GmlpKernelActivationQuantize *q,
                                               const char                        **reason)
{
  using namespace gmlp;
  ActivationQuantizeParams params;
  ActivationQuantizeKernel kernel = nullptr;
  const char *why = nullptr;
  GmlpKernelStatus status = describe (q, &params, &kernel, &why);
  bool smem = false;
  cudaError_t err;

  if (status == GMLP_KERNEL_SUCCESS)
    {
      err = shared_memory_ok (kernel, &smem);
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
gmlp_kernel_grouped_activation_quantize_workspace_bytes (const GmlpKernelActivationQuantize *q)
{
  if (q == nullptr || q->recipe != GMLP_QUANT_CURRENT)
    return 0;
  return sizeof (uint32_t) * q->shape.n_groups;
}

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_activation_quantize (const GmlpKernelActivationQuantize *q,
                                         void                               *workspace,
                                         cudaStream_t                        stream)
{
  using namespace gmlp;
  ActivationQuantizeParams params;
  ActivationQuantizeKernel kernel = nullptr;
  const char *reason = nullptr;
  GmlpKernelStatus status = gmlp_kernel_grouped_activation_quantize_check (q, &reason);
  int resident = 0;
  unsigned blocks = 1;
  uint64_t tiles;
  cudaError_t err;

  if (status != GMLP_KERNEL_SUCCESS)
    return status;
  (void) describe (q, &params, &kernel, &reason);
  if (q->recipe == GMLP_QUANT_CURRENT)
    {
      if (workspace == nullptr)
        return GMLP_KERNEL_INVALID_VALUE;
      params.q.amax = (uint32_t *) workspace;
    }

  err = cudaFuncSetAttribute (kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) kQuantTileBytes);
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor (&resident, kernel, kQuantThreads, kQuantTileBytes);
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
        /* The amaxes of the activation first: a per-tensor scale needs the
         * whole group. */
        ActivationQuantizeParams amax_params = params;

        err = cudaMemsetAsync (workspace, 0, sizeof (uint32_t) * q->shape.n_groups, stream);
        if (err != cudaSuccess)
          return record_cuda_error (err);
        amax_params.amax_pass = 1;
        kernel<<<grid, kQuantThreads, kQuantTileBytes, stream>>> (amax_params);
        status = check_launch ();
        if (status != GMLP_KERNEL_SUCCESS)
          return status;
      }
    kernel<<<grid, kQuantThreads, kQuantTileBytes, stream>>> (params);
  }
  return check_launch ();
}
