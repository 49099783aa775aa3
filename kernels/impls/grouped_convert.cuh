/* impls/grouped_convert.cuh: element-wise dtype conversion of a grouped tensor
 *
 * One launch converts every member, and the work is spread evenly over the
 * grid however the rows are split between the groups (MoE routing is often
 * far from even). Group sizes live only in device memory, so every block
 * walks the size list itself, 256 groups at a time: a block-wide scan gives
 * each group's byte offsets in src and dst (the layout of
 * gmlp_num_member_stride()), its rows clamped to both allocations, and the
 * position of its first pack in one virtual list of all groups' packs. The
 * grid then strides over that list, so each thread gets the same share of
 * packs whether one group holds every row or all hold a few.
 *
 * A pack is kVector consecutive elements of one group, moved with one
 * aligned load and store; a group's last pack may be partial.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/common.cuh"
#include "impls/grouped_operand.cuh"

namespace gmlp {


/* Elements per pack in the vectorised kernels: 8 to 64 bytes, and every
 * member start (a multiple of kGmlpMemberAlignment) allows it. */
constexpr int kConvertVector = 8;

/* NOTE: at least 4 resident blocks (1024 threads) per SM caps the kernels
 * at 64 registers; measured, that beats both more occupancy (which
 * spills) and fewer registers' worth of unrolling. */
constexpr int kConvertMinBlocksPerSm = 4;

/* Bytes of packs a thread loads before converting any, to keep enough
 * bytes in flight; at most kMaxUnroll packs. */
constexpr int kUnrollBytes = 32;
constexpr int kMaxUnroll = 8;

/* Groups whose sizes one block scans at a time: one per thread. */
constexpr int kGroupsPerChunk = kElementwiseThreads;


struct GroupedConvertParams
{
  const int64_t  *device_rows;
  uint32_t        n_groups;
  int64_t         cols;
  GroupedOperand  src;
  GroupedOperand  dst;
};


struct Add
{
  __device__ __forceinline__ uint64_t
  operator() (uint64_t a, uint64_t b) const
  {
    return a + b;
  }
};



/* Block-wide scan of kN values per thread under op, whose identity is 0:
 * v[] becomes the inclusive and excl[] the exclusive result, total[] the
 * block's. Every thread of the block must call it. */
template <int kN, typename Op>
__device__ __forceinline__ void
block_scan (uint64_t (&v)[kN],
            uint64_t (&excl)[kN],
            uint64_t (&total)[kN],
            uint64_t (*scratch)[kElementwiseThreads / 32],
            Op        op)
{
  constexpr int kWarps = kElementwiseThreads / 32;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

#pragma unroll
  for (int delta = 1; delta < 32; delta *= 2)
    {
#pragma unroll
      for (int n = 0; n < kN; n++)
        {
          uint64_t other = __shfl_up_sync (0xffffffffu, v[n], delta);
          if (lane >= delta)
            v[n] = op (other, v[n]);
        }
    }
#pragma unroll
  for (int n = 0; n < kN; n++)
    {
      uint64_t previous = __shfl_up_sync (0xffffffffu, v[n], 1);
      excl[n] = lane > 0 ? previous : 0;
      if (lane == 31)
        scratch[n][warp] = v[n];
    }
  __syncthreads ();

#pragma unroll
  for (int n = 0; n < kN; n++)
    {
      uint64_t before = 0;
      uint64_t sum = 0;

#pragma unroll
      for (int w = 0; w < kWarps; w++)
        {
          if (w < warp)
            before = op (before, scratch[n][w]);
          sum = op (sum, scratch[n][w]);
        }
      v[n] = op (before, v[n]);
      excl[n] = op (before, excl[n]);
      total[n] = sum;
    }
  __syncthreads ();   /* scratch may be reused at once */
}

/* Element i of in[] converted into out[i]. Same dtypes copy the bits (NaN
 * payloads included), INT32 widens to INT64 and INT64 saturates to INT32,
 * floating types go through float with gmlp-numeric.h's rounding and
 * saturation. */
template <int kSrc, int kDst>
__device__ __forceinline__ void
convert_element (const StorageType<kSrc> *in,
                 StorageType<kDst>       *out,
                 uint64_t                 i)
{
  static_assert ((is_float_dtype (kSrc) && is_float_dtype (kDst)) ||
                 (is_int_dtype (kSrc) && is_int_dtype (kDst)),
                 "no conversion between floating and integer types");

  if constexpr (kSrc == kDst)
    out[i] = in[i];
  else if constexpr (kSrc == GMLP_NUM_INT64 && kDst == GMLP_NUM_INT32)
    out[i] = gmlp_num_int64_to_int32 (in[i]);
  else if constexpr (is_int_dtype (kSrc))
    out[i] = (StorageType<kDst>) in[i];
  else
    gmlp_num_store_float (out, kDst, i, gmlp_num_load_float (in, kSrc, i));
}

