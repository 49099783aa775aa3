/* grouped_gemm_simt.cu: gmlp_kernel_device_gemm_simt() and its workspace
 *
 * Checks the arguments on the host, copies the caller's host arrays into
 * the workspace through kernel parameters (gmlp_kernel_write_table(): no
 * allocation, no wait, capturable in a graph), lets device_groups_kernel
 * number the output tiles of every group from the device sizes, then
 * launches one wave of the GEMM kernel over that tile list. The device
 * code is in impls/device_groups.cuh and impls/grouped_gemm_simt.cuh.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "gmlp-kernels.h"
#include "impls/common.cuh"
#include "impls/device_cache.cuh"
#include "impls/device_groups.cuh"
#include "impls/grouped_gemm_simt.cuh"

namespace gmlp {
namespace {

/* The gridDim.y limit that every grouped kernel shares (GMLP_MAX_GROUPS). */
constexpr uint32_t kMaxGroups = 65535;
/* The layer's limit on features; keeps tile counts far from overflow. */
constexpr int64_t kMaxDim = 0x7fffffff;
/* Tile counts stay below this, so that sums of them cannot overflow. */
constexpr uint64_t kMaxTiles = 1ull << 62;

static_assert (sizeof (void *) == sizeof (uint64_t), "tables of pointers are tables of words");

using DeviceGemmKernel = void (*) (const DeviceGemmParams);

constexpr uint64_t
align_up (uint64_t bytes)
{
  return div_up (bytes, kGmlpMemberAlignment) * kGmlpMemberAlignment;
}

/* Where things are in the workspace; each piece starts 256-aligned. The
 * size depends only on the number of groups, so that one workspace serves
 * every call of a layer. */
struct WorkspaceLayout
{
  uint64_t fixed;        /* n_groups pointers: W_i or dW_i */
  uint64_t bias;         /* n_groups pointers */
  uint64_t accumulate;   /* n_groups bytes, padded to whole words */
  uint64_t groups;       /* n_groups DeviceGroup */
  uint64_t total_tiles;  /* one uint64_t */
  uint64_t bytes;
};

WorkspaceLayout
workspace_layout (uint32_t n_groups)
{
  WorkspaceLayout layout;

  layout.fixed = 0;
  layout.bias = layout.fixed + align_up ((uint64_t) n_groups * sizeof (void *));
  layout.accumulate = layout.bias + align_up ((uint64_t) n_groups * sizeof (void *));
  layout.groups = layout.accumulate + align_up (n_groups);
  layout.total_tiles = layout.groups + align_up ((uint64_t) n_groups * sizeof (DeviceGroup));
  layout.bytes = layout.total_tiles + kGmlpMemberAlignment;
  return layout;
}

template <int kKind>
DeviceGemmKernel
pick_types (int ab_dtype, int c_dtype)
{
  switch (ab_dtype)
    {
    case GMLP_NUM_FLOAT32:
      if (c_dtype == GMLP_NUM_FLOAT32)
        return device_gemm_simt_kernel<kKind, GMLP_NUM_FLOAT32, GMLP_NUM_FLOAT32>;
      return nullptr;
    case GMLP_NUM_FLOAT16:
      if (c_dtype == GMLP_NUM_FLOAT16)
        return device_gemm_simt_kernel<kKind, GMLP_NUM_FLOAT16, GMLP_NUM_FLOAT16>;
      if (c_dtype == GMLP_NUM_FLOAT32)
        return device_gemm_simt_kernel<kKind, GMLP_NUM_FLOAT16, GMLP_NUM_FLOAT32>;
      return nullptr;
    case GMLP_NUM_BFLOAT16:
      if (c_dtype == GMLP_NUM_BFLOAT16)
        return device_gemm_simt_kernel<kKind, GMLP_NUM_BFLOAT16, GMLP_NUM_BFLOAT16>;
      if (c_dtype == GMLP_NUM_FLOAT32)
        return device_gemm_simt_kernel<kKind, GMLP_NUM_BFLOAT16, GMLP_NUM_FLOAT32>;
      return nullptr;
    default:
      return nullptr;
    }
}

