/* impls/permute.cuh: the kernels of the token permutation (permute.cu)
 *
 * Counting (routing_count_kernel): a histogram of the choices' experts,
 * per block in shared memory where the experts fit, added into the 64-bit
 * counts with integer atomics (exact, so the result does not depend on the
 * order).
 *
 * The map, in four launches and no host sync (gmlp_kernel_routing_map()):
 *
 *  1. routing_map_tiles_kernel<false>: the choices are cut into tiles, one
 *     warp per tile; the warp ranks its choices 32 at a time within the
 *     tile (__match_any_sync finds the lanes of one expert, a per-warp
 *     counter per expert carries the rank from round to round) and writes
 *     the tile's count of every expert: a tiles × experts matrix.
 *  2. routing_map_scan_kernel: each expert's column of the matrix becomes
 *     its exclusive prefix over the tiles (the rank of the tile's first
 *     choice of that expert), and the column's total the expert's count.
 *  3. routing_map_sizes_kernel (one block): kept = min (count, capacity),
 *     the padded sizes, and each expert's first slot (a scan).
 *  4. routing_map_tiles_kernel<true>: the same ranking again; a choice's
 *     rank in its expert is its tile's prefix plus its rank in the tile, so
 *     its slot is the expert's first slot plus that rank when the rank is
 *     below kept (the earliest choices are kept), else -1.
 *
 * Ranks follow the order of the choices (token by token, a token's choices
 * in order) whatever the scheduling: the map is stable and the same on
 * every run, and equal to the CPU's one pass. choice_of is set to -1 first
 * (by pass 1, which strides over it too, or a memset when there are no
 * choices and so no pass 1), so padding rows and slots past the last read
 * -1.
 *
 * The rows (gmlp_kernel_permute()): permute_groups_kernel (one block)
 * walks the sizes the map wrote into a table of each expert's first slot,
 * member offsets and rows that fit, in one or two operands (the layout of
 * gmlp_num_member_stride() for each operand's element size, clamped to
 * the allocation as everywhere, impls/grouped_operand.cuh); then one
 * kernel moves the rows, a warp per output row, with 16-byte packs where
 * the rows allow:
 *
 *  - permute_to_slots_kernel (FORWARD, COMBINE_BACKWARD): every row of
 *    every member of the output, found from the list of all members' rows
 *    by a binary search; a padding row is zeros. COMBINE_BACKWARD also
 *    reduces the dot product for grad_probs over the warp, in a fixed
 *    order.
 *  - permute_to_tokens_kernel (COMBINE, BACKWARD): every token; the lanes
 *    below k find the member row of each choice (a binary search over the
 *    first slots, as the CPU's layout_find()), the choices that go
 *    nowhere are left out, and the rows are summed in the order of the
 *    choices; BACKWARD then adds its FP32 addend, if given, before the
 *    one rounding (the MoE layer's router gradient).
 *
 * Every output row or value has one writer and no atomics are used. Sums
 * over a token's choices and the products with the probabilities round
 * each operation (__fmul_rn, __fadd_rn: nothing contracted into an FMA),
 * as the CPU backend, built with -ffp-contract=off, does: COMBINE,
 * BACKWARD and the rows of COMBINE_BACKWARD give the CPU's bits. Only the
 * dot products of grad_probs are summed in another (fixed) order.
 *
 * Counts, slots, choices, offsets and the loops over them are 64-bit.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/common.cuh"
#include "impls/grouped_convert.cuh"   /* block_scan, Add */
#include "impls/grouped_operand.cuh"

