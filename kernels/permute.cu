/* permute.cu: the token permutation's entry points (gmlp_kernel_routing_count,
 * gmlp_kernel_routing_map, gmlp_kernel_permute) and their workspaces
 *
 * The host checks what it can without the routing (sizes, pointers,
 * alignment) and sizes the grids from bounds it knows; every count, size
 * and offset that depends on the indices is made and read on the device
 * (impls/permute.cuh), so no call waits for the device or allocates, and
 * each can be captured in a graph.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "gmlp-kernels.h"
#include "impls/common.cuh"
#include "impls/permute.cuh"

namespace gmlp {
namespace {

constexpr uint64_t kMaxGridX = 0x7fffffffu;
/* The most experts of a map: GmlpRouting's limit, which also bounds a
 * tile (32 × div_up (65535, 32) choices) well within its 32-bit counters. */
constexpr uint32_t kMaxExperts = 65535;
/* T × k, as the CPU backend bounds it. */
constexpr uint64_t kMaxChoices = kOffsetSaturation;

constexpr uint64_t
align_up (uint64_t bytes)
{
  return div_up (bytes, kGmlpMemberAlignment) * kGmlpMemberAlignment;
}

bool
is_float (int dtype)
{
  return dtype == GMLP_NUM_FLOAT32 || dtype == GMLP_NUM_FLOAT16 || dtype == GMLP_NUM_BFLOAT16;
}

/* ---- the map's workspace ---------------------------------------------- */

struct MapLayout
{
  uint32_t tile_rounds;
  uint64_t n_tiles;
  bool     shared_counters;
  uint64_t tile_counts;       /* byte offsets in the workspace */
  uint64_t global_counters;
  uint64_t expert_total;
  uint64_t expert_start;
  uint64_t expert_kept;
  uint64_t bytes;             /* 0: too large */
};

/* A tile has at least as many choices as there are experts, so the matrix
 * of counts (tiles × experts) is at most about one entry per choice. */
MapLayout
map_layout (uint64_t n_choices,
            uint32_t n_experts)
{
  MapLayout l = {};
  uint64_t entries;

  if (n_experts == 0 || n_experts > kMaxExperts || n_choices > kMaxChoices)
    return l;
  l.tile_rounds = (uint32_t) div_up (n_experts, 32);
  if (l.tile_rounds < kMapMinRounds)
    l.tile_rounds = kMapMinRounds;
  l.n_tiles = div_up (n_choices, 32ull * l.tile_rounds);
  l.shared_counters = n_experts <= kMapSharedExperts;
  entries = l.n_tiles * n_experts;   /* <= n_choices + n_experts */
  if (entries > kMaxTensorBytes / sizeof (uint64_t))
    return l;

  l.tile_counts = 0;
  l.global_counters = l.tile_counts + align_up (entries * sizeof (uint64_t));
  l.expert_total = l.global_counters +
                   (l.shared_counters ? 0 : align_up (entries * sizeof (uint32_t)));
  l.expert_start = l.expert_total + align_up ((uint64_t) n_experts * sizeof (uint64_t));
  l.expert_kept = l.expert_start + align_up ((uint64_t) n_experts * sizeof (uint64_t));
  l.bytes = l.expert_kept + align_up ((uint64_t) n_experts * sizeof (uint64_t));
  return l;
}

bool
map_choices (const GmlpKernelRoutingMap *map,
             uint64_t                   *n_choices)
{
  if (map->n_tokens < 0 || map->top_k < 1 || map->top_k > kPermuteMaxTopK ||
      (uint64_t) map->n_tokens > kMaxChoices / kPermuteMaxTopK)
    return false;
  *n_choices = (uint64_t) map->n_tokens * map->top_k;
  return true;
}

/* ---- the permute's workspace and kernels ------------------------------ */

uint64_t
permute_total_offset (uint32_t n_groups)
{
  return align_up ((uint64_t) n_groups * sizeof (PermuteGroup));
}

using PermuteKernel = void (*) (const PermuteParams);

