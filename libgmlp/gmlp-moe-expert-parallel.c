/* gmlp-moe-expert-parallel.c: GmlpMoELayer's experts over the ranks of a
 * communicator
 *
 * Rank r of W holds the experts [r L, (r + 1) L), L = E / W. Its router
 * permutes its own tokens over all E experts (the one-device permute:
 * group a L + b of the permuted layout is local expert b of rank a), and
 * the experts' step moves them:
 *
 *   dispatch     permuted layout (MEMBERS of the W × L grid)
 *                  -> a send buffer -> all-to-all -> a receive buffer
 *                  -> the local experts' input (MEMBERS_BY_B: expert b's
 *                     rows from rank 0, then rank 1, ...)
 *   experts      the local GroupedMLP of L groups, device sizes
 *   return trip  the mirror image, back into the permuted layout
 *
 * The buffers are PACKED in exact mode (the counts gathered and read on
 * the host once a forward, the rows sent by all_to_all_rows with those
 * splits) and SLOTS of C rows per (rank, expert) in graph-safe mode (the
 * counts travel on the device, all_to_all of whole slots, nothing read on
 * the host). The backward moves the gradients the same way with the
 * forward's counts. gmlp_row_chunks_move() does every move on the device.
 *
 * This file holds the step's entry points, which run it in one chunk or,
 * with expert-parallel-chunks, pipelined by chunks of local experts
 * (gmlp-moe-expert-parallel-chunks.c); the trips themselves are
 * gmlp-moe-expert-parallel-trips.c (gmlp-moe-expert-parallel-impl.h), the
 * properties and the ranks' agreement
 * gmlp-moe-expert-parallel-properties.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-moe-expert-parallel-impl.h"
#include "gmlp-error.h"
#include "gmlp-thread-private.h"

void
gmlp_moe_parallel_step_free (gpointer data)
{
  GmlpMoEParallelStep *step = data;

  if (step == NULL)
    return;
  g_clear_object (&step->sizes);
  g_clear_object (&step->kept);
  g_clear_object (&step->recv_counts);
  g_clear_object (&step->expert_sizes);
  g_free (step->send_rows);
  g_free (step->recv_rows);
  g_free (step->send_grid);
  g_free (step->recv_grid);
  g_free (step);
}

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GmlpMoEParallelStep, gmlp_moe_parallel_step_free)

static GmlpGroupedTensor *
trip_end (Trip              *trip,
          GmlpGroupedTensor *result)
{
  if (result == NULL && trip->entered && !trip->collective_failed)
    gmlp_communicator_abort (trip->layer->communicator);
  return result;
}

/* How many chunks a forward pipelines. A training forward's experts save
 * by chunk and their backward computes the weight gradients of every
 * chunk in one computation; not FP8 experts, whose quantizers would see
 * each chunk alone (amax, delayed scaling): those train in one chunk. */
static guint
n_chunks_for (GmlpMoELayer  *self,
              gboolean       saving)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (self->experts);

  if (saving && gmlp_grouped_linear_get_quantizer (fc1, GMLP_QUANTIZER_ROLE_INPUT) != NULL)
    return 1;
  return MIN (self->parallel_chunks, self->n_local_experts);
}