template <int kSrc, int kDst, int kVector>
__global__ void __launch_bounds__ (kElementwiseThreads, kConvertMinBlocksPerSm)
grouped_convert_kernel (const __grid_constant__ GroupedConvertParams params)
{
  using SrcType = StorageType<kSrc>;
  using DstType = StorageType<kDst>;
  using SrcPack = Pack<SrcType, kVector>;
  using DstPack = Pack<DstType, kVector>;
  constexpr int kWarps = kElementwiseThreads / 32;
  constexpr int kUnroll = sizeof (SrcPack) >= kUnrollBytes ? 1 :
                          kUnrollBytes / sizeof (SrcPack) > kMaxUnroll ? kMaxUnroll :
                          kUnrollBytes / (int) sizeof (SrcPack);

  /* The current chunk of groups, as the scans leave it. */
  __shared__ uint64_t chunk_src_offset[kGroupsPerChunk];
  __shared__ uint64_t chunk_dst_offset[kGroupsPerChunk];
  __shared__ uint64_t chunk_elements[kGroupsPerChunk];
  __shared__ uint64_t chunk_pack_end[kGroupsPerChunk];   /* inclusive scan */
  __shared__ uint64_t scratch[2][kWarps];

  const uint64_t threads = (uint64_t) gridDim.x * kElementwiseThreads;
  const uint64_t thread = (uint64_t) blockIdx.x * kElementwiseThreads + threadIdx.x;
  const uint64_t cols = (uint64_t) params.cols;
  uint64_t src_base = 0;    /* offsets of the chunk's first group */
  uint64_t dst_base = 0;
  uint64_t pack_base = 0;   /* packs of all earlier chunks */
  /* This thread's packs are thread, thread + threads, ... in the list of all
   * groups' packs; p runs through them across the chunks. */
  uint64_t p = thread;

  for (uint32_t first_group = 0; first_group < params.n_groups; first_group += kGroupsPerChunk)
    {
      const uint32_t g = first_group + threadIdx.x;
      const int64_t rows = g < params.n_groups ? params.device_rows[g] : 0;
      uint64_t offsets[2] = { member_stride (rows, params.src), member_stride (rows, params.dst) };
      uint64_t offsets_before[2], offset_totals[2];
      uint64_t packs[1], packs_before[1], pack_totals[1];
      uint64_t src_offset, dst_offset, chunk_end;
      uint64_t group_begin = 0, group_end = 0, group_elements = 0;
      const SrcType *src = nullptr;
      DstType *dst = nullptr;
      int64_t fitting;
      int k;

      /* Where group g starts, and how many of its rows may be touched. */
      block_scan<2> (offsets, offsets_before, offset_totals, scratch, SaturatingAdd ());
      src_offset = SaturatingAdd () (src_base, offsets_before[0]);
      dst_offset = SaturatingAdd () (dst_base, offsets_before[1]);
      fitting = rows_that_fit (rows, src_offset, params.src);
      fitting = rows_that_fit (fitting, dst_offset, params.dst);

      /* Where its packs are in the list of all packs. */
      chunk_elements[threadIdx.x] = (uint64_t) fitting * cols;
      packs[0] = div_up ((uint64_t) fitting * cols, kVector);
      block_scan<1> (packs, packs_before, pack_totals, scratch, Add ());
      chunk_src_offset[threadIdx.x] = src_offset;
      chunk_dst_offset[threadIdx.x] = dst_offset;
      chunk_pack_end[threadIdx.x] = pack_base + packs[0];
      __syncthreads ();

      /* The chunk's packs are [pack_base, chunk_end) in that list. */
      chunk_end = pack_base + pack_totals[0];
      k = -1;
      for (; p < chunk_end; p += threads)
        {
          uint64_t i;

          if (p >= group_end)
            {
              /* The group holding pack p: the first whose packs end after
               * p. Threads only move forwards, so search after k. */
              int lo = k + 1, hi = kGroupsPerChunk - 1;

              while (lo < hi)
                {
                  int mid = (lo + hi) / 2;
                  if (chunk_pack_end[mid] <= p)
                    lo = mid + 1;
                  else
                    hi = mid;
                }
              k = lo;
              group_end = chunk_pack_end[k];
              group_elements = chunk_elements[k];
              group_begin = group_end - div_up (group_elements, kVector);
              src = (const SrcType *) (params.src.data + chunk_src_offset[k]);
              dst = (DstType *) (params.dst.data + chunk_dst_offset[k]);
            }

          i = p - group_begin;
          if ((i + (kUnroll - 1) * threads + 1) * kVector <= group_elements)
            {
              /* kUnroll whole packs of this group: all loads first, to keep
               * enough bytes in flight. */
              SrcPack in[kUnroll];

#pragma unroll
              for (int u = 0; u < kUnroll; u++)
                in[u] = ((const SrcPack *) src)[i + u * threads];
#pragma unroll
              for (int u = 0; u < kUnroll; u++)
                {
                  DstPack out;

#pragma unroll
                  for (int e = 0; e < kVector; e++)
                    convert_element<kSrc, kDst> (in[u].v, out.v, e);
                  ((DstPack *) dst)[i + u * threads] = out;
                }
              p += (kUnroll - 1) * threads;
            }
          else if ((i + 1) * kVector <= group_elements)
            {
              const SrcPack in = ((const SrcPack *) src)[i];
              DstPack out;

#pragma unroll
              for (int e = 0; e < kVector; e++)
                convert_element<kSrc, kDst> (in.v, out.v, e);
              ((DstPack *) dst)[i] = out;
            }
          else
            {
              /* The group's partial last pack. */
              for (uint64_t e = i * kVector; e < group_elements; e++)
                convert_element<kSrc, kDst> (src, dst, e);
            }
        }

      src_base = SaturatingAdd () (src_base, offset_totals[0]);
      dst_base = SaturatingAdd () (dst_base, offset_totals[1]);
      pack_base += pack_totals[0];
      /* No barrier needed before the chunk arrays are rewritten: the next
       * round's first scan has every thread pass two. */
    }
}

}  // namespace gmlp
