/* grouped_gemm_sm90_fp8_blocks_wide.cu: the blockwise-scaled FP8 FPROP
 * (and DGRAD) instances of the Hopper grouped GEMM on 128 × 192 tiles
 * (see grouped_gemm_sm90_fp8_blocks.cu, TileScales and wide_tiles())
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "impls/grouped_gemm_sm90.cuh"

namespace gmlp {
namespace sm90 {

GMLP_SM90_DEFINE_LAUNCH (kOpsE4m3E4m3BlocksWide, GMLP_KERNEL_GEMM_FPROP)
GMLP_SM90_DEFINE_LAUNCH (kOpsE5m2E4m3BlocksWide, GMLP_KERNEL_GEMM_FPROP)

}  // namespace sm90
}  // namespace gmlp