GmlpGroupedTensor *
gmlp_moe_parallel_forward (GmlpMoELayer           *self,
                           GmlpRouting            *routing,
                           GmlpGroupedTensor      *permuted,
                           GmlpSavedActivations  **saved,
                           GmlpMoEParallelStep   **step_out,
                           GmlpMoEParallelOverlap  overlap,
                           gpointer                overlap_data,
                           GError                **error)
{
  g_autoptr(GmlpMoEParallelStep) step = g_new0 (GmlpMoEParallelStep, 1);
  g_autoptr(GmlpGroupedTensor) dropped = NULL, expert_in = NULL, expert_out = NULL, out = NULL;
  Trip trip = { self, FALSE, FALSE };
  GmlpGroupedTensor *sizes;

  step->mode = self->parallel_mode;
  step->world = gmlp_communicator_get_world_size (self->communicator);
  step->n_local = self->n_local_experts;
  step->cols = gmlp_grouped_tensor_get_cols (permuted);
  sizes = gmlp_grouped_tensor_get_sizes (permuted, error);
  if (sizes == NULL)
    return NULL;
  step->sizes = g_object_ref (sizes);
  step->row_capacity = gmlp_grouped_tensor_get_row_capacity (permuted);

  /* What can fail on this rank alone comes first. */
  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
    {
      gint64 one = 1;

      if (!gmlp_moe_parallel_graph_safe_counts (step, self, routing, error))
        return NULL;
      dropped = gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_INT64, &one, 1, 1, error);
      if (dropped == NULL || !gmlp_grouped_tensor_fill_zero (dropped, error))
        return NULL;
    }
  step->expert_sizes = new_counts (self, step->n_local, error);
  if (step->expert_sizes == NULL)
    return NULL;

  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT &&
      !gmlp_moe_parallel_exact_counts (&trip, step, error))
    return trip_end (&trip, NULL);
  /* The experts run chunk by chunk (gmlp-moe-expert-parallel-chunks.c),
   * saving or not; the backward takes the chunks as the forward made
   * them. */
  step->n_chunks = n_chunks_for (self, saved != NULL);
  if (step->n_chunks > 1)
    {
      out = gmlp_moe_parallel_forward_chunked (&trip, step, permuted, step->n_chunks, saved, dropped,
                                               overlap, overlap_data, error);
      if (out == NULL)
        return trip_end (&trip, NULL);
    }
  else
    {
      expert_in = gmlp_moe_parallel_dispatch (&trip, step, permuted, TRUE, dropped, overlap,
                                              overlap_data, error);
      if (expert_in == NULL)
        return trip_end (&trip, NULL);
      expert_out = gmlp_grouped_mlp_forward (self->experts, expert_in, saved, error);
      if (expert_out == NULL)
        return trip_end (&trip, NULL);
      out = gmlp_moe_parallel_return_trip (&trip, step, expert_out, error);
      if (out == NULL)
        return trip_end (&trip, NULL);
    }

  gmlp_mutex_lock (&self->last_lock);
  g_set_object (&self->last_dropped, dropped);
  gmlp_mutex_unlock (&self->last_lock);
  if (step_out != NULL)
    *step_out = g_steal_pointer (&step);
  return g_steal_pointer (&out);
}

GmlpGroupedTensor *
gmlp_moe_parallel_backward (GmlpMoELayer           *self,
                            GmlpSavedActivations   *saved,
                            GmlpMoEParallelStep    *step,
                            GmlpGroupedTensor      *grad_output,
                            GmlpMoEParallelOverlap  overlap,
                            gpointer                overlap_data,
                            GError                **error)
{
  g_autoptr(GmlpGroupedTensor) grad_expert_out = NULL, grad_expert_in = NULL;
  Trip trip = { self, FALSE, FALSE };

  if (step == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "These saved activations are not of an expert-parallel forward");
      return NULL;
    }
  if (step->n_chunks > 1)
    return trip_end (&trip, gmlp_moe_parallel_backward_chunked (&trip, step, saved, grad_output,
                                                                overlap, overlap_data, error));
  grad_expert_out = gmlp_moe_parallel_dispatch (&trip, step, grad_output, FALSE, NULL, overlap,
                                                overlap_data, error);
  if (grad_expert_out == NULL)
    return trip_end (&trip, NULL);
  grad_expert_in = gmlp_grouped_mlp_backward (self->experts, saved, grad_expert_out, error);
  if (grad_expert_in == NULL)
    return trip_end (&trip, NULL);
  return trip_end (&trip, gmlp_moe_parallel_return_trip (&trip, step, grad_expert_in, error));
}
