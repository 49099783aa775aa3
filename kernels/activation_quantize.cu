/* activation_quantize.cu: gmlp_kernel_grouped_activation_quantize()
 *
 * Checks the arguments, picks the kernel instance for the dtype and
 * activation, and describes and launches the quantization with quantize.cu's
 * code (impls/grouped_quantize.cuh), the source being FC1's output, f or 2f
 * columns wide. The device code is in impls/grouped_activation_quantize.cuh.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "gmlp-activation-numeric.h"
#include "gmlp-quantize-numeric.h"
#include "impls/common.cuh"
#include "impls/grouped_activation_quantize.cuh"
#include "impls/grouped_quantize_host.cuh"

static_assert (GMLP_NUM_ACT_GELU == (int) GMLP_KERNEL_ACT_GELU, "activation codes");
static_assert (GMLP_NUM_ACT_RELU == (int) GMLP_KERNEL_ACT_RELU, "activation codes");
static_assert (GMLP_NUM_ACT_SRELU == (int) GMLP_KERNEL_ACT_SRELU, "activation codes");
static_assert (GMLP_NUM_ACT_SWIGLU == (int) GMLP_KERNEL_ACT_SWIGLU, "activation codes");
static_assert (GMLP_NUM_ACT_GEGLU == (int) GMLP_KERNEL_ACT_GEGLU, "activation codes");

namespace gmlp {
namespace {

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

/* Checks a call and fills in the kernel's parameters and instance; *reason
 * says what is wrong. The quantization is described as quantize.cu
 * describes it, the source being in, in_cols values per row. */
GmlpKernelStatus
describe (const GmlpKernelActivationQuantize *q,
          ActivationQuantizeParams           *ap,
          ActivationQuantizeKernel           *kernel,
          const char                        **reason)
{
  GmlpKernelStatus status;
  int64_t in_cols;

  *reason = nullptr;
  if (q == nullptr || !grouped_quant_shape_ok (q->shape))
    return refuse (reason, "invalid shape", GMLP_KERNEL_INVALID_VALUE);
  in_cols = is_gated_activation (q->activation) ? 2 * q->shape.cols : q->shape.cols;
  if (in_cols > kQuantMaxCols)
    return refuse (reason, "rows too wide", GMLP_KERNEL_INVALID_VALUE);
  *kernel = select_kernel (q->dtype, q->activation);
  if (*kernel == nullptr)
    return refuse (reason, "the input must be float32, float16 or bfloat16, and the activation known",
                   GMLP_KERNEL_INVALID_VALUE);
  status = describe_grouped_quantize (*q, q->in, q->dtype, in_cols, &ap->q, reason);
  ap->in_cols = (uint64_t) in_cols;
  ap->amax_pass = 0;
  return status;
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

  return quantize_check_result (status, kernel, why, reason);
}

extern "C" size_t
gmlp_kernel_grouped_activation_quantize_workspace_bytes (const GmlpKernelActivationQuantize *q)
{
  return gmlp::grouped_quantize_workspace_bytes (q);
}

extern "C" GmlpKernelStatus
gmlp_kernel_grouped_activation_quantize (const GmlpKernelActivationQuantize *q,
                                         void                               *workspace,
                                         cudaStream_t                        stream)
{
  using namespace gmlp;
  ActivationQuantizeParams params, amax_params;
  ActivationQuantizeKernel kernel = nullptr;
  const char *reason = nullptr;
  GmlpKernelStatus status = gmlp_kernel_grouped_activation_quantize_check (q, &reason);

  if (status != GMLP_KERNEL_SUCCESS)
    return status;
  (void) describe (q, &params, &kernel, &reason);
  /* CURRENT: the amaxes of the activation first, by the same kernel. */
  amax_params = params;
  amax_params.amax_pass = 1;
  return launch_grouped_quantize (kernel, kernel, params, amax_params, workspace, stream);
}