/* f (T ()) for the storage type T of an element of size bytes. */
template <typename F>
PermuteKernel
with_storage (uint32_t size, F f)
{
  if (size == sizeof (float))
    return f (float ());
  return f (uint16_t ());
}

template <int kVec>
PermuteKernel
select_to_tokens (uint32_t in_size, uint32_t out_size, bool weighted)
{
  return with_storage (in_size, [&] (auto in) {
    return with_storage (out_size, [&] (auto out) {
      using TIn = decltype (in);
      using TOut = decltype (out);

      return weighted ? (PermuteKernel) permute_to_tokens_kernel<kVec, TIn, TOut, true>
                      : (PermuteKernel) permute_to_tokens_kernel<kVec, TIn, TOut, false>;
    });
  });
}

/* FORWARD reads no permuted operand: its instances take TPerm = TTok. */
template <int kVec>
PermuteKernel
select_to_slots (uint32_t tok_size, uint32_t perm_size, uint32_t out_size, bool combine)
{
  return with_storage (tok_size, [&] (auto tok) {
    return with_storage (combine ? perm_size : tok_size, [&] (auto perm) {
      return with_storage (out_size, [&] (auto out) {
        using TTok = decltype (tok);
        using TPerm = decltype (perm);
        using TOut = decltype (out);

        return combine ? (PermuteKernel) permute_to_slots_kernel<kVec, TTok, TPerm, TOut, true>
                       : (PermuteKernel) permute_to_slots_kernel<kVec, TTok, TTok, TOut, false>;
      });
    });
  });
}

}  // namespace
}  // namespace gmlp

extern "C" GmlpKernelStatus
gmlp_kernel_routing_count (const int64_t *indices,
                           int64_t        n_choices,
                           uint32_t       n_experts,
                           int64_t       *counts,
                           cudaStream_t   stream)
{
  using namespace gmlp;
  RoutingCountParams params;
  int sm_count = 0;
  uint64_t blocks;
  size_t shared_bytes;
  cudaError_t err;

  if (n_choices < 0 || (uint64_t) n_choices > kMaxChoices || (n_choices > 0 && indices == nullptr) ||
      (n_experts > 0 && counts == nullptr) || !is_aligned (indices, sizeof (int64_t)) ||
      !is_aligned (counts, sizeof (int64_t)))
    return GMLP_KERNEL_INVALID_VALUE;
  if (n_experts == 0)
    return GMLP_KERNEL_SUCCESS;

  err = cudaMemsetAsync (counts, 0, (size_t) n_experts * sizeof (int64_t), stream);
  if (err != cudaSuccess)
    return record_cuda_error (err);
  if (n_choices == 0)
    return GMLP_KERNEL_SUCCESS;

  err = current_sm_count (&sm_count);
  if (err != cudaSuccess)
    return record_cuda_error (err);
  params.indices = indices;
  params.n_choices = (uint64_t) n_choices;
  params.n_experts = n_experts;
  params.counts = reinterpret_cast<unsigned long long *> (counts);
  blocks = min_u64 (div_up (params.n_choices, kCountChunk), (uint64_t) sm_count * kBlocksPerSm);
  if (n_experts <= kCountSharedExperts)
    {
      shared_bytes = (size_t) n_experts * sizeof (uint32_t);
      routing_count_kernel<true><<<(unsigned) blocks, kCountThreads, shared_bytes, stream>>> (params);
    }
  else
    routing_count_kernel<false><<<(unsigned) blocks, kCountThreads, 0, stream>>> (params);
  return check_launch ();
}

extern "C" size_t
gmlp_kernel_routing_map_workspace_bytes (const GmlpKernelRoutingMap *map)
{
  uint64_t n_choices;

  if (map == nullptr || !gmlp::map_choices (map, &n_choices))
    return 0;
  return (size_t) gmlp::map_layout (n_choices, map->n_experts).bytes;
}

