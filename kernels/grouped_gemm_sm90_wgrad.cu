/* grouped_gemm_sm90_wgrad.cu: the WGRAD instances of the Hopper grouped GEMM
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "impls/grouped_gemm_sm90.cuh"

namespace gmlp {
namespace sm90 {

GMLP_SM90_DEFINE_LAUNCH (kOpsBf16, GMLP_KERNEL_GEMM_WGRAD)
GMLP_SM90_DEFINE_LAUNCH (kOpsFp16, GMLP_KERNEL_GEMM_WGRAD)

}  // namespace sm90
}  // namespace gmlp