DeviceGemmKernel
select_kernel (GmlpKernelGemmKind kind, int ab_dtype, int c_dtype)
{
  switch (kind)
    {
    case GMLP_KERNEL_GEMM_FPROP: return pick_types<GMLP_KERNEL_GEMM_FPROP> (ab_dtype, c_dtype);
    case GMLP_KERNEL_GEMM_DGRAD: return pick_types<GMLP_KERNEL_GEMM_DGRAD> (ab_dtype, c_dtype);
    case GMLP_KERNEL_GEMM_WGRAD: return pick_types<GMLP_KERNEL_GEMM_WGRAD> (ab_dtype, c_dtype);
    default:                     return nullptr;
    }
}

bool
is_gemm_dtype (int dtype)
{
  return dtype == GMLP_NUM_FLOAT32 || dtype == GMLP_NUM_FLOAT16 || dtype == GMLP_NUM_BFLOAT16;
}

/* Every one of the n host pointers is set and aligned to alignment. */
bool
pointers_valid (const void * const *pointers,
                uint32_t            n,
                uint64_t            alignment)
{
  if (pointers == nullptr)
    return false;
  for (uint32_t g = 0; g < n; g++)
    if (pointers[g] == nullptr || !is_aligned (pointers[g], alignment))
      return false;
  return true;
}

/* One row-grouped operand of cols columns of element_size bytes. */
bool
describe_rows_operand (GroupedOperand             *op,
                       const void                 *data,
                       int64_t                     cols,
                       uint32_t                    element_size,
                       const GmlpKernelDeviceGemm *gemm)
{
  GmlpKernelGroupedShape shape;

  if (data == nullptr || !is_aligned (data, element_size))
    return false;
  shape.device_rows = gemm->device_rows;
  shape.n_groups = gemm->n_groups;
  shape.cols = cols;
  shape.row_capacity = gemm->row_capacity;
  return describe_operand (op, data, element_size, &shape);
}

/* Copies n_bytes bytes of host memory (any length) into dst, whole words
 * at a time from a buffer on the stack, so nothing is allocated. */
GmlpKernelStatus
write_byte_table (uint8_t       *dst,
                  const uint8_t *src,
                  uint32_t       n_bytes,
                  cudaStream_t   stream)
{
  uint64_t words[512];

  for (uint32_t done = 0; done < n_bytes; done += sizeof words)
    {
      uint32_t len = n_bytes - done < sizeof words ? n_bytes - done : (uint32_t) sizeof words;
      GmlpKernelStatus status;

      memset (words, 0, sizeof words);
      memcpy (words, src + done, len);
      status = gmlp_kernel_write_table (dst + done, words, div_up (len, sizeof (uint64_t)) * sizeof (uint64_t),
                                        stream);
      if (status != GMLP_KERNEL_SUCCESS)
        return status;
    }
  return GMLP_KERNEL_SUCCESS;
}

}  // namespace
}  // namespace gmlp

extern "C" size_t
gmlp_kernel_device_gemm_simt_workspace_bytes (const GmlpKernelDeviceGemm *gemm)
{
  if (gemm == nullptr)
    return 0;
  return (size_t) gmlp::workspace_layout (gemm->n_groups).bytes;
}

