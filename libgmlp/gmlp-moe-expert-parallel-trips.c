/* gmlp-moe-expert-parallel-trips.c: the trips of the expert-parallel
 * step's rows
 *
 * The step's counts (exact: gathered and read on the host; graph-safe:
 * slots on the device), the trips' buffers (packed, in place where the
 * layout allows, or slots), their all-to-alls, and the dispatch and the
 * return trip of one chunk, which gmlp-moe-expert-parallel.c runs for an
 * unchunked step; gmlp-moe-expert-parallel-chunks.c takes the buffers and
 * the packing from here for its pipeline. The layouts and the modes are
 * told in gmlp-moe-expert-parallel.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>

#include "gmlp-moe-expert-parallel-impl.h"
#include "gmlp-communicator-private.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-quantizer-private.h"
#include "gmlp-routing-private.h"

/* A buffer of one group of @rows rows, or of W × L slots, of @cols
 * columns. */
GmlpGroupedTensor *
gmlp_moe_parallel_new_buffer (GmlpMoELayer         *self,
                              GmlpMoEParallelStep  *step,
                              GmlpDType             dtype,
                              gint64                rows,
                              gint64                cols,
                              GError              **error)
{
  g_autofree gint64 *slots = NULL;
  guint n = (guint) step->world * step->n_local, i;

  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT)
    return gmlp_grouped_tensor_new (self->device, dtype, &rows, 1, cols, error);
  slots = g_new (gint64, n);
  for (i = 0; i < n; i++)
    slots[i] = step->slot_rows;
  return gmlp_grouped_tensor_new (self->device, dtype, slots, n, cols, error);
}

/* Exact mode: where rows are whole multiples of the member alignment, the
 * groups of a tensor with device sizes lie back to back, so that its first
 * rows are the packed layout of its groups in order: a view of its storage
 * as one group of all its rows then sends or receives them in place,
 * without the copy into a packed buffer. NULL where it can't. */
GmlpGroupedTensor *
gmlp_moe_parallel_packed_view (GmlpMoEParallelStep *step,
                               GmlpGroupedTensor   *members)
{
  gint64 rows = gmlp_grouped_tensor_get_row_capacity (members);

  if (step->mode != GMLP_EXPERT_PARALLEL_MODE_EXACT ||
      (gmlp_grouped_tensor_get_cols (members) *
       gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (members))) % GMLP_MEMBER_ALIGNMENT != 0)
    return NULL;
  return gmlp_grouped_tensor_new_rows_view (members, &rows, 1);
}

/* The all-to-all of a trip: out (@back FALSE: from the permuted layout's
 * rank to the experts') or back. @done (optional) as
 * gmlp_communicator_all_to_all_full()'s: the compute stream's wait left to
 * the caller (gmlp_moe_parallel_join()). */
static gboolean
exchange (Trip                 *trip,
          GmlpMoEParallelStep  *step,
          GmlpGroupedTensor    *send,
          GmlpGroupedTensor    *recv,
          gboolean              back,
          GmlpEvent           **done,
          GError              **error)
{
  GmlpCommunicator *comm = trip->layer->communicator;
  guint w = (guint) step->world;

  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
    return collective (trip, gmlp_communicator_all_to_all_full (comm, send, recv, done, error));
  return collective (trip, gmlp_communicator_all_to_all_rows_full (comm, send,
                                                                   back ? step->recv_rows : step->send_rows,
                                                                   w, recv,
                                                                   back ? step->send_rows : step->recv_rows,
                                                                   w, done, error));
}

/* The compute stream waits for every event of @events (all-to-alls left
 * to it), which it empties. After a failure (@error NULL) it still waits
 * for each, so that no buffer is let go, and no capture left, with rows in
 * flight. */
gboolean
gmlp_moe_parallel_join (GmlpMoELayer  *self,
                        GPtrArray     *events,
                        GError       **error)
{
  gboolean ok = TRUE;
  guint i;

  for (i = 0; i < events->len; i++)
    {
      g_autoptr(GError) local = NULL;

      if (!gmlp_event_wait_on_device (g_ptr_array_index (events, i), self->device, &local) && ok)
        {
          ok = FALSE;
          if (error != NULL)
            g_propagate_error (error, g_steal_pointer (&local));
        }
    }
  g_ptr_array_set_size (events, 0);
  return ok;
}

typedef struct {
  GmlpGroupedTensor *send[N_PARTS];
  GmlpGroupedTensor *recv[N_PARTS];
  GmlpGroupedTensor *out[N_PARTS];
} Parts;

