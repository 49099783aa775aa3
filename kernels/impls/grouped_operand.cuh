/* impls/grouped_operand.cuh: where the members of a grouped tensor lie when
 * its group sizes are on the device
 *
 * Member i starts at Σ_{j<i} gmlp_num_member_stride (m_j, row_bytes); the
 * allocation holds row_capacity rows plus up to 255 bytes of padding per
 * member (docs/memory-layout.md). Kernels walk the sizes themselves and
 * clamp each group to the rows that fit in the allocation.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-kernels.h"
#include "impls/common.cuh"

namespace gmlp {

/* Offsets saturate here: any offset at or past it is far beyond every
 * allocation (the entry point limits capacities to kMaxTensorBytes). Two
 * saturated values still add without overflowing 64 bits. */
constexpr uint64_t kOffsetSaturation = 1ull << 62;
constexpr uint64_t kMaxTensorBytes = 1ull << 60;

static_assert (2 * kMaxTensorBytes + 2 * kGmlpMemberAlignment < kOffsetSaturation,
               "a clamped member stride must stay below the saturation point");

/* One operand of a grouped tensor whose sizes are on the device. */
struct GroupedOperand
{
  uint8_t  *data;          /* start of member 0 */
  uint64_t  row_bytes;     /* cols * element size, > 0 */
  uint64_t  capacity;      /* bytes of the allocation */
  int64_t   overflow_rows; /* capacity / row_bytes + 1: any member this long
                              already crosses the end of the allocation */
};

/* Addition that sticks at kOffsetSaturation; associative, so it scans. */
struct SaturatingAdd
{
  __device__ __forceinline__ uint64_t
  operator() (uint64_t a, uint64_t b) const
  {
    uint64_t s = a + b;   /* a, b <= kOffsetSaturation: no overflow */

    return s < kOffsetSaturation ? s : kOffsetSaturation;
  }
};

/* gmlp_num_member_stride() of a group as it counts towards the offsets of
 * later groups. A group longer than the allocation is cut to
 * overflow_rows first: the offsets after it land beyond the capacity either
 * way, and the product can no longer overflow. */
__device__ __forceinline__ uint64_t
member_stride (int64_t rows, const GroupedOperand &op)
{
  if (rows > op.overflow_rows)
    rows = op.overflow_rows;
  return gmlp_num_member_stride (rows, op.row_bytes);
}

/* How many of rows rows starting at offset fit in the allocation. */
__device__ __forceinline__ int64_t
rows_that_fit (int64_t rows, uint64_t offset, const GroupedOperand &op)
{
  uint64_t fit;

  if (rows <= 0 || offset >= op.capacity)
    return 0;
  fit = (op.capacity - offset) / op.row_bytes;
  return (uint64_t) rows < fit ? rows : (int64_t) fit;
}

/* Fills in one operand; false when its allocation bound cannot be
 * represented (see kMaxTensorBytes). */
inline bool
describe_operand (GroupedOperand               *op,
                  const void                   *data,
                  uint32_t                      element_size,
                  const GmlpKernelGroupedShape *shape)
{
  uint64_t row_bytes, padding, capacity;

  if ((uint64_t) shape->cols > kMaxTensorBytes / element_size)
    return false;
  row_bytes = (uint64_t) shape->cols * element_size;

  /* The allocation bound of a grouped tensor: members padded to
   * kGmlpMemberAlignment take up to 255 extra bytes each, unless every
   * row is a multiple of the alignment already. */
  padding = row_bytes % kGmlpMemberAlignment == 0 ?
            0 : (uint64_t) shape->n_groups * (kGmlpMemberAlignment - 1);
  if ((uint64_t) shape->row_capacity > (kMaxTensorBytes - padding) / row_bytes)
    return false;
  capacity = (uint64_t) shape->row_capacity * row_bytes + padding;
  capacity = div_up (capacity, kGmlpMemberAlignment) * kGmlpMemberAlignment;

  op->data = (uint8_t *) data;
  op->row_bytes = row_bytes;
  op->capacity = capacity;
  op->overflow_rows = (int64_t) (capacity / row_bytes + 1);
  return true;
}

}  // namespace gmlp