extern "C" GmlpKernelStatus
gmlp_kernel_device_gemm_simt (const GmlpKernelDeviceGemm *gemm,
                              void                       *workspace,
                              cudaStream_t                stream)
{
  using namespace gmlp;
  const bool wgrad = gemm != nullptr && gemm->kind == GMLP_KERNEL_GEMM_WGRAD;
  uint32_t ab_size, c_size;
  WorkspaceLayout layout;
  DeviceGroupsParams scan;
  DeviceGemmParams params;
  DeviceGemmKernel kernel;
  uint64_t row_tiles_max, bound, blocks;
  uint8_t *ws = static_cast<uint8_t *> (workspace);
  int sm_count = 0, blocks_per_sm = 0;
  GmlpKernelStatus status;
  cudaError_t err;

  /* Arguments first: nothing is launched unless all of them hold. */
  if (gemm == nullptr ||
      (gemm->kind != GMLP_KERNEL_GEMM_FPROP && gemm->kind != GMLP_KERNEL_GEMM_DGRAD &&
       gemm->kind != GMLP_KERNEL_GEMM_WGRAD) ||
      gemm->n < 0 || gemm->k < 0 || gemm->row_capacity < 0)
    return GMLP_KERNEL_INVALID_VALUE;
  ab_size = gmlp_num_dtype_size (gemm->ab_dtype);
  c_size = gmlp_num_dtype_size (gemm->c_dtype);
  if (ab_size == 0 || c_size == 0)
    return GMLP_KERNEL_INVALID_VALUE;
  if (!is_gemm_dtype (gemm->ab_dtype) ||
      (gemm->c_dtype != gemm->ab_dtype && gemm->c_dtype != GMLP_NUM_FLOAT32))
    return GMLP_KERNEL_UNSUPPORTED;
  /* Operands that belong to another kind of product are a caller's mistake. */
  if ((wgrad && (gemm->c_rows != nullptr || gemm->weight != nullptr || gemm->bias != nullptr)) ||
      (!wgrad && (gemm->b_rows != nullptr || gemm->wgrad != nullptr || gemm->accumulate != nullptr)) ||
      (gemm->kind == GMLP_KERNEL_GEMM_DGRAD && gemm->bias != nullptr))
    return GMLP_KERNEL_INVALID_VALUE;
  if (gemm->n_groups == 0)
    return GMLP_KERNEL_SUCCESS;
  if (gemm->n_groups > kMaxGroups || gemm->n > kMaxDim || gemm->k > kMaxDim)
    return GMLP_KERNEL_UNSUPPORTED;
  /* A product with an empty dimension has no row-grouped operand to walk
   * (its rows would be 0 bytes wide); the layers never ask for one. */
  if (gemm->n == 0 || gemm->k == 0)
    return GMLP_KERNEL_UNSUPPORTED;
  if (gemm->device_rows == nullptr || workspace == nullptr ||
      !is_aligned (workspace, sizeof (uint64_t)))
    return GMLP_KERNEL_INVALID_VALUE;

  switch (gemm->kind)
    {
    case GMLP_KERNEL_GEMM_FPROP:
      if (!describe_rows_operand (&scan.operands[0], gemm->a, gemm->k, ab_size, gemm) ||
          !describe_rows_operand (&scan.operands[1], gemm->c_rows, gemm->n, c_size, gemm) ||
          !pointers_valid (gemm->weight, gemm->n_groups, ab_size) ||
          (gemm->bias != nullptr && !pointers_valid (gemm->bias, gemm->n_groups, c_size)))
        return GMLP_KERNEL_INVALID_VALUE;
      break;
    case GMLP_KERNEL_GEMM_DGRAD:
      if (!describe_rows_operand (&scan.operands[0], gemm->a, gemm->n, ab_size, gemm) ||
          !describe_rows_operand (&scan.operands[1], gemm->c_rows, gemm->k, c_size, gemm) ||
          !pointers_valid (gemm->weight, gemm->n_groups, ab_size))
        return GMLP_KERNEL_INVALID_VALUE;
      break;
    default:
      if (!describe_rows_operand (&scan.operands[0], gemm->a, gemm->n, ab_size, gemm) ||
          !describe_rows_operand (&scan.operands[1], gemm->b_rows, gemm->k, ab_size, gemm) ||
          !pointers_valid ((const void * const *) gemm->wgrad, gemm->n_groups, c_size))
        return GMLP_KERNEL_INVALID_VALUE;
      break;
    }

  kernel = select_kernel (gemm->kind, gemm->ab_dtype, gemm->c_dtype);
  if (kernel == nullptr)
    return GMLP_KERNEL_UNSUPPORTED;

  /* The tile list: FPROP and DGRAD tile each group's rows, WGRAD has the
   * same n × k tiles in every group (a group without rows still writes its
   * zeros). Its length is only known on the device; bound it here, from
   * the rows the smaller allocation can hold (groups never share rows). */
  layout = workspace_layout (gemm->n_groups);
  scan.device_rows = gemm->device_rows;
  scan.n_groups = gemm->n_groups;
  scan.groups = reinterpret_cast<DeviceGroup *> (ws + layout.groups);
  scan.total_tiles = reinterpret_cast<uint64_t *> (ws + layout.total_tiles);
  if (wgrad)
    {
      scan.tile_rows = 0;
      scan.col_tiles = div_up ((uint64_t) gemm->k, kSimtTileN);
      scan.fixed_tiles = div_up ((uint64_t) gemm->n, kSimtTileM) * scan.col_tiles;
      if (scan.fixed_tiles > kMaxTiles / gemm->n_groups)
        return GMLP_KERNEL_UNSUPPORTED;
      bound = scan.fixed_tiles * gemm->n_groups;
    }
  else
    {
      uint64_t rows_max = min_u64 (scan.operands[0].capacity / scan.operands[0].row_bytes,
                                   scan.operands[1].capacity / scan.operands[1].row_bytes);

      scan.tile_rows = kSimtTileM;
      scan.col_tiles = div_up ((uint64_t) (gemm->kind == GMLP_KERNEL_GEMM_FPROP ? gemm->n : gemm->k),
                               kSimtTileN);
      scan.fixed_tiles = 0;
      row_tiles_max = rows_max / kSimtTileM + gemm->n_groups;
      if (row_tiles_max > kMaxTiles / scan.col_tiles)
        return GMLP_KERNEL_UNSUPPORTED;
      bound = row_tiles_max * scan.col_tiles;
    }

  err = current_sm_count (&sm_count);
  if (err == cudaSuccess)
    err = current_blocks_per_sm ((const void *) kernel, kSimtThreads, 0, &blocks_per_sm);
  if (err != cudaSuccess)
    return record_cuda_error (err);
  blocks = min_u64 (bound, (uint64_t) sm_count * (blocks_per_sm > 0 ? blocks_per_sm : 1));

  /* The host arrays, into the workspace. */
  if (wgrad)
    {
      status = gmlp_kernel_write_table (ws + layout.fixed, gemm->wgrad,
                                        (size_t) gemm->n_groups * sizeof (void *), stream);
      if (status == GMLP_KERNEL_SUCCESS && gemm->accumulate != nullptr)
        status = write_byte_table (ws + layout.accumulate, gemm->accumulate, gemm->n_groups, stream);
    }
  else
    {
      status = gmlp_kernel_write_table (ws + layout.fixed, gemm->weight,
                                        (size_t) gemm->n_groups * sizeof (void *), stream);
      if (status == GMLP_KERNEL_SUCCESS && gemm->bias != nullptr)
        status = gmlp_kernel_write_table (ws + layout.bias, gemm->bias,
                                          (size_t) gemm->n_groups * sizeof (void *), stream);
    }
  if (status != GMLP_KERNEL_SUCCESS)
    return status;

  device_groups_kernel<<<1, kElementwiseThreads, 0, stream>>> (scan);
  status = check_launch ();
  if (status != GMLP_KERNEL_SUCCESS || blocks == 0)
    return status;

  params.groups = scan.groups;
  params.total_tiles = scan.total_tiles;
  params.n_groups = gemm->n_groups;
  params.n = gemm->n;
  params.k = gemm->k;
  params.col_tiles = scan.col_tiles;
  params.rows_a = scan.operands[0].data;
  params.rows_b = scan.operands[1].data;
  params.fixed = reinterpret_cast<void * const *> (ws + layout.fixed);
  params.bias = gemm->bias != nullptr ?
                reinterpret_cast<const void * const *> (ws + layout.bias) : nullptr;
  params.accumulate = gemm->accumulate != nullptr ? ws + layout.accumulate : nullptr;

  kernel<<<(unsigned) blocks, kSimtThreads, 0, stream>>> (params);
  return check_launch ();
}