namespace gmlp {

/* The most choices per token (GMLP_BACKEND_MAX_TOP_K). */
constexpr uint32_t kPermuteMaxTopK = 16;
/* An index outside [0, n_experts). */
constexpr uint32_t kNoExpert = 0xffffffffu;

/* Counting: threads per block, experts whose counts a block keeps in
 * shared memory (32 KB), choices per block between two flushes (so that
 * its 32-bit counts cannot overflow). */
constexpr int kCountThreads = 256;
constexpr uint32_t kCountSharedExperts = 8192;
constexpr uint64_t kCountChunk = 8192;

/* The map: warps per block (each owns a tile), the least rounds of 32
 * choices per tile, and the experts whose per-warp counters fit in 48 KB
 * of shared memory; beyond, the counters are in global memory. */
constexpr int kMapWarps = 4;
constexpr int kMapThreads = kMapWarps * 32;
constexpr uint32_t kMapMinRounds = 32;
constexpr uint32_t kMapSharedExperts = 48 * 1024 / (kMapWarps * sizeof (uint32_t));
/* The column scan: experts per block × segments of tiles. */
constexpr int kScanExperts = 32;
constexpr int kScanSegments = 16;

/* The rows: warps per block, one row (or token) per warp at a time;
 * elements per pack of the vectorised kernels (16 bytes of a 16-bit
 * dtype, two 16-byte accesses of FP32). */
constexpr int kPermuteThreads = 256;
constexpr int kPermuteWarps = kPermuteThreads / 32;
constexpr int kPermuteVector = 8;

__device__ __forceinline__ uint32_t
expert_of (int64_t index, uint32_t n_experts)
{
  return index >= 0 && index < (int64_t) n_experts ? (uint32_t) index : kNoExpert;
}

/* ---- routing_count ---------------------------------------------------- */

struct RoutingCountParams
{
  const int64_t      *indices;
  uint64_t            n_choices;
  uint32_t            n_experts;
  unsigned long long *counts;     /* zeroed before the launch */
};

/* kShared: n_experts <= kCountSharedExperts counts in dynamic shared
 * memory. Blocks stride over chunks of kCountChunk choices. */
template <bool kShared>
__global__ void __launch_bounds__ (kCountThreads)
routing_count_kernel (const __grid_constant__ RoutingCountParams params)
{
  extern __shared__ uint32_t bins[];
  const uint64_t n_chunks = div_up (params.n_choices, kCountChunk);

  if (kShared)
    {
      for (uint32_t e = threadIdx.x; e < params.n_experts; e += kCountThreads)
        bins[e] = 0;
      __syncthreads ();
    }

  for (uint64_t chunk = blockIdx.x; chunk < n_chunks; chunk += gridDim.x)
    {
      const uint64_t first = chunk * kCountChunk;
      const uint64_t end = first + kCountChunk < params.n_choices ? first + kCountChunk
                                                                   : params.n_choices;

      for (uint64_t c = first + threadIdx.x; c < end; c += kCountThreads)
        {
          const uint32_t e = expert_of (params.indices[c], params.n_experts);

          if (e == kNoExpert)
            continue;
          if (kShared)
            atomicAdd (&bins[e], 1u);
          else
            atomicAdd (&params.counts[e], 1ull);
        }

      if (kShared)
        {
          __syncthreads ();
          for (uint32_t e = threadIdx.x; e < params.n_experts; e += kCountThreads)
            if (bins[e] != 0)
              {
                atomicAdd (&params.counts[e], (unsigned long long) bins[e]);
                bins[e] = 0;
              }
          __syncthreads ();   /* the next chunk counts into zeroed bins */
        }
    }
}

/* ---- routing_map ------------------------------------------------------ */

struct RoutingMapParams
{
  const int64_t *indices;
  uint64_t       n_choices;
  uint32_t       n_experts;
  uint32_t       tile_rounds;      /* a tile is 32 × tile_rounds choices */
  uint64_t       n_tiles;
  /* n_tiles × n_experts: pass 1 writes each tile's counts, the scan turns
   * every column into its exclusive prefix. */
  uint64_t      *tile_counts;
  /* n_tiles × n_experts in-tile counters, or NULL: in shared memory. */
  uint32_t      *global_counters;
  uint64_t      *expert_total;     /* n_experts: choices of each expert */
  uint64_t      *expert_start;     /* n_experts: its first slot (saturating) */
  uint64_t      *expert_kept;      /* n_experts: the choices it keeps */
  uint64_t       padding;          /* 1 .. kOffsetSaturation */
  int64_t        expert_capacity;  /* -1: dropless */
  uint64_t       row_capacity;
  int64_t       *sizes;
  int64_t       *row_of;
  int64_t       *choice_of;
};

/* Pass 1 (kScatter false): each tile's count of every expert into
 * tile_counts, and -1 into every slot of choice_of (which only pass 4
 * writes otherwise: one launch less than a memset). Pass 4 (kScatter
 * true): row_of of every choice and choice_of of every kept one. Each warp
 * owns a tile at a time; the blocks stride over the tiles. */
template <bool kScatter>
__global__ void __launch_bounds__ (kMapThreads)
routing_map_tiles_kernel (const __grid_constant__ RoutingMapParams params)
{
  extern __shared__ uint32_t shared_counters[];
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warp = threadIdx.x / 32;
  const uint32_t lanes_below = (1u << lane) - 1;
  const uint32_t n_experts = params.n_experts;
  const uint64_t tile_choices = 32ull * params.tile_rounds;

  if (!kScatter)
    for (uint64_t s = (uint64_t) blockIdx.x * kMapThreads + threadIdx.x; s < params.row_capacity;
         s += (uint64_t) gridDim.x * kMapThreads)
      params.choice_of[s] = -1;

  for (uint64_t tile = (uint64_t) blockIdx.x * kMapWarps + warp; tile < params.n_tiles;
       tile += (uint64_t) gridDim.x * kMapWarps)
    {
      uint32_t *const counters = params.global_counters != nullptr ?
                                 params.global_counters + tile * n_experts :
                                 shared_counters + warp * n_experts;
      const uint64_t first = tile * tile_choices;

      for (uint32_t e = lane; e < n_experts; e += 32)
        counters[e] = 0;
      __syncwarp ();

      for (uint32_t round = 0; round < params.tile_rounds; round++)
        {
          const uint64_t round_first = first + (uint64_t) round * 32;
          const uint64_t c = round_first + lane;
          uint32_t e, peers, base = 0;

          if (round_first >= params.n_choices)   /* uniform over the warp */
            break;
          e = c < params.n_choices ? expert_of (params.indices[c], n_experts) : kNoExpert;
          /* The lanes of one expert; those that go nowhere are one group,
           * which counts nowhere. */
          peers = __match_any_sync (0xffffffffu, e);
          if (e != kNoExpert)
            base = counters[e];
          __syncwarp ();   /* every lane has read before the leader writes */
          if (e != kNoExpert && lane == (uint32_t) (__ffs (peers) - 1))
            counters[e] = base + __popc (peers);
          __syncwarp ();

          if (kScatter && c < params.n_choices)
            {
              int64_t slot = -1;

              if (e != kNoExpert)
                {
                  const uint64_t rank = params.tile_counts[tile * n_experts + e] + base +
                                        __popc (peers & lanes_below);

                  /* rank < kept <= 2^62 and start <= 2^62: no overflow.
                   * A slot past the capacity (which the host's bound
                   * excludes) is dropped rather than written. */
                  if (rank < params.expert_kept[e])
                    {
                      const uint64_t s = params.expert_start[e] + rank;

                      if (s < params.row_capacity)
                        {
                          slot = (int64_t) s;
                          params.choice_of[s] = (int64_t) c;
                        }
                    }
                }
              params.row_of[c] = slot;
            }
        }

      if (!kScatter)
        for (uint32_t e = lane; e < n_experts; e += 32)
          params.tile_counts[tile * n_experts + e] = counters[e];
      __syncwarp ();   /* the counters are zeroed again for the next tile */
    }
}

/* Pass 2: blockDim (kScanExperts, kScanSegments); blockIdx.x × 32 +
 * threadIdx.x is the expert, threadIdx.y a segment of the tiles. */
__global__ void __launch_bounds__ (kScanExperts * kScanSegments)
routing_map_scan_kernel (const __grid_constant__ RoutingMapParams params)
{
  __shared__ uint64_t segment_sums[kScanSegments][kScanExperts];
  const uint64_t e = (uint64_t) blockIdx.x * kScanExperts + threadIdx.x;
  const uint64_t per_segment = div_up (params.n_tiles, kScanSegments);
  const uint64_t begin = threadIdx.y * per_segment < params.n_tiles ?
                         threadIdx.y * per_segment : params.n_tiles;
  const uint64_t end = begin + per_segment < params.n_tiles ? begin + per_segment : params.n_tiles;
  const bool active = e < params.n_experts;
  uint64_t sum = 0, before = 0, total = 0;

  if (active)
    for (uint64_t tile = begin; tile < end; tile++)
      sum += params.tile_counts[tile * params.n_experts + e];
  segment_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads ();

  for (int s = 0; s < kScanSegments; s++)
    {
      if (s < (int) threadIdx.y)
        before += segment_sums[s][threadIdx.x];
      total += segment_sums[s][threadIdx.x];
    }
  if (!active)
    return;
  for (uint64_t tile = begin; tile < end; tile++)
    {
      uint64_t *const entry = &params.tile_counts[tile * params.n_experts + e];
      const uint64_t count = *entry;

      *entry = before;
      before += count;
    }
  if (threadIdx.y == 0)
    params.expert_total[e] = total;
}

/* Pass 3, one block of kElementwiseThreads: the sizes, the choices each
 * expert keeps and its first slot, 256 experts at a time. */
__global__ void __launch_bounds__ (kElementwiseThreads)
routing_map_sizes_kernel (const __grid_constant__ RoutingMapParams params)
{
  __shared__ uint64_t scratch[1][kElementwiseThreads / 32];
  uint64_t base = 0;

  for (uint32_t first = 0; first < params.n_experts; first += kElementwiseThreads)
    {
      const uint32_t e = first + threadIdx.x;
      uint64_t kept = 0, padded = 0;
      uint64_t v[1], before[1], total[1];

      if (e < params.n_experts)
        {
          const uint64_t count = params.expert_total[e];

          kept = params.expert_capacity < 0 || count < (uint64_t) params.expert_capacity ?
                 count : (uint64_t) params.expert_capacity;
          /* kept <= n_choices <= 2^62 and padding <= 2^62: no overflow. */
          padded = div_up (kept, params.padding) * params.padding;
        }
      v[0] = padded < kOffsetSaturation ? padded : kOffsetSaturation;
      block_scan<1> (v, before, total, scratch, SaturatingAdd ());
      if (e < params.n_experts)
        {
          params.sizes[e] = (int64_t) padded;
          params.expert_start[e] = SaturatingAdd () (base, before[0]);
          params.expert_kept[e] = kept;
        }
      base = SaturatingAdd () (base, total[0]);
    }
}

/* ---- permute: the group table ----------------------------------------- */

/* One expert's member in the operands of a permute call. */
struct PermuteGroup
{
  uint64_t start;       /* its first slot: Σ of the earlier sizes, saturating */
  uint64_t offset[2];   /* bytes from the start of each operand */
  int64_t  fit[2];      /* its rows that fit in each operand */
  uint64_t row_end;     /* Σ fit[0] of it and the earlier groups */
};

struct PermuteGroupsParams
{
  const int64_t  *device_rows;
  uint32_t        n_groups;
  GroupedOperand  operands[2];   /* may be the same operand twice */
  PermuteGroup   *groups;        /* out: n_groups entries */
  uint64_t       *total_rows;    /* out: Σ fit[0] */
};

/* One block of kElementwiseThreads, 256 groups at a time. */
__global__ void __launch_bounds__ (kElementwiseThreads)
permute_groups_kernel (const __grid_constant__ PermuteGroupsParams params)
{
  __shared__ uint64_t scratch[3][kElementwiseThreads / 32];
  uint64_t base[3] = { 0, 0, 0 };   /* offsets and slot of the chunk's first group */
  uint64_t row_base = 0;

  for (uint32_t first = 0; first < params.n_groups; first += kElementwiseThreads)
    {
      const uint32_t g = first + threadIdx.x;
      const int64_t rows = g < params.n_groups ? params.device_rows[g] : 0;
      uint64_t v[3], before[3], totals[3];
      uint64_t fits[1], fits_before[1], fit_totals[1];
      uint64_t offset[2], start;
      int64_t fit[2];

      v[0] = member_stride (rows, params.operands[0]);
      v[1] = member_stride (rows, params.operands[1]);
      /* A negative size counts as 0; a huge one sticks at the saturation,
       * as the CPU's layout does. */
      v[2] = rows <= 0 ? 0 : (uint64_t) rows < kOffsetSaturation ? (uint64_t) rows : kOffsetSaturation;
      block_scan<3> (v, before, totals, scratch, SaturatingAdd ());
      offset[0] = SaturatingAdd () (base[0], before[0]);
      offset[1] = SaturatingAdd () (base[1], before[1]);
      start = SaturatingAdd () (base[2], before[2]);
      fit[0] = rows_that_fit (rows, offset[0], params.operands[0]);
      fit[1] = rows_that_fit (rows, offset[1], params.operands[1]);

      /* Σ fit[0] <= the rows the allocation holds: no overflow. */
      fits[0] = g < params.n_groups ? (uint64_t) fit[0] : 0;
      block_scan<1> (fits, fits_before, fit_totals, scratch, Add ());

      if (g < params.n_groups)
        {
          PermuteGroup out;

          out.start = start;
          out.offset[0] = offset[0];
          out.offset[1] = offset[1];
          out.fit[0] = fit[0];
          out.fit[1] = fit[1];
          out.row_end = row_base + fits[0];
          params.groups[g] = out;
        }
      for (int i = 0; i < 3; i++)
        base[i] = SaturatingAdd () (base[i], totals[i]);
      row_base += fit_totals[0];
    }

  if (threadIdx.x == 0)
    *params.total_rows = row_base;
}

/* ---- permute: the rows ------------------------------------------------ */

/* FP32 operands are float, 16-bit ones uint16_t, FP16 or BF16 by their
 * dtype at run time (a uniform branch around the conversion only, so
 * that the loads stay free of it). */
__device__ __forceinline__ float
decode (float v, int)
{
  return v;
}

__device__ __forceinline__ float
decode (uint16_t v, int dtype)
{
  return dtype == GMLP_NUM_BFLOAT16 ? to_float<GMLP_NUM_BFLOAT16> (v) : to_float<GMLP_NUM_FLOAT16> (v);
}

template <typename T>
__device__ __forceinline__ T encode (float f, int dtype);

template <>
__device__ __forceinline__ float
encode<float> (float f, int)
{
  return f;
}

template <>
__device__ __forceinline__ uint16_t
encode<uint16_t> (float f, int dtype)
{
  return dtype == GMLP_NUM_BFLOAT16 ? from_float<GMLP_NUM_BFLOAT16> (f) : from_float<GMLP_NUM_FLOAT16> (f);
}

struct PermuteParams
{
  const PermuteGroup *groups;
  const uint64_t     *total_rows;
  uint32_t            n_groups;
  uint64_t            n_tokens;
  uint32_t            top_k;
  uint64_t            n_choices;
  uint64_t            n_packs;          /* packs per row: cols / kVec */
  uint64_t            row_capacity;
  const int64_t      *row_of;
  const int64_t      *choice_of;
  const float        *probs;
  const uint8_t      *tokens;
  int                 tokens_dtype;
  uint64_t            tokens_row_bytes;
  const uint8_t      *permuted;
  int                 permuted_dtype;
  uint64_t            permuted_row_bytes;
  uint8_t            *out;
  int                 out_dtype;
  uint64_t            out_row_bytes;
  float              *grad_probs;       /* COMBINE_BACKWARD, or NULL */
  const float        *addend;           /* BACKWARD, or NULL: T × cols FP32 */
};

/* c / top_k: a 32-bit division where c allows (a 64-bit one is a long
 * subroutine). */
__device__ __forceinline__ uint64_t
token_of (int64_t c, uint32_t top_k)
{
  if ((uint64_t) c <= 0xffffffffu)
    return (uint32_t) c / top_k;
  return (uint64_t) c / top_k;
}

/* The member row of slot s in operand which (0 or 1) of the table, as the
 * CPU's layout_find(): the last group whose first slot is at or before s
 * (of groups that start at one slot the empty ones come first), and the
 * row only if it fits. */
__device__ __forceinline__ bool
find_slot (const PermuteGroup *groups,
           uint32_t            n_groups,
           int64_t             s,
           int                 which,
           uint64_t            row_bytes,
           uint64_t           *offset)
{
  uint32_t lo = 0, hi = n_groups;
  uint64_t r;

  if (s < 0)
    return false;
  while (hi - lo > 1)
    {
      const uint32_t mid = lo + (hi - lo) / 2;

      if (groups[mid].start <= (uint64_t) s)
        lo = mid;
      else
        hi = mid;
    }
  if ((uint64_t) s < groups[lo].start)
    return false;
  r = (uint64_t) s - groups[lo].start;
  if (r >= (uint64_t) groups[lo].fit[which])
    return false;
  *offset = groups[lo].offset[which] + r * row_bytes;
  return true;
}

/* COMBINE (kWeighted) and BACKWARD: a warp per token, the blocks striding
 * over the tokens. */
template <int kVec, typename TIn, typename TOut, bool kWeighted>
__global__ void __launch_bounds__ (kPermuteThreads)
permute_to_tokens_kernel (const __grid_constant__ PermuteParams params)
{
  using InPack = Pack<TIn, kVec>;
  using OutPack = Pack<TOut, kVec>;

  /* The rows of the warp's token that count, in the order of its
   * choices, and their weights. */
  __shared__ const uint8_t *sources[kPermuteWarps][kPermuteMaxTopK];
  __shared__ float weights[kPermuteWarps][kPermuteMaxTopK];

  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warp = threadIdx.x / 32;
  const uint32_t lanes_below = (1u << lane) - 1;

  for (uint64_t t = (uint64_t) blockIdx.x * kPermuteWarps + warp; t < params.n_tokens;
       t += (uint64_t) gridDim.x * kPermuteWarps)
    {
      const uint8_t *source = nullptr;
      uint32_t found, n_sources;
      uint64_t offset;

      if (lane < params.top_k)
        {
          const uint64_t c = t * params.top_k + lane;

          if (find_slot (params.groups, params.n_groups, params.row_of[c], 0,
                         params.permuted_row_bytes, &offset))
            source = params.permuted + offset;
        }
      found = __ballot_sync (0xffffffffu, source != nullptr);
      n_sources = __popc (found);
      if (source != nullptr)
        {
          const uint32_t j = __popc (found & lanes_below);

          sources[warp][j] = source;
          weights[warp][j] = kWeighted ? params.probs[t * params.top_k + lane] : 1.0f;
        }
      __syncwarp ();

      TOut *const out = reinterpret_cast<TOut *> (params.out + t * params.out_row_bytes);

      for (uint64_t p = lane; p < params.n_packs; p += 32)
        {
          float acc[kVec];

#pragma unroll
          for (int i = 0; i < kVec; i++)
            acc[i] = 0.0f;
#pragma unroll 4
          for (uint32_t j = 0; j < n_sources; j++)
            {
              const InPack v = reinterpret_cast<const InPack *> (sources[warp][j])[p];
              const float w = weights[warp][j];

#pragma unroll
              for (int i = 0; i < kVec; i++)
                acc[i] = __fadd_rn (acc[i], __fmul_rn (w, decode (v.v[i], params.permuted_dtype)));
            }

          if (!kWeighted && params.addend != nullptr)
            {
              const Pack<float, kVec> a =
                reinterpret_cast<const Pack<float, kVec> *> (params.addend + t * params.n_packs * kVec)[p];

#pragma unroll
              for (int i = 0; i < kVec; i++)
                acc[i] = __fadd_rn (acc[i], a.v[i]);
            }

          OutPack o;

#pragma unroll
          for (int i = 0; i < kVec; i++)
            o.v[i] = encode<TOut> (acc[i], params.out_dtype);
          reinterpret_cast<OutPack *> (out)[p] = o;
        }
      __syncwarp ();   /* sources is rewritten for the next token */
    }
}

/* FORWARD and COMBINE_BACKWARD (kCombine): a warp per row of the output,
 * the blocks striding over the list of all members' rows (*total_rows,
 * from the table). */
template <int kVec, typename TTok, typename TPerm, typename TOut, bool kCombine>
__global__ void __launch_bounds__ (kPermuteThreads)
permute_to_slots_kernel (const __grid_constant__ PermuteParams params)
{
  using TokPack = Pack<TTok, kVec>;
  using PermPack = Pack<TPerm, kVec>;
  using OutPack = Pack<TOut, kVec>;

  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warp = threadIdx.x / 32;
  const uint64_t total = *params.total_rows;

  for (uint64_t q = (uint64_t) blockIdx.x * kPermuteWarps + warp; q < total;
       q += (uint64_t) gridDim.x * kPermuteWarps)
    {
      /* The group of row q: the first whose rows end after it (groups
       * without rows end where the one before them does). */
      uint32_t lo = 0, hi = params.n_groups - 1;

      while (lo < hi)
        {
          const uint32_t mid = lo + (hi - lo) / 2;

          if (params.groups[mid].row_end <= q)
            lo = mid + 1;
          else
            hi = mid;
        }

      const PermuteGroup group = params.groups[lo];
      const uint64_t r = q - (group.row_end - (uint64_t) group.fit[0]);
      const uint64_t s = group.start + r;
      const int64_t c = s < params.row_capacity ? params.choice_of[s] : -1;
      OutPack *const out = reinterpret_cast<OutPack *> (params.out + group.offset[0] +
                                                        r * params.out_row_bytes);

      if (c < 0 || (uint64_t) c >= params.n_choices)   /* uniform over the warp */
        {
          const OutPack zero = {};   /* +0 in every dtype */

          for (uint64_t p = lane; p < params.n_packs; p += 32)
            out[p] = zero;
          continue;
        }

      const TokPack *const tokens = reinterpret_cast<const TokPack *> (
          params.tokens + token_of (c, params.top_k) * params.tokens_row_bytes);
      const PermPack *y = nullptr;
      float scale = 1.0f, dot = 0.0f;

      if (kCombine)
        {
          scale = params.probs[c];
          if (r < (uint64_t) group.fit[1])
            y = reinterpret_cast<const PermPack *> (params.permuted + group.offset[1] +
                                                    r * params.permuted_row_bytes);
        }

      for (uint64_t p = lane; p < params.n_packs; p += 32)
        {
          const TokPack v = tokens[p];
          OutPack o;

#pragma unroll
          for (int i = 0; i < kVec; i++)
            {
              const float x = decode (v.v[i], params.tokens_dtype);

              o.v[i] = encode<TOut> (kCombine ? __fmul_rn (scale, x) : x, params.out_dtype);
            }
          out[p] = o;
          if (kCombine && y != nullptr)
            {
              const PermPack w = y[p];

#pragma unroll
              for (int i = 0; i < kVec; i++)
                dot = __fadd_rn (dot, __fmul_rn (decode (v.v[i], params.tokens_dtype),
                                                 decode (w.v[i], params.permuted_dtype)));
            }
        }

      if (kCombine && params.grad_probs != nullptr)
        {
          /* A fixed butterfly: the same bits on every run. */
#pragma unroll
          for (int delta = 16; delta > 0; delta /= 2)
            dot = __fadd_rn (dot, __shfl_xor_sync (0xffffffffu, dot, delta));
          if (lane == 0)
            params.grad_probs[c] = dot;
        }
    }
}

}  // namespace gmlp
