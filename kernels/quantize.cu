/* quantize.cu: gmlp_kernel_grouped_quantize(), gmlp_kernel_grouped_dequantize()
 * and gmlp_kernel_quantizer_update()
 *
 * Checks the arguments, describes the layouts and sizes the grids; the
 * device code, and the host code that activation_quantize.cu shares (the
 * checks and description of a quantization, its launches), is in
 * impls/grouped_quantize.cuh, the arithmetic in gmlp-quantize-numeric.h.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "gmlp-quantize-numeric.h"
#include "impls/common.cuh"
#include "impls/grouped_quantize_host.cuh"

namespace gmlp {
namespace {

bool
shape_ok (const GmlpKernelGroupedShape &shape)
{
  return grouped_quant_shape_ok (shape) && shape.cols <= kQuantMaxCols;
}

using QuantizeKernel = void (*) (const GroupedQuantizeParams);

/* The kernel of a pass for the source's dtype (one the checks accepted). */
template <int kPass>
QuantizeKernel
select_kernel (int src_dtype)
{
  switch (src_dtype)
    {
    case GMLP_NUM_FLOAT32:
      return grouped_quantize_kernel<kPass, GMLP_NUM_FLOAT32>;
    case GMLP_NUM_FLOAT16:
      return grouped_quantize_kernel<kPass, GMLP_NUM_FLOAT16>;
    default:
      return grouped_quantize_kernel<kPass, GMLP_NUM_BFLOAT16>;
    }
}

/* Checks a quantize call and fills in the kernels' parameters; *reason
 * says what is wrong. */
GmlpKernelStatus
describe (const GmlpKernelQuantize *q, GroupedQuantizeParams *p, const char **reason)
{
  *reason = nullptr;
  if (q == nullptr || !shape_ok (q->shape))
    return refuse (reason, "invalid shape", GMLP_KERNEL_INVALID_VALUE);
  return describe_grouped_quantize (*q, q->src, q->src_dtype, q->shape.cols, p, reason);
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

  return quantize_check_result (status, select_kernel<kPassQuantize> (GMLP_NUM_BFLOAT16), why, reason);
}

extern "C" size_t
gmlp_kernel_grouped_quantize_workspace_bytes (const GmlpKernelQuantize *q)
{
  return gmlp::grouped_quantize_workspace_bytes (q);
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

  if (status != GMLP_KERNEL_SUCCESS)
    return status;
  (void) describe (q, &params, &reason);
  return launch_grouped_quantize (select_kernel<kPassQuantize> (params.src_dtype),
                                  select_kernel<kPassAmax> (params.src_dtype), params, params, workspace, stream);
}

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_dequantize (const GmlpKernelDequantize *d,
                                cudaStream_t                stream)
{
  using namespace gmlp;
  GroupedDequantizeParams p;
  unsigned blocks = 1;
  cudaError_t err;

  if (d == nullptr || !shape_ok (d->shape) || !is_quant_recipe (d->recipe) ||
      !is_fp8_dtype (d->fp8_dtype) || !is_quant_source_dtype (d->dst_dtype) || d->data == nullptr ||
      d->scale_inv == nullptr || d->dst == nullptr)
    return GMLP_KERNEL_INVALID_VALUE;
  if (d->shape.n_groups > kQuantMaxGroups)
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

  err = quant_grid_blocks (div_up ((uint64_t) d->shape.row_capacity * (uint64_t) d->shape.cols,
                                        kQuantThreads),
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