static void
parts_clear (Parts *parts)
{
  guint i;

  for (i = 0; i < N_PARTS; i++)
    {
      g_clear_object (&parts->send[i]);
      g_clear_object (&parts->recv[i]);
      g_clear_object (&parts->out[i]);
    }
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Parts, parts_clear)

/* A dispatch's send buffer of @part (in the permuted layout): its own
 * storage where exact mode sends in place, else the rows packed (exact) or
 * in their slots (graph-safe); @count: the forward's rows, whose move
 * counts what the slots keep (step->kept) and drop (@dropped). */
GmlpGroupedTensor *
gmlp_moe_parallel_pack (Trip                 *trip,
                        GmlpMoEParallelStep  *step,
                        GmlpGroupedTensor    *part,
                        gboolean              count,
                        GmlpGroupedTensor    *dropped,
                        GError              **error)
{
  gboolean exact = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT;
  g_autoptr(GmlpGroupedTensor) send = gmlp_moe_parallel_packed_view (step, part);

  if (send != NULL)
    return g_steal_pointer (&send);
  send = gmlp_moe_parallel_new_buffer (trip->layer, step, gmlp_grouped_tensor_get_dtype (part),
                                       step->total_send, gmlp_grouped_tensor_get_cols (part), error);
  if (send == NULL ||
      !move (step->sizes, step, exact ? -1 : step->slot_rows, part, GMLP_CHUNK_LAYOUT_MEMBERS, send,
             exact ? GMLP_CHUNK_LAYOUT_PACKED : GMLP_CHUNK_LAYOUT_SLOTS, GMLP_MOVE_ROWS_NONE,
             count && !exact ? step->kept : NULL, count ? dropped : NULL, error))
    return NULL;
  return g_steal_pointer (&send);
}

/* Graph-safe mode's forward: what each slot kept, to the slots' ranks (L
 * counts per rank), into step->recv_counts. */
gboolean
gmlp_moe_parallel_exchange_kept (Trip                 *trip,
                                 GmlpMoEParallelStep  *step,
                                 GError              **error)
{
  g_autofree gint64 *split = g_new (gint64, step->world);
  int a;

  for (a = 0; a < step->world; a++)
    split[a] = step->n_local;
  return collective (trip, gmlp_communicator_all_to_all_rows (trip->layer->communicator, step->kept,
                                                              split, step->world, step->recv_counts,
                                                              split, step->world, error));
}

/* Rows in the permuted layout to the local experts' input layout on their
 * ranks. @first: the forward's, which writes the experts' sizes and (in
 * graph-safe mode) what each slot kept, and adds the drops to @dropped;
 * with a dispatch quantizer it sends the rows in FP8 with their scales and
 * dequantizes them into the rows' dtype on arrival. */