extern "C" GmlpKernelStatus
gmlp_kernel_routing_map (const GmlpKernelRoutingMap *map,
                         void                       *workspace,
                         cudaStream_t                stream)
{
  using namespace gmlp;
  uint8_t *ws = static_cast<uint8_t *> (workspace);
  RoutingMapParams params;
  MapLayout layout;
  uint64_t n_choices, blocks;
  size_t shared_bytes;
  GmlpKernelStatus status;
  cudaError_t err;

  if (map == nullptr || !map_choices (map, &n_choices) || map->n_experts == 0 ||
      map->padding < 1 || (uint64_t) map->padding > kOffsetSaturation ||
      map->expert_capacity < -1 || map->row_capacity < 0 ||
      (uint64_t) map->row_capacity > kMaxTensorBytes / sizeof (int64_t) ||
      (n_choices > 0 && map->indices == nullptr) || map->sizes == nullptr ||
      map->row_of == nullptr || map->choice_of == nullptr ||
      !is_aligned (map->indices, sizeof (int64_t)) || !is_aligned (map->sizes, sizeof (int64_t)) ||
      !is_aligned (map->row_of, sizeof (int64_t)) || !is_aligned (map->choice_of, sizeof (int64_t)) ||
      workspace == nullptr || !is_aligned (workspace, sizeof (uint64_t)))
    return GMLP_KERNEL_INVALID_VALUE;
  layout = map_layout (n_choices, map->n_experts);
  if (layout.bytes == 0)
    return GMLP_KERNEL_UNSUPPORTED;

  params.indices = map->indices;
  params.n_choices = n_choices;
  params.n_experts = map->n_experts;
  params.tile_rounds = layout.tile_rounds;
  params.n_tiles = layout.n_tiles;
  params.tile_counts = reinterpret_cast<uint64_t *> (ws + layout.tile_counts);
  params.global_counters = layout.shared_counters ? nullptr :
                           reinterpret_cast<uint32_t *> (ws + layout.global_counters);
  params.expert_total = reinterpret_cast<uint64_t *> (ws + layout.expert_total);
  params.expert_start = reinterpret_cast<uint64_t *> (ws + layout.expert_start);
  params.expert_kept = reinterpret_cast<uint64_t *> (ws + layout.expert_kept);
  params.padding = (uint64_t) map->padding;
  params.expert_capacity = map->expert_capacity;
  params.row_capacity = (uint64_t) map->row_capacity;
  params.sizes = map->sizes;
  params.row_of = map->row_of;
  params.choice_of = map->choice_of;

  /* Every slot reads -1 until a choice is scattered into it: the padding
   * rows and the slots past the last keep it. Pass 1 writes it; without
   * choices, which launch no pass 1, a memset (all bytes 0xff). */
  if (map->row_capacity > 0 && layout.n_tiles == 0)
    {
      err = cudaMemsetAsync (map->choice_of, 0xff, (size_t) map->row_capacity * sizeof (int64_t),
                             stream);
      if (err != cudaSuccess)
        return record_cuda_error (err);
    }

  blocks = min_u64 (div_up (layout.n_tiles, kMapWarps), kMaxGridX);
  shared_bytes = layout.shared_counters ? (size_t) kMapWarps * map->n_experts * sizeof (uint32_t) : 0;
  if (layout.n_tiles > 0)
    {
      routing_map_tiles_kernel<false><<<(unsigned) blocks, kMapThreads, shared_bytes, stream>>> (params);
      status = check_launch ();
      if (status != GMLP_KERNEL_SUCCESS)
        return status;
    }
  /* With no choices these still write every size (zeros). */
  routing_map_scan_kernel<<<(unsigned) div_up (map->n_experts, kScanExperts),
                            dim3 (kScanExperts, kScanSegments), 0, stream>>> (params);
  status = check_launch ();
  if (status != GMLP_KERNEL_SUCCESS)
    return status;
  routing_map_sizes_kernel<<<1, kElementwiseThreads, 0, stream>>> (params);
  status = check_launch ();
  if (status != GMLP_KERNEL_SUCCESS || layout.n_tiles == 0)
    return status;
  routing_map_tiles_kernel<true><<<(unsigned) blocks, kMapThreads, shared_bytes, stream>>> (params);
  return check_launch ();
}

extern "C" size_t
gmlp_kernel_permute_workspace_bytes (uint32_t n_groups)
{
  return (size_t) (gmlp::permute_total_offset (n_groups) + sizeof (uint64_t));
}

