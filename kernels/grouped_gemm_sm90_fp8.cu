/* grouped_gemm_sm90_fp8.cu: the FP8 FPROP instances of the Hopper grouped
 * GEMM
 *
 * Both operands K-major, so one instance per pair of formats serves FPROP
 * and DGRAD (impls/grouped_gemm_sm90.cuh). E5M2 × E5M2 is not a product
 * the layers make.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "impls/grouped_gemm_sm90.cuh"

namespace gmlp {
namespace sm90 {

GMLP_SM90_DEFINE_LAUNCH (kOpsE4m3E4m3, GMLP_KERNEL_GEMM_FPROP)
GMLP_SM90_DEFINE_LAUNCH (kOpsE4m3E5m2, GMLP_KERNEL_GEMM_FPROP)
GMLP_SM90_DEFINE_LAUNCH (kOpsE5m2E4m3, GMLP_KERNEL_GEMM_FPROP)

}  // namespace sm90
}  // namespace gmlp