GmlpGroupedTensor *
gmlp_moe_parallel_dispatch (Trip                    *trip,
                            GmlpMoEParallelStep     *step,
                            GmlpGroupedTensor       *rows,
                            gboolean                 first,
                            GmlpGroupedTensor       *dropped,
                            GmlpMoEParallelOverlap   overlap,
                            gpointer                 overlap_data,
                            GError                 **error)
{
  g_autoptr(GPtrArray) in_flight = g_ptr_array_new_with_free_func (g_object_unref);
  GmlpMoELayer *self = trip->layer;
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (rows);
  gboolean exact = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT;
  gboolean fp8 = first && self->dispatch_quantizer != NULL;
  g_autoptr(GmlpGroupedTensor) q = NULL;
  g_auto(Parts) parts = { { NULL, }, };
  GmlpGroupedTensor **send = parts.send, **recv = parts.recv, **out = parts.out;
  GmlpGroupedTensor *part[N_PARTS] = { rows, NULL };
  guint n_parts = 1, i;

  if (fp8)
    {
      q = gmlp_quantizer_quantize_full (self->dispatch_quantizer, rows, FALSE, error);
      if (q == NULL)
        return NULL;
      part[PART_ROWS] = q;
      part[PART_SCALES] = gmlp_grouped_tensor_get_scale_inv (q);
      n_parts = N_PARTS;
    }
  for (i = 0; i < n_parts; i++)
    {
      send[i] = gmlp_moe_parallel_pack (trip, step, part[i], first && i == PART_ROWS, dropped,
                                        error);
      if (send[i] == NULL)
        return NULL;
      recv[i] = gmlp_moe_parallel_new_buffer (self, step, gmlp_grouped_tensor_get_dtype (part[i]),
                                              step->total_recv, gmlp_grouped_tensor_get_cols (part[i]),
                                              error);
      if (recv[i] == NULL)
        return NULL;
    }
  if (first && !exact && !gmlp_moe_parallel_exchange_kept (trip, step, error))
    return NULL;
  /* The rows travel while the caller's work (the shared expert) runs. */
  for (i = 0; i < n_parts; i++)
    {
      GmlpEvent *done = NULL;

      if (!exchange (trip, step, send[i], recv[i], FALSE, &done, error))
        {
          gmlp_moe_parallel_join (self, in_flight, NULL);
          return NULL;
        }
      g_ptr_array_add (in_flight, done);
    }
  if (overlap != NULL && !overlap (overlap_data, error))
    {
      gmlp_moe_parallel_join (self, in_flight, NULL);
      return NULL;
    }
  if (!gmlp_moe_parallel_join (self, in_flight, error))
    return NULL;

  out[PART_ROWS] = gmlp_grouped_tensor_new_with_device_sizes (self->device,
                                                              gmlp_grouped_tensor_get_dtype (part[PART_ROWS]),
                                                              step->expert_sizes, step->expert_rows,
                                                              step->cols, error);
  if (out[PART_ROWS] == NULL)
    return NULL;
  /* The scales: a row of them per row, on the rows' sizes. */
  if (fp8)
    {
      out[PART_SCALES] = gmlp_grouped_tensor_new_blocked (out[PART_ROWS],
                                                          gmlp_grouped_tensor_get_dtype (part[PART_SCALES]),
                                                          1, gmlp_grouped_tensor_get_cols (part[PART_SCALES]),
                                                          NULL, error);
      if (out[PART_SCALES] == NULL)
        return NULL;
    }
  for (i = 0; i < n_parts; i++)
    if (!move (step->recv_counts, step, -1, recv[i],
               exact ? GMLP_CHUNK_LAYOUT_PACKED : GMLP_CHUNK_LAYOUT_SLOTS, out[i],
               GMLP_CHUNK_LAYOUT_MEMBERS_BY_B,
               first && i == PART_ROWS ? GMLP_MOVE_ROWS_SET_SIZES : GMLP_MOVE_ROWS_NONE,
               NULL, NULL, error))
      return NULL;
  if (!fp8)
    return g_steal_pointer (&out[PART_ROWS]);
  gmlp_grouped_tensor_set_quantized (out[PART_ROWS], gmlp_quantizer_get_recipe (self->dispatch_quantizer),
                                     gmlp_grouped_tensor_get_quantize_flags (q), out[PART_SCALES],
                                     NULL, FALSE);
  return gmlp_grouped_tensor_dequantize (out[PART_ROWS], dtype, error);
}

/* Rows in the local experts' layout back to their ranks' permuted layout;
 * in graph-safe mode the rows a slot dropped come back as zeros. */
GmlpGroupedTensor *
gmlp_moe_parallel_return_trip (Trip                 *trip,
                               GmlpMoEParallelStep  *step,
                               GmlpGroupedTensor    *rows,
                               GError              **error)
{
  GmlpMoELayer *self = trip->layer;
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (rows);
  gboolean exact = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT;
  GmlpChunkLayout buffers = exact ? GMLP_CHUNK_LAYOUT_PACKED : GMLP_CHUNK_LAYOUT_SLOTS;
  g_autoptr(GmlpGroupedTensor) send = NULL, recv = NULL, out = NULL;

  send = gmlp_moe_parallel_new_buffer (self, step, dtype, step->total_recv, step->cols, error);
  if (send == NULL ||
      !move (step->recv_counts, step, -1, rows, GMLP_CHUNK_LAYOUT_MEMBERS_BY_B, send, buffers,
             GMLP_MOVE_ROWS_NONE, NULL, NULL, error))
    return NULL;
  out = gmlp_grouped_tensor_new_with_device_sizes (self->device, dtype, step->sizes,
                                                   step->row_capacity, step->cols, error);
  if (out == NULL)
    return NULL;
  /* Received in place where the permuted layout is the packed one. */
  recv = gmlp_moe_parallel_packed_view (step, out);
  if (recv != NULL)
    return exchange (trip, step, send, recv, TRUE, NULL, error) ? g_steal_pointer (&out) : NULL;
  recv = gmlp_moe_parallel_new_buffer (self, step, dtype, step->total_send, step->cols, error);
  if (recv == NULL || !exchange (trip, step, send, recv, TRUE, NULL, error) ||
      !move (exact ? step->sizes : step->kept, step, -1, recv, buffers, out,
             GMLP_CHUNK_LAYOUT_MEMBERS, exact ? GMLP_MOVE_ROWS_NONE : GMLP_MOVE_ROWS_ZERO_REST,
             NULL, NULL, error))
    return NULL;
  return g_steal_pointer (&out);
}