extern "C" GmlpKernelStatus
gmlp_kernel_permute (const GmlpKernelPermute *p,
                     void                    *workspace,
                     cudaStream_t             stream)
{
  using namespace gmlp;
  uint8_t *ws = static_cast<uint8_t *> (workspace);
  bool to_slots, weighted, uses_tokens, uses_permuted, vector;
  uint32_t tokens_size, permuted_size, out_size;
  GroupedOperand out_op = {}, permuted_op = {};
  PermuteGroupsParams table;
  PermuteParams params;
  PermuteKernel kernel;
  uint64_t n_choices, rows, blocks;
  int sm_count = 0;
  GmlpKernelStatus status;
  cudaError_t err;

  if (p == nullptr || (int) p->kind < (int) GMLP_KERNEL_PERMUTE_FORWARD ||
      (int) p->kind > (int) GMLP_KERNEL_PERMUTE_COMBINE_BACKWARD)
    return GMLP_KERNEL_INVALID_VALUE;
  to_slots = p->kind == GMLP_KERNEL_PERMUTE_FORWARD || p->kind == GMLP_KERNEL_PERMUTE_COMBINE_BACKWARD;
  weighted = p->kind == GMLP_KERNEL_PERMUTE_COMBINE || p->kind == GMLP_KERNEL_PERMUTE_COMBINE_BACKWARD;
  uses_tokens = to_slots;
  uses_permuted = p->kind != GMLP_KERNEL_PERMUTE_FORWARD;

  if (p->n_tokens < 0 || (uint64_t) p->n_tokens > kMaxChoices / kPermuteMaxTopK ||
      p->top_k < 1 || p->top_k > kPermuteMaxTopK || p->shape.n_groups < 1 ||
      p->shape.device_rows == nullptr || p->shape.cols < 1 || p->shape.cols > INT32_MAX ||
      p->shape.row_capacity < 0 || !is_float (p->out_dtype) ||
      (uses_tokens && !is_float (p->tokens_dtype)) || (uses_permuted && !is_float (p->permuted_dtype)))
    return GMLP_KERNEL_INVALID_VALUE;
  n_choices = (uint64_t) p->n_tokens * p->top_k;
  tokens_size = uses_tokens ? gmlp_num_dtype_size (p->tokens_dtype) : 0;
  permuted_size = uses_permuted ? gmlp_num_dtype_size (p->permuted_dtype) : 0;
  out_size = gmlp_num_dtype_size (p->out_dtype);
  if (p->out == nullptr || !is_aligned (p->out, out_size) ||
      (p->shape.row_capacity > 0 && p->choice_of == nullptr) ||
      !is_aligned (p->choice_of, sizeof (int64_t)) || !is_aligned (p->row_of, sizeof (int64_t)) ||
      !is_aligned (p->probs, sizeof (float)) || !is_aligned (p->grad_probs, sizeof (float)) ||
      !is_aligned (p->addend, sizeof (float)) ||
      (p->addend != nullptr && p->kind != GMLP_KERNEL_PERMUTE_BACKWARD) ||
      (uses_tokens && !is_aligned (p->tokens, tokens_size)) ||
      (uses_permuted && !is_aligned (p->permuted, permuted_size)) ||
      workspace == nullptr || !is_aligned (workspace, sizeof (uint64_t)))
    return GMLP_KERNEL_INVALID_VALUE;
  if (p->n_tokens > 0 &&
      (p->row_of == nullptr || (weighted && p->probs == nullptr) ||
       (uses_tokens && p->tokens == nullptr) || (uses_permuted && p->permuted == nullptr)))
    return GMLP_KERNEL_INVALID_VALUE;

  /* The permuted operands, laid out for their own element sizes. */
  if (!describe_operand (&out_op, p->out, out_size, &p->shape) ||
      (uses_permuted && !describe_operand (&permuted_op, p->permuted, permuted_size, &p->shape)))
    return GMLP_KERNEL_UNSUPPORTED;

  /* Whole packs where every row allows them: the columns a multiple of
   * the pack, every base aligned to it (members start on 256-byte
   * boundaries). */
  vector = p->shape.cols % kPermuteVector == 0 &&
           is_aligned (p->out, (uint64_t) kPermuteVector * out_size) &&
           (!uses_tokens || is_aligned (p->tokens, (uint64_t) kPermuteVector * tokens_size)) &&
           (!uses_permuted || is_aligned (p->permuted, (uint64_t) kPermuteVector * permuted_size)) &&
           is_aligned (p->addend, (uint64_t) kPermuteVector * sizeof (float));

  params.n_groups = p->shape.n_groups;
  params.n_tokens = (uint64_t) p->n_tokens;
  params.top_k = p->top_k;
  params.n_choices = n_choices;
  params.n_packs = (uint64_t) p->shape.cols / (vector ? kPermuteVector : 1);
  params.row_capacity = (uint64_t) p->shape.row_capacity;
  params.row_of = p->row_of;
  params.choice_of = p->choice_of;
  params.probs = p->probs;
  params.tokens = static_cast<const uint8_t *> (p->tokens);
  params.tokens_dtype = p->tokens_dtype;
  params.tokens_row_bytes = (uint64_t) p->shape.cols * tokens_size;
  params.permuted = static_cast<const uint8_t *> (p->permuted);
  params.permuted_dtype = p->permuted_dtype;
  params.permuted_row_bytes = (uint64_t) p->shape.cols * permuted_size;
  params.out = static_cast<uint8_t *> (p->out);
  params.out_dtype = p->out_dtype;
  params.out_row_bytes = (uint64_t) p->shape.cols * out_size;
  params.grad_probs = p->kind == GMLP_KERNEL_PERMUTE_COMBINE_BACKWARD ? p->grad_probs : nullptr;
  params.addend = p->addend;

  /* The table: operand 0 is the one whose rows are walked (the output to
   * the slots, the permuted input to the tokens), 1 the permuted input of
   * COMBINE_BACKWARD. */
  table.device_rows = p->shape.device_rows;
  table.n_groups = p->shape.n_groups;
  table.operands[0] = to_slots ? out_op : permuted_op;
  table.operands[1] = p->kind == GMLP_KERNEL_PERMUTE_COMBINE_BACKWARD ? permuted_op : table.operands[0];
  table.groups = reinterpret_cast<PermuteGroup *> (ws);
  table.total_rows = reinterpret_cast<uint64_t *> (ws + permute_total_offset (p->shape.n_groups));
  params.groups = table.groups;
  params.total_rows = table.total_rows;

  if (to_slots)
    {
      kernel = vector ? select_to_slots<kPermuteVector> (tokens_size, permuted_size, out_size, weighted)
                      : select_to_slots<1> (tokens_size, permuted_size, out_size, weighted);
      /* The most rows the output's allocation holds, whatever the sizes. */
      rows = out_op.capacity / out_op.row_bytes;
    }
  else
    {
      kernel = vector ? select_to_tokens<kPermuteVector> (permuted_size, out_size, weighted)
                      : select_to_tokens<1> (permuted_size, out_size, weighted);
      rows = params.n_tokens;
    }

  /* Every grad_probs value is written: zeros, then the choices that have
   * a row. */
  if (params.grad_probs != nullptr && n_choices > 0)
    {
      err = cudaMemsetAsync (params.grad_probs, 0, (size_t) n_choices * sizeof (float), stream);
      if (err != cudaSuccess)
        return record_cuda_error (err);
    }
  if (rows == 0)
    return GMLP_KERNEL_SUCCESS;

  err = current_sm_count (&sm_count);
  if (err != cudaSuccess)
    return record_cuda_error (err);
  permute_groups_kernel<<<1, kElementwiseThreads, 0, stream>>> (table);
  status = check_launch ();
  if (status != GMLP_KERNEL_SUCCESS)
    return status;
  /* One wave of blocks at most: the warps stride over the rows. */
  blocks = min_u64 (div_up (rows, kPermuteWarps), (uint64_t) sm_count * kBlocksPerSm);
  kernel<<<(unsigned) blocks, kPermuteThreads, 0, stream>>> (params);
  return check_launch ();
}
