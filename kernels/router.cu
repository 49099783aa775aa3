/* router.cu: gmlp_kernel_router_forward(), gmlp_kernel_router_backward()
 * and gmlp_kernel_router_update_bias()
 *
 * The launches around impls/router.cuh (which says how the kernels follow
 * the CPU reference). The forward is three launches: a small kernel zeroes
 * the counts and the aux loss's sums, the main kernel routes the tokens,
 * and a one-block kernel turns the counts and sums into the two losses.
 * The host reads nothing of the device and allocates nothing (the sums
 * live in the caller's workspace), so every entry can be captured in a
 * graph. The grids are fixed by T and E alone, not by the GPU, so that the
 * sums, hence the bits, are the same on every device.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <cmath>

#include "gmlp-kernels.h"
#include "impls/common.cuh"
#include "impls/router.cuh"

namespace gmlp {
namespace {

/* Blocks of the forward's main kernel, at most: also the number of z
 * partials the workspace holds. */
constexpr uint32_t kMaxForwardBlocks = 2048;
constexpr uint32_t kMaxBackwardBlocks = 8192;
/* T × 2^s must stay below 2^63 with s >= 21 (impls/router.cuh); no memory
 * holds that many logits anyway. */
constexpr int64_t kMaxTokens = (int64_t) 1 << 40;

/* The checks of the CPU reference's check_router(). */
bool
valid_options (const GmlpKernelRouter *r)
{
  const uint32_t e = r->n_experts, k = r->top_k, g = r->n_groups;

  return r->n_tokens >= 0 && e >= 1 && e <= kRouterMaxExperts && k >= 1 && k <= kRouterMaxTopK &&
         k <= e && (r->score_function == 0 || r->score_function == 1) &&
         (g == 0 || (e % g == 0 && r->topk_groups >= 1 && r->topk_groups <= g &&
                     (uint64_t) k <= (uint64_t) r->topk_groups * (e / g)));
}

RouterOptions
options_of (const GmlpKernelRouter *r)
{
  RouterOptions o;

  o.n_tokens = r->n_tokens;
  o.n_experts = r->n_experts;
  o.top_k = r->top_k;
  /* Keeping every group limits nothing: no group pass then. */
  o.n_groups = r->n_groups > 0 && r->topk_groups < r->n_groups ? r->n_groups : 0;
  o.per_group = o.n_groups > 0 ? r->n_experts / o.n_groups : r->n_experts;
  o.topk_groups = r->topk_groups;
  o.softmax = r->score_function == 0;
  o.on_logits = o.softmax && !r->softmax_before_topk;
  o.renormalize = r->renormalize != 0;
  o.scaling = r->scaling_factor;
  o.aux_coeff = r->aux_loss_coeff;
  o.z_coeff = r->z_loss_coeff;
  return o;
}

/* A warp per token up to kRouterWarpMaxExperts experts, else a block. */
bool
warp_per_token (uint32_t n_experts)
{
  return n_experts <= kRouterWarpMaxExperts;
}

uint32_t
token_blocks (int64_t n_tokens, uint32_t n_experts, uint32_t max_blocks)
{
  const uint64_t per_block = warp_per_token (n_experts) ? kRouterWarps : 1;

  return (uint32_t) min_u64 (div_up ((uint64_t) n_tokens, per_block), max_blocks);
}

/* The workspace: E fixed-point sums, the NaN flag (8 bytes), the z
 * partials. */
uint64_t
nan_flag_offset (uint32_t n_experts)
{
  return (uint64_t) n_experts * sizeof (unsigned long long);
}

uint64_t
partials_offset (uint32_t n_experts)
{
  return nan_flag_offset (n_experts) + sizeof (uint64_t);
}

}  // namespace
}  // namespace gmlp

extern "C" size_t
gmlp_kernel_router_forward_workspace_bytes (const GmlpKernelRouter *router)
{
  using namespace gmlp;

  if (router == nullptr)
    return 0;
  return (size_t) (partials_offset (router->n_experts) + kMaxForwardBlocks * sizeof (double));
}