/* Exact mode: every rank's rows per expert, gathered and read on the host
 * (the forward's one wait for the device), give the splits of the
 * all-to-alls and the counts this rank's experts receive. */
gboolean
gmlp_moe_parallel_exact_counts (Trip                 *trip,
                                GmlpMoEParallelStep  *step,
                                GError              **error)
{
  GmlpMoELayer *self = trip->layer;
  int w = step->world, r = gmlp_communicator_get_rank (self->communicator), a;
  guint l = step->n_local, e = self->n_experts, b;
  g_autofree gint64 *rows = g_new (gint64, w), *all = NULL, *received = NULL;
  g_autoptr(GmlpGroupedTensor) gathered = NULL;

  for (a = 0; a < w; a++)
    rows[a] = e;
  gathered = gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_INT64, rows, w, 1, error);
  if (gathered == NULL ||
      !collective (trip, gmlp_communicator_all_gather (self->communicator, step->sizes, gathered,
                                                       error)))
    return FALSE;
  all = gmlp_grouped_tensor_to_ints (gathered, NULL, error);
  if (all == NULL)
    return FALSE;

  step->send_rows = g_new0 (gint64, w);
  step->recv_rows = g_new0 (gint64, w);
  step->send_grid = g_new (gint64, (gsize) w * l);
  received = g_new (gint64, (gsize) w * l);
  for (a = 0; a < w; a++)
    for (b = 0; b < l; b++)
      {
        gint64 out = all[(gsize) r * e + a * l + b];            /* to rank a's expert b */
        gint64 in = all[(gsize) a * e + r * l + b];             /* from rank a to my expert b */

        step->send_rows[a] += out;
        step->recv_rows[a] += in;
        step->send_grid[a * l + b] = out;
        received[a * l + b] = in;
        step->total_send += out;
        step->total_recv += in;
      }
  rows[0] = (gint64) w * l;
  step->recv_counts = gmlp_grouped_tensor_new_from_ints (self->device, GMLP_DTYPE_INT64, rows, 1, 1,
                                                         received, (gsize) w * l, error);
  step->recv_grid = g_steal_pointer (&received);
  step->expert_rows = step->total_recv;
  return step->recv_counts != NULL;
}

/* Graph-safe mode: the rows of a slot, from the host's values alone. */
static gint64
slot_rows (GmlpMoELayer *self,
           GmlpRouting  *routing)
{
  guint64 n_choices = (guint64) gmlp_routing_get_n_tokens (routing) * self->top_k;
  guint64 padding = MAX (self->padding, 1), cap = n_choices;

  if (self->capacity_factor > 0.0)
    return routing->expert_capacity;
  if (self->expert_capacity_factor > 0.0)
    {
      double per = ceil (self->expert_capacity_factor * (double) n_choices / self->n_experts);

      cap = per >= (double) n_choices ? n_choices : (guint64) per;
    }
  return (gint64) ((cap + padding - 1) / padding * padding);
}

gboolean
gmlp_moe_parallel_graph_safe_counts (GmlpMoEParallelStep  *step,
                                     GmlpMoELayer         *self,
                                     GmlpRouting          *routing,
                                     GError              **error)
{
  gint64 n = (gint64) step->world * step->n_local;
  guint64 rows;

  step->slot_rows = slot_rows (self, routing);
  if (!gmlp_checked_mul ((guint64) n, (guint64) step->slot_rows, &rows) || rows > G_MAXINT64)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Slots of %" G_GINT64_FORMAT " rows for %" G_GINT64_FORMAT " experts are too "
                   "many rows", step->slot_rows, n);
      return FALSE;
    }
  step->expert_rows = step->total_send = step->total_recv = (gint64) rows;
  step->kept = new_counts (self, n, error);
  if (step->kept == NULL)
    return FALSE;
  step->recv_counts = new_counts (self, n, error);
  return step->recv_counts != NULL;
}
