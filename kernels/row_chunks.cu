/* row_chunks.cu: chunks of rows whose counts are only on the device
 * (gmlp_kernel_move_rows)
 *
 * The host knows the grid of chunks and the layouts, not how many rows
 * each chunk has, so a single-block kernel plans first: every chunk's kept
 * rows, its place on both sides and the rows it copies and zeroes, with
 * their running total (block scans over the chunks, a round of the block
 * at a time). The copy kernel then strides over that total, a warp per
 * row, and finds each row's chunk by binary search. The places are those
 * of the CPU backend (libgmlp/backend/cpu/gmlp-cpu-row-chunks.c), which is
 * the reference.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "gmlp-kernels.h"
#include "impls/common.cuh"
#include "impls/grouped_operand.cuh"

namespace gmlp {
namespace {

constexpr int kPlanThreads = 1024;
constexpr uint64_t kSaturation = kOffsetSaturation;

struct ChunkEntry
{
  uint64_t src_offset;
  uint64_t dst_offset;
  int64_t  copy_rows;   /* rows [0, copy_rows) are copied */
  int64_t  zero_rows;   /* then zero_rows rows are zeroed */
};

struct Workspace
{
  int64_t    *kept;            /* before the groups and storages cut it */
  int64_t    *position;        /* MEMBERS_BY_B: rows before it in its group */
  uint64_t   *packed_before;   /* PACKED: rows of the chunks before it */
  int64_t    *column;          /* Σ_a kept, per b */
  uint64_t   *src_offsets;     /* MEMBERS*: each group's byte offset */
  uint64_t   *dst_offsets;
  ChunkEntry *entries;
  uint64_t   *row_end;         /* Σ of copy + zero rows up to each chunk */
  uint64_t    bytes;
};

__host__ __device__ inline uint64_t
align16 (uint64_t bytes)
{
  return (bytes + 15) & ~(uint64_t) 15;
}

__host__ __device__ inline Workspace
workspace_layout (const GmlpKernelMoveRows &m,
                  uint8_t                  *base)
{
  const uint64_t n = (uint64_t) m.n_a * m.n_b;
  uint64_t at = 0;
  Workspace w;

#define GMLP_TAKE(field, type, count) \
  w.field = (type *) (base + at); \
  at = align16 (at + (uint64_t) (count) * sizeof (type));
  GMLP_TAKE (kept, int64_t, n);
  GMLP_TAKE (position, int64_t, n);
  GMLP_TAKE (packed_before, uint64_t, n);
  GMLP_TAKE (column, int64_t, m.n_b);
  GMLP_TAKE (src_offsets, uint64_t, m.src.n_members);
  GMLP_TAKE (dst_offsets, uint64_t, m.dst.n_members);
  GMLP_TAKE (entries, ChunkEntry, n);
  GMLP_TAKE (row_end, uint64_t, n);
#undef GMLP_TAKE
  w.bytes = at;
  return w;
}

__device__ __forceinline__ uint64_t
sat_add (uint64_t a, uint64_t b)
{
  uint64_t s = a + b;   /* a, b <= kSaturation */

  return s < kSaturation ? s : kSaturation;
}

__device__ __forceinline__ uint64_t
sat_rows_bytes (uint64_t rows, uint64_t row_bytes)
{
  return rows > kSaturation / row_bytes ? kSaturation : rows * row_bytes;
}

/* Rows of a group, capped where their bytes would pass the saturation
 * point (later offsets land beyond every storage either way). */
__device__ __forceinline__ uint64_t
min_rows (int64_t rows, uint64_t row_bytes)
{
  return (uint64_t) rows > kSaturation / row_bytes ? kSaturation / row_bytes : (uint64_t) rows;
}

__device__ __forceinline__ int64_t
fit (int64_t rows, uint64_t offset, uint64_t capacity, uint64_t row_bytes)
{
  uint64_t room;

  if (rows <= 0 || offset >= capacity)
    return 0;
  room = (capacity - offset) / row_bytes;
  return (uint64_t) rows < room ? rows : (int64_t) room;
}

struct SatAdd
{
  __device__ __forceinline__ uint64_t
  operator() (uint64_t a, uint64_t b) const
  {
    return sat_add (a, b);
  }
};

