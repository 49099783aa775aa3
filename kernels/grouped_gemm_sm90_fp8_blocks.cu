/* grouped_gemm_sm90_fp8_blocks.cu: the blockwise-scaled FP8 FPROP (and
 * DGRAD) instances of the Hopper grouped GEMM
 *
 * A's scales per row and 128-deep block, B's per 128 × 128 tile of the
 * weights (impls/grouped_gemm_sm90.cuh).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "impls/grouped_gemm_sm90.cuh"

namespace gmlp {
namespace sm90 {

GMLP_SM90_DEFINE_LAUNCH (kOpsE4m3E4m3Blocks, GMLP_KERNEL_GEMM_FPROP)
GMLP_SM90_DEFINE_LAUNCH (kOpsE5m2E4m3Blocks, GMLP_KERNEL_GEMM_FPROP)

}  // namespace sm90
}  // namespace gmlp
