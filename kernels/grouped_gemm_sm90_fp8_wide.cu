/* grouped_gemm_sm90_fp8_wide.cu: the per-tensor FP8 FPROP instances of the
 * Hopper grouped GEMM on 128 × 192 tiles (FPROP and DGRAD; see
 * grouped_gemm_sm90_fp8.cu and wide_tiles())
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "impls/grouped_gemm_sm90.cuh"

namespace gmlp {
namespace sm90 {

GMLP_SM90_DEFINE_LAUNCH (kOpsE4m3E4m3Wide, GMLP_KERNEL_GEMM_FPROP)
GMLP_SM90_DEFINE_LAUNCH (kOpsE4m3E5m2Wide, GMLP_KERNEL_GEMM_FPROP)
GMLP_SM90_DEFINE_LAUNCH (kOpsE5m2E4m3Wide, GMLP_KERNEL_GEMM_FPROP)

}  // namespace sm90
}  // namespace gmlp
