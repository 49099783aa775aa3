/* gmlp-cuda-router.c: the router entries of the CUDA backend
 *
 * The kernels of router.cu, on the device's compute stream. The forward's
 * sums live in the device's workspace (gmlp_cuda_device_workspace()), so
 * nothing is allocated or waited for and each entry can be captured in a
 * graph. The arithmetic and how closely it follows the CPU reference:
 * gmlp-kernels.h and kernels/impls/router.cuh.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-private.h"
#include "gmlp-cuda-router.h"

static void
kernel_router (const GmlpBackendRouter *router,
               GmlpKernelRouter        *k)
{
  k->n_tokens = router->n_tokens;
  k->n_experts = router->n_experts;
  k->top_k = router->top_k;
  k->score_function = router->score_function;
  k->softmax_before_topk = router->softmax_before_topk ? 1 : 0;
  k->renormalize = router->renormalize ? 1 : 0;
  k->scaling_factor = router->scaling_factor;
  k->n_groups = router->n_groups;
  k->topk_groups = router->topk_groups;
  k->aux_loss_coeff = router->aux_loss_coeff;
  k->z_loss_coeff = router->z_loss_coeff;
}

gboolean
gmlp_cuda_router_forward (GmlpBackendDevice        *device,
                          const GmlpBackendRouter  *router,
                          const float              *logits,
                          const float              *expert_bias,
                          gint64                   *indices,
                          float                    *probs,
                          gint64                   *tokens_per_expert,
                          float                    *aux_loss,
                          float                    *z_loss,
                          GError                  **error)
{
  GmlpKernelRouter k;
  gpointer workspace;
  gboolean ok;

  kernel_router (router, &k);
  if (!gmlp_cuda_activate (device, error))
    return FALSE;
  /* Three launches share the workspace: see scratch_lock. */
  g_rec_mutex_lock (&device->scratch_lock);
  workspace = gmlp_cuda_device_workspace (device, gmlp_kernel_router_forward_workspace_bytes (&k), error);
  ok = workspace != NULL &&
       gmlp_cuda_kernel_result (gmlp_kernel_router_forward (&k, logits, expert_bias, (int64_t *) indices,
                                                            probs, (int64_t *) tokens_per_expert,
                                                            aux_loss, z_loss, workspace, device->stream),
                                "gmlp_kernel_router_forward", error);
  g_rec_mutex_unlock (&device->scratch_lock);
  return ok;
}

gboolean
gmlp_cuda_router_backward (GmlpBackendDevice        *device,
                           const GmlpBackendRouter  *router,
                           const float              *logits,
                           const gint64             *indices,
                           const gint64             *tokens_per_expert,
                           const float              *grad_probs,
                           float                    *grad_logits,
                           GError                  **error)
{
  GmlpKernelRouter k;

  kernel_router (router, &k);
  if (!gmlp_cuda_activate (device, error))
    return FALSE;
  return gmlp_cuda_kernel_result (gmlp_kernel_router_backward (&k, logits, (const int64_t *) indices,
                                                               (const int64_t *) tokens_per_expert,
                                                               grad_probs, grad_logits, device->stream),
                                  "gmlp_kernel_router_backward", error);
}

gboolean
gmlp_cuda_router_update_bias (GmlpBackendDevice  *device,
                              guint               n_experts,
                              const gint64       *tokens_per_expert,
                              float               rate,
                              float              *expert_bias,
                              GError            **error)
{
  if (!gmlp_cuda_activate (device, error))
    return FALSE;
  return gmlp_cuda_kernel_result (gmlp_kernel_router_update_bias (n_experts, (const int64_t *) tokens_per_expert,
                                                                  rate, expert_bias, device->stream),
                                  "gmlp_kernel_router_update_bias", error);
}
