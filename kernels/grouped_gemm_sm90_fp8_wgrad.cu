/* grouped_gemm_sm90_fp8_wgrad.cu: the FP8 WGRAD instances of the Hopper
 * grouped GEMM (the columnwise copies of dy and x, K-major, one output
 * matrix per group)
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "impls/grouped_gemm_sm90.cuh"

namespace gmlp {
namespace sm90 {

GMLP_SM90_DEFINE_LAUNCH (kOpsE4m3E4m3, GMLP_KERNEL_GEMM_WGRAD)
GMLP_SM90_DEFINE_LAUNCH (kOpsE4m3E5m2, GMLP_KERNEL_GEMM_WGRAD)
GMLP_SM90_DEFINE_LAUNCH (kOpsE5m2E4m3, GMLP_KERNEL_GEMM_WGRAD)

}  // namespace sm90
}  // namespace gmlp