using PlanScan = cub::BlockScan<uint64_t, kPlanThreads>;
using PlanReduce = cub::BlockReduce<int64_t, kPlanThreads>;

/* Exclusive saturating scan of value (i) over i < n into out, a round of
 * the block at a time. */
template <typename Value>
__device__ void
scan_into (uint32_t                      n,
           Value                         value,
           uint64_t                     *out,
           typename PlanScan::TempStorage &temp)
{
  uint64_t carry = 0;

  for (uint32_t first = 0; first < n; first += kPlanThreads)
    {
      const uint32_t i = first + threadIdx.x;
      uint64_t v = i < n ? value (i) : 0, before, total;

      PlanScan (temp).ExclusiveScan (v, before, 0, SatAdd (), total);
      if (i < n)
        out[i] = sat_add (carry, before);
      carry = sat_add (carry, total);
      __syncthreads ();
    }
}

/* A group's rows as its layout places it. */
__device__ __forceinline__ int64_t
group_rows (const GmlpKernelMoveRows &m,
            const GmlpKernelChunkSide &side,
            bool                        from_kept,
            const Workspace            &w,
            uint32_t                    g)
{
  int64_t rows;

  if (!from_kept)
    rows = side.member_rows[g];
  else if (side.layout == GMLP_KERNEL_CHUNKS_MEMBERS)
    rows = w.kept[g];
  else
    rows = w.column[g];
  return rows > 0 ? rows : 0;
}

struct Place
{
  uint64_t offset;
  int64_t  room;
};

__device__ __forceinline__ Place
place (const GmlpKernelMoveRows  &m,
       const GmlpKernelChunkSide &side,
       bool                       from_kept,
       const uint64_t            *offsets,
       const Workspace           &w,
       uint32_t                   a,
       uint32_t                   b)
{
  const uint64_t c = (uint64_t) a * m.n_b + b;
  Place p = { kSaturation, 0 };

  switch (side.layout)
    {
    case GMLP_KERNEL_CHUNKS_SLOTS:
      p.offset = c * side.slot_stride;
      p.room = side.slot_rows;
      break;
    case GMLP_KERNEL_CHUNKS_PACKED:
      p.offset = sat_rows_bytes (w.packed_before[c], m.row_bytes);
      p.room = INT64_MAX;
      break;
    case GMLP_KERNEL_CHUNKS_MEMBERS:
      p.offset = offsets[c];
      p.room = group_rows (m, side, from_kept, w, (uint32_t) c);
      break;
    default:
      p.offset = sat_add (offsets[b], sat_rows_bytes ((uint64_t) w.position[c], m.row_bytes));
      p.room = group_rows (m, side, from_kept, w, b) - w.position[c];
      if (p.room < 0)
        p.room = 0;
      break;
    }
  return p;
}

__device__ __forceinline__ bool
is_members (int layout)
{
  return layout == GMLP_KERNEL_CHUNKS_MEMBERS || layout == GMLP_KERNEL_CHUNKS_MEMBERS_BY_B;
}

