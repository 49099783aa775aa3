/* grouped_gemm_sm90_fp8_blocks_wide_wgrad.cu: the blockwise-scaled FP8
 * WGRAD instances of the Hopper grouped GEMM on 128 × 192 tiles (see
 * grouped_gemm_sm90_fp8_blocks_wgrad.cu and wide_tiles())
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "impls/grouped_gemm_sm90.cuh"

namespace gmlp {
namespace sm90 {

GMLP_SM90_DEFINE_LAUNCH (kOpsE4m3E4m3BlocksWide, GMLP_KERNEL_GEMM_WGRAD)
GMLP_SM90_DEFINE_LAUNCH (kOpsE5m2E4m3BlocksWide, GMLP_KERNEL_GEMM_WGRAD)

}  // namespace sm90
}  // namespace gmlp