extern "C" GmlpKernelStatus
gmlp_kernel_router_forward (const GmlpKernelRouter *router,
                            const float            *logits,
                            const float            *expert_bias,
                            int64_t                *indices,
                            float                  *probs,
                            int64_t                *tokens_per_expert,
                            float                  *aux_loss,
                            float                  *z_loss,
                            void                   *workspace,
                            cudaStream_t            stream)
{
  using namespace gmlp;
  uint8_t *ws = static_cast<uint8_t *> (workspace);
  RouterForwardParams params;
  uint32_t blocks = 0;
  GmlpKernelStatus status;

  if (router == nullptr || !valid_options (router))
    return GMLP_KERNEL_INVALID_VALUE;
  if (router->n_tokens > kMaxTokens)
    return GMLP_KERNEL_UNSUPPORTED;
  if (tokens_per_expert == nullptr || aux_loss == nullptr || z_loss == nullptr || workspace == nullptr ||
      !is_aligned (tokens_per_expert, sizeof (int64_t)) || !is_aligned (aux_loss, sizeof (float)) ||
      !is_aligned (z_loss, sizeof (float)) || !is_aligned (workspace, sizeof (uint64_t)) ||
      !is_aligned (expert_bias, sizeof (float)))
    return GMLP_KERNEL_INVALID_VALUE;
  if (router->n_tokens > 0 &&
      (logits == nullptr || indices == nullptr || probs == nullptr || !is_aligned (logits, sizeof (float)) ||
       !is_aligned (indices, sizeof (int64_t)) || !is_aligned (probs, sizeof (float))))
    return GMLP_KERNEL_INVALID_VALUE;

  params.o = options_of (router);
  params.logits = logits;
  params.bias = expert_bias;
  params.indices = indices;
  params.probs = probs;
  params.counts = reinterpret_cast<unsigned long long *> (tokens_per_expert);
  params.psum = reinterpret_cast<unsigned long long *> (ws);
  params.nan_flag = reinterpret_cast<unsigned int *> (ws + nan_flag_offset (router->n_experts));
  params.z_partials = reinterpret_cast<double *> (ws + partials_offset (router->n_experts));
  params.aux = aux_loss;
  params.z = z_loss;
  params.psum_scale = 1.0f;
  params.psum_unscale = 1.0;
  if (router->n_tokens > 0)
    {
      /* 2^s with T < 2^(62 - s): T probabilities of at most 1 (and a few
       * ulps) add up below 2^63. */
      const int bits = 64 - __builtin_clzll ((unsigned long long) router->n_tokens);
      const int shift = 62 - bits;

      params.psum_scale = std::ldexp (1.0f, shift);
      params.psum_unscale = std::ldexp (1.0, -shift);
      blocks = token_blocks (router->n_tokens, router->n_experts, kMaxForwardBlocks);
    }
  params.n_partials = blocks;

  router_init_kernel<<<(unsigned) div_up (router->n_experts, kRouterThreads), kRouterThreads, 0, stream>>> (params);
  status = check_launch ();
  if (status != GMLP_KERNEL_SUCCESS)
    return status;
  if (blocks > 0)
    {
      if (warp_per_token (router->n_experts))
        router_forward_kernel<32><<<blocks, kRouterThreads, 0, stream>>> (params);
      else
        router_forward_kernel<kRouterThreads><<<blocks, kRouterThreads, 0, stream>>> (params);
      status = check_launch ();
      if (status != GMLP_KERNEL_SUCCESS)
        return status;
    }
  router_finish_kernel<<<1, kRouterThreads, 0, stream>>> (params);
  return check_launch ();
}

extern "C" GmlpKernelStatus
gmlp_kernel_router_backward (const GmlpKernelRouter *router,
                             const float            *logits,
                             const int64_t          *indices,
                             const int64_t          *tokens_per_expert,
                             const float            *grad_probs,
                             float                  *grad_logits,
                             cudaStream_t            stream)
{
  using namespace gmlp;
  RouterBackwardParams params;
  uint32_t blocks;

  if (router == nullptr || !valid_options (router))
    return GMLP_KERNEL_INVALID_VALUE;
  if (router->n_tokens > kMaxTokens)
    return GMLP_KERNEL_UNSUPPORTED;
  if (router->n_tokens == 0)
    return GMLP_KERNEL_SUCCESS;
  if (logits == nullptr || indices == nullptr || grad_probs == nullptr || grad_logits == nullptr ||
      (router->aux_loss_coeff != 0.0f && tokens_per_expert == nullptr) ||
      !is_aligned (logits, sizeof (float)) || !is_aligned (indices, sizeof (int64_t)) ||
      !is_aligned (tokens_per_expert, sizeof (int64_t)) || !is_aligned (grad_probs, sizeof (float)) ||
      !is_aligned (grad_logits, sizeof (float)))
    return GMLP_KERNEL_INVALID_VALUE;

  params.o = options_of (router);
  params.logits = logits;
  params.indices = indices;
  params.counts = tokens_per_expert;
  params.grad_probs = grad_probs;
  params.grad_logits = grad_logits;
  blocks = token_blocks (router->n_tokens, router->n_experts, kMaxBackwardBlocks);
  if (warp_per_token (router->n_experts))
    router_backward_kernel<32><<<blocks, kRouterThreads, 0, stream>>> (params);
  else
    router_backward_kernel<kRouterThreads><<<blocks, kRouterThreads, 0, stream>>> (params);
  return check_launch ();
}

extern "C" GmlpKernelStatus
gmlp_kernel_router_update_bias (uint32_t        n_experts,
                                const int64_t  *tokens_per_expert,
                                float           rate,
                                float          *expert_bias,
                                cudaStream_t    stream)
{
  using namespace gmlp;
  RouterBiasParams params;

  if (n_experts == 0)
    return GMLP_KERNEL_SUCCESS;
  if (tokens_per_expert == nullptr || expert_bias == nullptr ||
      !is_aligned (tokens_per_expert, sizeof (int64_t)) || !is_aligned (expert_bias, sizeof (float)))
    return GMLP_KERNEL_INVALID_VALUE;

  params.n_experts = n_experts;
  params.counts = tokens_per_expert;
  params.rate = rate;
  params.bias = expert_bias;
  router_update_bias_kernel<<<1, kRouterThreads, 0, stream>>> (params);
  return check_launch ();
}