__global__ void __launch_bounds__ (kPlanThreads)
plan_kernel (const __grid_constant__ GmlpKernelMoveRows m,
             uint8_t                                    *workspace)
{
  __shared__ typename PlanScan::TempStorage scan_temp;
  __shared__ typename PlanReduce::TempStorage reduce_temp;
  const Workspace w = workspace_layout (m, workspace);
  const uint32_t n = m.n_a * m.n_b;
  const bool dst_from_kept = m.dst_sizes != nullptr;
  int64_t limit = m.max_chunk_rows >= 0 ? m.max_chunk_rows : INT64_MAX;
  int64_t dropped = 0;

  if (m.src.layout == GMLP_KERNEL_CHUNKS_SLOTS && m.src.slot_rows < limit)
    limit = m.src.slot_rows;
  if (m.dst.layout == GMLP_KERNEL_CHUNKS_SLOTS && m.dst.slot_rows < limit)
    limit = m.dst.slot_rows;

  for (uint32_t c = threadIdx.x; c < n; c += kPlanThreads)
    {
      int64_t k = m.counts[c];

      k = k > 0 ? k : 0;
      w.kept[c] = k < limit ? k : limit;
    }
  __syncthreads ();
  for (uint32_t b = threadIdx.x; b < m.n_b; b += kPlanThreads)
    {
      uint64_t sum = 0;

      for (uint32_t a = 0; a < m.n_a; a++)
        {
          const uint64_t c = (uint64_t) a * m.n_b + b;

          w.position[c] = (int64_t) sum;
          sum = sat_add (sum, (uint64_t) w.kept[c]);
        }
      w.column[b] = (int64_t) sum;
    }
  __syncthreads ();

  scan_into (n, [&] (uint32_t c) { return (uint64_t) w.kept[c]; }, w.packed_before, scan_temp);
  if (is_members (m.src.layout))
    scan_into (m.src.n_members,
               [&] (uint32_t g) {
                 return gmlp_num_member_stride (
                     (int64_t) min_rows (group_rows (m, m.src, false, w, g), m.row_bytes), m.row_bytes);
               },
               w.src_offsets, scan_temp);
  if (is_members (m.dst.layout))
    scan_into (m.dst.n_members,
               [&] (uint32_t g) {
                 return gmlp_num_member_stride (
                     (int64_t) min_rows (group_rows (m, m.dst, dst_from_kept, w, g), m.row_bytes),
                     m.row_bytes);
               },
               w.dst_offsets, scan_temp);
  __syncthreads ();

  /* Every chunk's entry, and the running total of the rows written. */
  {
    uint64_t carry = 0;

    for (uint32_t first = 0; first < n; first += kPlanThreads)
      {
        const uint32_t c = first + threadIdx.x;
        uint64_t rows_written = 0, before, total;

        if (c < n)
          {
            const uint32_t a = c / m.n_b, b = c % m.n_b;
            const Place from = place (m, m.src, false, w.src_offsets, w, a, b);
            const Place to = place (m, m.dst, dst_from_kept, w.dst_offsets, w, a, b);
            int64_t rows = w.kept[c], zero_end = 0, count = m.counts[c];
            ChunkEntry e;

            rows = rows < from.room ? rows : from.room;
            rows = rows < to.room ? rows : to.room;
            rows = fit (rows, from.offset, m.src.capacity, m.row_bytes);
            rows = fit (rows, to.offset, m.dst.capacity, m.row_bytes);
            if (m.zero_rest && is_members (m.dst.layout))
              {
                zero_end = w.kept[c] < to.room ? w.kept[c] : to.room;
                if (m.dst.layout == GMLP_KERNEL_CHUNKS_MEMBERS || a + 1 == m.n_a)
                  zero_end = to.room;
                zero_end = fit (zero_end, to.offset, m.dst.capacity, m.row_bytes);
              }
            e.src_offset = from.offset;
            e.dst_offset = to.offset;
            e.copy_rows = rows;
            e.zero_rows = zero_end > rows ? zero_end - rows : 0;
            w.entries[c] = e;
            rows_written = (uint64_t) (e.copy_rows + e.zero_rows);
            dropped += (count > 0 ? count : 0) - rows;
            if (m.kept != nullptr)
              m.kept[c] = rows;
          }
        PlanScan (scan_temp).InclusiveScan (rows_written, before, SatAdd (), total);
        if (c < n)
          w.row_end[c] = sat_add (carry, before);
        carry = sat_add (carry, total);
        __syncthreads ();
      }
  }

  if (dst_from_kept)
    for (uint32_t g = threadIdx.x; g < m.dst.n_members; g += kPlanThreads)
      m.dst_sizes[g] = group_rows (m, m.dst, true, w, g);
  dropped = PlanReduce (reduce_temp).Sum (dropped);
  if (threadIdx.x == 0 && m.dropped != nullptr)
    *m.dropped += dropped;
}

