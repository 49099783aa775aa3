/* gmlp-cuda-permute.c: token permutation on the CUDA backend
 *
 * The routing_count, routing_map and permute entries over the kernels of
 * permute.cu. The arguments are checked as the CPU backend checks them
 * (backend/cpu/gmlp-cpu-permute.c, the reference), before anything is
 * enqueued; the rest happens on the device's compute stream without
 * waiting. The map and the permute keep their scratch (the counts per
 * tile, the group table) in the device's workspace, so they hold
 * scratch_lock while they enqueue.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "backend/gmlp-backend-permute.h"
#include "gmlp-cuda-private.h"
#include "gmlp-cuda-permute.h"

G_STATIC_ASSERT ((int) GMLP_PERMUTE_FORWARD == (int) GMLP_KERNEL_PERMUTE_FORWARD);
G_STATIC_ASSERT ((int) GMLP_PERMUTE_COMBINE == (int) GMLP_KERNEL_PERMUTE_COMBINE);
G_STATIC_ASSERT ((int) GMLP_PERMUTE_BACKWARD == (int) GMLP_KERNEL_PERMUTE_BACKWARD);
G_STATIC_ASSERT ((int) GMLP_PERMUTE_COMBINE_BACKWARD == (int) GMLP_KERNEL_PERMUTE_COMBINE_BACKWARD);

gboolean
gmlp_cuda_routing_count (GmlpBackendDevice  *device,
                         const gint64       *indices,
                         gint64              n_choices,
                         guint               n_experts,
                         gint64             *counts,
                         GError            **error)
{
  if (n_choices < 0 || n_choices > GMLP_BACKEND_PERMUTE_SATURATION ||
      (n_choices > 0 && indices == NULL) || (n_experts > 0 && counts == NULL))
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: routing_count needs indices and counts");
      return FALSE;
    }
  if (!gmlp_cuda_activate (device, error))
    return FALSE;
  return gmlp_cuda_kernel_result (gmlp_kernel_routing_count (indices, n_choices, n_experts, counts,
                                                             device->stream),
                                  "gmlp_kernel_routing_count", error);
}

gboolean
gmlp_cuda_routing_map (GmlpBackendDevice            *device,
                       const GmlpBackendRoutingMap  *map,
                       GError                      **error)
{
  GmlpKernelRoutingMap kernel_map;
  gsize workspace_bytes;
  gpointer workspace;
  gboolean ok;

  if (!gmlp_backend_check_routing_map ("CUDA", map, error))
    return FALSE;

  kernel_map = (GmlpKernelRoutingMap) {
    .n_tokens = map->n_tokens,
    .top_k = map->top_k,
    .n_experts = map->n_experts,
    .indices = map->indices,
    .padding = map->padding,
    .expert_capacity = map->expert_capacity,
    .row_capacity = map->row_capacity,
    .sizes = map->sizes,
    .row_of = map->row_of,
    .choice_of = map->choice_of,
  };
  workspace_bytes = gmlp_kernel_routing_map_workspace_bytes (&kernel_map);
  if (workspace_bytes == 0)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: routing_map: %" G_GINT64_FORMAT " tokens, top-%u of %u experts are too "
                   "many (at most 65535 experts)", map->n_tokens, map->top_k, map->n_experts);
      return FALSE;
    }
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  /* The counts per tile go through the device's workspace: see
   * scratch_lock. */
  g_rec_mutex_lock (&device->scratch_lock);
  workspace = gmlp_cuda_device_workspace (device, workspace_bytes, error);
  ok = workspace != NULL &&
       gmlp_cuda_kernel_result (gmlp_kernel_routing_map (&kernel_map, workspace, device->stream),
                                "gmlp_kernel_routing_map", error);
  g_rec_mutex_unlock (&device->scratch_lock);
  return ok;
}

gboolean
gmlp_cuda_permute (GmlpBackendDevice         *device,
                   const GmlpBackendPermute  *permute,
                   GError                   **error)
{
  GmlpKernelPermute kernel_permute;
  gpointer workspace;
  gboolean ok;

  if (!gmlp_backend_check_permute ("CUDA", permute, error))
    return FALSE;
  /* The kernels write into out whether or not there are tokens. */
  if (permute->out == NULL)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "CUDA: permute: missing the output");
      return FALSE;
    }

  kernel_permute = (GmlpKernelPermute) {
    .kind = (GmlpKernelPermuteKind) permute->kind,
    .n_tokens = permute->n_tokens,
    .top_k = permute->top_k,
    .row_of = permute->row_of,
    .choice_of = permute->choice_of,
    .probs = permute->probs,
    .tokens = permute->tokens,
    .tokens_dtype = permute->tokens_dtype,
    .permuted = permute->permuted,
    .permuted_dtype = permute->permuted_dtype,
    .out = permute->out,
    .out_dtype = permute->out_dtype,
    .grad_probs = permute->grad_probs,
    .addend = permute->addend,
  };
  gmlp_cuda_kernel_shape (&permute->shape, &kernel_permute.shape);
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  /* The group table goes through the device's workspace: see
   * scratch_lock. */
  g_rec_mutex_lock (&device->scratch_lock);
  workspace = gmlp_cuda_device_workspace (device,
                                          gmlp_kernel_permute_workspace_bytes (permute->shape.n_groups),
                                          error);
  ok = workspace != NULL &&
       gmlp_cuda_kernel_result (gmlp_kernel_permute (&kernel_permute, workspace, device->stream),
                                "gmlp_kernel_permute", error);
  g_rec_mutex_unlock (&device->scratch_lock);
  return ok;
}