template <int kVector>
__global__ void __launch_bounds__ (kElementwiseThreads)
copy_kernel (const __grid_constant__ GmlpKernelMoveRows m,
             const uint8_t                             *workspace)
{
  using Pack = typename std::conditional<kVector == 16, uint4,
               typename std::conditional<kVector == 8, uint2,
               typename std::conditional<kVector == 4, uint32_t, uint8_t>::type>::type>::type;
  const Workspace w = workspace_layout (m, (uint8_t *) workspace);
  const uint32_t n = m.n_a * m.n_b;
  const uint64_t total = w.row_end[n - 1];
  const uint64_t packs = m.row_bytes / kVector;
  const uint64_t warps = (uint64_t) gridDim.x * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;

  for (uint64_t r = (uint64_t) blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < total;
       r += warps)
    {
      uint32_t lo = 0, hi = n - 1;
      uint64_t first;
      int64_t j;

      while (lo < hi)
        {
          uint32_t mid = (lo + hi) / 2;

          if (w.row_end[mid] > r)
            hi = mid;
          else
            lo = mid + 1;
        }
      first = lo > 0 ? w.row_end[lo - 1] : 0;
      j = (int64_t) (r - first);
      {
        const ChunkEntry e = w.entries[lo];
        Pack *dst = (Pack *) ((uint8_t *) m.dst.base + e.dst_offset + (uint64_t) j * m.row_bytes);

        if (j < e.copy_rows)
          {
            const Pack *src = (const Pack *) ((const uint8_t *) m.src.base + e.src_offset +
                                              (uint64_t) j * m.row_bytes);

            for (uint64_t p = lane; p < packs; p += 32)
              dst[p] = src[p];
          }
        else
          for (uint64_t p = lane; p < packs; p += 32)
            dst[p] = Pack {};
      }
    }
}

template <int kVector>
bool
fits_vector (const GmlpKernelMoveRows &m)
{
  const auto side_ok = [] (const GmlpKernelChunkSide &s) {
    return is_aligned (s.base, kVector) && s.slot_stride % kVector == 0;
  };

  return m.row_bytes % kVector == 0 && side_ok (m.src) && side_ok (m.dst);
}

}  // namespace
}  // namespace gmlp

size_t
gmlp_kernel_move_rows_workspace_bytes (const GmlpKernelMoveRows *move)
{
  return move == nullptr ? 0 : gmlp::workspace_layout (*move, nullptr).bytes;
}

GmlpKernelStatus
gmlp_kernel_move_rows (const GmlpKernelMoveRows *move,
                       void                     *workspace,
                       cudaStream_t              stream)
{
  using namespace gmlp;
  uint64_t n, bound_rows, blocks;
  int sm_count = 0;
  cudaError_t err;

  if (move == nullptr || move->counts == nullptr || move->row_bytes == 0 || workspace == nullptr)
    return GMLP_KERNEL_INVALID_VALUE;
  n = (uint64_t) move->n_a * move->n_b;
  if (n == 0 || n > 65535 || !is_aligned (workspace, 16))
    return GMLP_KERNEL_INVALID_VALUE;

  plan_kernel<<<1, kPlanThreads, 0, stream>>> (*move, (uint8_t *) workspace);
  if (check_launch () != GMLP_KERNEL_SUCCESS)
    return GMLP_KERNEL_LAUNCH_FAILED;

  /* Rows written are at most what the destination holds. */
  bound_rows = move->dst.capacity / move->row_bytes;
  if (bound_rows == 0)
    return GMLP_KERNEL_SUCCESS;
  err = current_sm_count (&sm_count);
  if (err != cudaSuccess)
    return record_cuda_error (err);
  blocks = div_up (bound_rows, kElementwiseThreads / 32);
  blocks = min_u64 (blocks, (uint64_t) sm_count * kBlocksPerSm);

  if (fits_vector<16> (*move))
    copy_kernel<16><<<(unsigned) blocks, kElementwiseThreads, 0, stream>>> (*move, (const uint8_t *) workspace);
  else if (fits_vector<8> (*move))
    copy_kernel<8><<<(unsigned) blocks, kElementwiseThreads, 0, stream>>> (*move, (const uint8_t *) workspace);
  else if (fits_vector<4> (*move))
    copy_kernel<4><<<(unsigned) blocks, kElementwiseThreads, 0, stream>>> (*move, (const uint8_t *) workspace);
  else
    copy_kernel<1><<<(unsigned) blocks, kElementwiseThreads, 0, stream>>> (*move, (const uint8_t *) workspace);
  return check_launch ();
}
