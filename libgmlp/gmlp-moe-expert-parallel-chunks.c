/* gmlp-moe-expert-parallel-chunks.c: the expert-parallel step pipelined
 * by chunks of local experts
 *
 * The pipeline of a forward and a backward (expert-parallel-chunks):
 * chunk c is the run of local experts [b0, b1),
 * every rank's rows for them. Chunking by whole experts keeps each
 * expert's rows in one product (the experts' calls see the chunk's groups,
 * the rest empty), as large as unchunked and with the same bits, and each
 * chunk a contiguous span of every peer's block in the trips' buffers, so
 * that the rows are packed once and sent by spans:
 *
 *   pack (one move) -> start every chunk's dispatch (communication stream)
 *   -> the caller's overlap -> per chunk: wait for its rows, unpack, the
 *   experts, pack its outputs, start its return -> wait for the returns,
 *   unpack (one move).
 *
 * Training: each chunk's experts save their own activations (their input
 * has rows in the chunk's groups only), and the backward runs the same
 * pipeline on the gradients through gmlp_grouped_mlp_backward_chunks():
 * the input gradients chunk by chunk, then one weight-gradient computation
 * per layer whose chunk c products have rows in chunk c's groups only and
 * leave the other groups' gradients as they are (accumulate, no rows), so
 * that every expert's gradient is its one product and the contract's
 * events and counts are those of one backward: the same products as
 * unchunked, from the same rows in the same order, the same bits.
 *
 * Exact mode receives each chunk into a buffer of its own (the packed
 * layout of its rows alone) and sends it back from another; graph-safe
 * mode's slots sit where they are whatever the counts, so its chunks share
 * the trips' full slot buffers. The moves of a chunk take the step's
 * counts with every other chunk's zeroed.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-moe-expert-parallel-impl.h"
#include "gmlp-communicator-private.h"
#include "gmlp-device-private.h"
#include "gmlp-grouped-mlp-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-numeric.h"
#include "gmlp-quantizer-private.h"
#include "gmlp-saved-activations-private.h"

/* Chunk c of @n_chunks of the @n_local experts. */
static void
chunk_experts (guint  n_local,
               guint  n_chunks,
               guint  c,
               guint *b0,
               guint *b1)
{
  *b0 = (guint) ((guint64) c * n_local / n_chunks);
  *b1 = (guint) ((guint64) (c + 1) * n_local / n_chunks);
}

/* Exact mode: the rows of chunk [b0, b1) in a W × L grid of counts. */
static gint64
chunk_rows (GmlpMoEParallelStep *step,
            const gint64        *grid,
            guint                b0,
            guint                b1)
{
  gint64 n = 0;
  guint b;
  int a;

  for (a = 0; a < step->world; a++)
    for (b = b0; b < b1; b++)
      n += grid[(gsize) a * step->n_local + b];
  return n;
}

/* Where chunk [b0, b1) lies in a trip's buffer, peer by peer (a: the
 * rank the block goes to or comes from), in bytes: graph-safe, the slots
 * a L + b0 ... a L + b1 - 1; exact, its rows in a buffer packed in (a, b)
 * order by @grid, all of them (@dense FALSE) or the chunk's alone. */
static void
chunk_spans (GmlpMoEParallelStep *step,
             const gint64        *grid,
             gboolean             dense,
             guint                b0,
             guint                b1,
             gsize                row_bytes,
             gsize               *offsets,
             gsize               *bytes)
{
  guint l = step->n_local, b;
  gint64 at = 0;
  int a;

  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
    {
      gsize stride = gmlp_num_member_stride (step->slot_rows, row_bytes);

      for (a = 0; a < step->world; a++)
        {
          offsets[a] = ((gsize) a * l + b0) * stride;
          bytes[a] = (gsize) (b1 - b0) * stride;
        }
      return;
    }
  for (a = 0; a < step->world; a++)
    {
      gint64 n = 0;

      for (b = 0; b < l; b++)
        {
          gboolean in = b >= b0 && b < b1;

          if (b == b0)
            offsets[a] = (gsize) at * row_bytes;
          if (in)
            n += grid[(gsize) a * l + b];
          if (in || !dense)
            at += grid[(gsize) a * l + b];
        }
      bytes[a] = (gsize) n * row_bytes;
    }
}

/* @counts (W × L values on the device) with the chunks (a, b) outside
 * [b0, b1) zero: what chunk [b0, b1)'s moves take. */
static GmlpGroupedTensor *
chunk_counts (GmlpMoELayer         *self,
              GmlpMoEParallelStep  *step,
              GmlpGroupedTensor    *counts,
              guint                 b0,
              guint                 b1,
              GError              **error)
{
  g_autoptr(GmlpGroupedTensor) masked = NULL;
  guint l = step->n_local;
  int a;

  masked = new_counts (self, (gint64) step->world * l, error);
  if (masked == NULL || !gmlp_grouped_tensor_fill_zero (masked, error))
    return NULL;
  for (a = 0; a < step->world; a++)
    {
      gsize at = ((gsize) a * l + b0) * sizeof (gint64);

      if (!GMLP_DEVICE_CALL (self->device, copy, (guint8 *) gmlp_grouped_tensor_get_data (masked) + at,
                             (const guint8 *) gmlp_grouped_tensor_get_data (counts) + at,
                             (gsize) (b1 - b0) * sizeof (gint64), error))
        return NULL;
    }
  return g_steal_pointer (&masked);
}

/* What the pipeline's communication stream may still touch, and the events
 * of its all-to-alls: both outlive the pipeline's work until joined. */
typedef struct {
  GPtrArray *keep;
  GPtrArray *events;
} InFlight;

/* One chunk's all-to-all, by spans; the event kept. */
static gboolean
send_chunk (Trip                 *trip,
            InFlight             *flight,
            GmlpGroupedTensor    *send,
            const gsize          *send_spans,
            GmlpGroupedTensor    *recv,
            const gsize          *recv_spans,
            GError              **error)
{
  int w = gmlp_communicator_get_world_size (trip->layer->communicator);
  GmlpEvent *done = NULL;

  g_ptr_array_add (flight->keep, g_object_ref (send));
  g_ptr_array_add (flight->keep, g_object_ref (recv));
  if (!collective (trip, gmlp_communicator_all_to_all_spans_full (trip->layer->communicator,
                                                                  send, send_spans, send_spans + w,
                                                                  recv, recv_spans, recv_spans + w,
                                                                  &done, error)))
    return FALSE;
  g_ptr_array_add (flight->events, done);
  return TRUE;
}

/* The compute stream waits for event @i and those before it (one stream's
 * events complete in order). */
static gboolean
wait_sent (GmlpMoELayer  *self,
           InFlight      *flight,
           guint          i,
           GError       **error)
{
  return gmlp_event_wait_on_device (g_ptr_array_index (flight->events, i), self->device, error);
}

/* A pipeline's state: the trip out (its parts, their receive buffers and
 * the events of their chunks), the trip back (its buffers). */
typedef struct {
  Trip                 *trip;
  GmlpMoEParallelStep  *step;
  InFlight              flight;
  guint                 n_chunks;
  /* The forward's dispatch: it counts, sends FP8 with a dispatch
   * quantizer, and (graph-safe) sends what each slot kept. */
  gboolean              first;
  GmlpDType             dtype;
  GmlpGroupedTensor    *q;
  GmlpGroupedTensor    *part[N_PARTS];
  guint                 n_parts;
  GmlpGroupedTensor   **recv;           /* n_chunks × N_PARTS, held by flight.keep */
  guint                *arrived;
  gsize                *spans;
  GmlpGroupedTensor    *back_send;      /* graph-safe: the return's slots */
  GmlpGroupedTensor    *back_recv;
  GmlpGroupedTensor    *out;
  gboolean              in_place;
} Pipe;

static void
pipe_init (Pipe                 *pipe,
           Trip                 *trip,
           GmlpMoEParallelStep  *step,
           guint                 n_chunks,
           gboolean              first)
{
  *pipe = (Pipe) { trip, step, { g_ptr_array_new_with_free_func (g_object_unref),
                                 g_ptr_array_new_with_free_func (g_object_unref) },
                   n_chunks, first, };
  pipe->recv = g_new0 (GmlpGroupedTensor *, (gsize) n_chunks * N_PARTS);
  pipe->arrived = g_new0 (guint, n_chunks);
  pipe->spans = g_new (gsize, 4 * step->world);
}

/* Whatever happened, nothing is let go with rows in flight. */
static void
pipe_clear (Pipe *pipe)
{
  gmlp_moe_parallel_join (pipe->trip->layer, pipe->flight.events, NULL);
  g_ptr_array_unref (pipe->flight.events);
  g_ptr_array_unref (pipe->flight.keep);
  g_clear_object (&pipe->q);
  g_clear_object (&pipe->back_send);
  g_clear_object (&pipe->back_recv);
  g_clear_object (&pipe->out);
  g_free (pipe->recv);
  g_free (pipe->arrived);
  g_free (pipe->spans);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Pipe, pipe_clear)

/* Packs @rows (the permuted layout) and starts every chunk's trip out: the
 * communication stream sends them one after the other while the experts
 * work through the chunks. Then the trip back's buffers. */
static gboolean
pipe_start (Pipe               *pipe,
            GmlpGroupedTensor  *rows,
            GmlpGroupedTensor  *dropped,
            GError            **error)
{
  GmlpMoEParallelStep *step = pipe->step;
  GmlpMoELayer *self = pipe->trip->layer;
  gboolean exact = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT;
  int w = step->world;
  guint i, c, b0, b1;

  pipe->dtype = gmlp_grouped_tensor_get_dtype (rows);
  pipe->part[PART_ROWS] = rows;
  pipe->n_parts = 1;
  if (pipe->first && self->dispatch_quantizer != NULL)
    {
      pipe->q = gmlp_quantizer_quantize_full (self->dispatch_quantizer, rows, FALSE, error);
      if (pipe->q == NULL)
        return FALSE;
      pipe->part[PART_ROWS] = pipe->q;
      pipe->part[PART_SCALES] = gmlp_grouped_tensor_get_scale_inv (pipe->q);
      pipe->n_parts = N_PARTS;
    }
  for (i = 0; i < pipe->n_parts; i++)
    {
      GmlpGroupedTensor *send = gmlp_moe_parallel_pack (pipe->trip, step, pipe->part[i],
                                                        pipe->first && i == PART_ROWS, dropped, error);

      if (send == NULL)
        return FALSE;
      g_ptr_array_add (pipe->flight.keep, send);
    }
  if (pipe->first && !exact && !gmlp_moe_parallel_exchange_kept (pipe->trip, step, error))
    return FALSE;

  for (c = 0; c < pipe->n_chunks; c++)
    {
      chunk_experts (step->n_local, pipe->n_chunks, c, &b0, &b1);
      for (i = 0; i < pipe->n_parts; i++)
        {
          GmlpGroupedTensor *part = pipe->part[i];
          gsize row_bytes = (gsize) gmlp_grouped_tensor_get_cols (part) *
                            gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (part));
          GmlpGroupedTensor **r = &pipe->recv[c * N_PARTS + i];

          if (exact || c == 0)
            {
              *r = gmlp_moe_parallel_new_buffer (self, step, gmlp_grouped_tensor_get_dtype (part),
                                                 exact ? chunk_rows (step, step->recv_grid, b0, b1)
                                                       : step->total_recv,
                                                 gmlp_grouped_tensor_get_cols (part), error);
              if (*r == NULL)
                return FALSE;
              g_ptr_array_add (pipe->flight.keep, *r);
            }
          else
            *r = pipe->recv[i];
          chunk_spans (step, step->send_grid, FALSE, b0, b1, row_bytes, pipe->spans, pipe->spans + w);
          chunk_spans (step, step->recv_grid, TRUE, b0, b1, row_bytes, pipe->spans + 2 * w,
                       pipe->spans + 3 * w);
          /* The send buffers are the first n_parts of flight.keep. */
          if (!send_chunk (pipe->trip, &pipe->flight, g_ptr_array_index (pipe->flight.keep, i),
                           pipe->spans, *r, pipe->spans + 2 * w, error))
            return FALSE;
        }
      pipe->arrived[c] = pipe->flight.events->len - 1;
    }
  return TRUE;
}

/* The trip back's buffers (in place where the permuted layout is the
 * packed one). */
static gboolean
pipe_back (Pipe    *pipe,
           GError **error)
{
  GmlpMoEParallelStep *step = pipe->step;
  GmlpMoELayer *self = pipe->trip->layer;

  pipe->out = gmlp_grouped_tensor_new_with_device_sizes (self->device, pipe->dtype, step->sizes,
                                                         step->row_capacity, step->cols, error);
  if (pipe->out == NULL)
    return FALSE;
  pipe->back_recv = gmlp_moe_parallel_packed_view (step, pipe->out);
  pipe->in_place = pipe->back_recv != NULL;
  if (!pipe->in_place)
    pipe->back_recv = gmlp_moe_parallel_new_buffer (self, step, pipe->dtype, step->total_send,
                                                    step->cols, error);
  if (pipe->back_recv == NULL)
    return FALSE;
  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
    {
      pipe->back_send = gmlp_moe_parallel_new_buffer (self, step, pipe->dtype, step->total_recv,
                                                      step->cols, error);
      if (pipe->back_send == NULL)
        return FALSE;
    }
  return TRUE;
}

static gint64
pipe_in_rows (Pipe  *pipe,
              guint  b0,
              guint  b1)
{
  GmlpMoEParallelStep *step = pipe->step;

  return step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT ? chunk_rows (step, step->recv_grid, b0, b1)
                                                       : (gint64) step->world * (b1 - b0) * step->slot_rows;
}

/* Chunk c's rows, once arrived, in its experts' input layout: its groups,
 * the others empty (sizes of its own, written by the move: a backward's
 * are its forward's). FP8: dequantized. */
static GmlpGroupedTensor *
pipe_in (Pipe    *pipe,
         guint    c,
         GError **error)
{
  GmlpMoEParallelStep *step = pipe->step;
  GmlpMoELayer *self = pipe->trip->layer;
  GmlpChunkLayout buffers = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT ? GMLP_CHUNK_LAYOUT_PACKED
                                                                          : GMLP_CHUNK_LAYOUT_SLOTS;
  g_autoptr(GmlpGroupedTensor) counts = NULL, sizes = NULL, rows = NULL, scales = NULL;
  guint i, b0, b1;

  chunk_experts (step->n_local, pipe->n_chunks, c, &b0, &b1);
  counts = chunk_counts (self, step, step->recv_counts, b0, b1, error);
  sizes = new_counts (self, step->n_local, error);
  if (counts == NULL || sizes == NULL || !wait_sent (self, &pipe->flight, pipe->arrived[c], error))
    return NULL;

  rows = gmlp_grouped_tensor_new_with_device_sizes (self->device,
                                                    gmlp_grouped_tensor_get_dtype (pipe->part[PART_ROWS]),
                                                    sizes, pipe_in_rows (pipe, b0, b1), step->cols, error);
  if (rows == NULL)
    return NULL;
  if (pipe->n_parts > 1)
    {
      scales = gmlp_grouped_tensor_new_blocked (rows, gmlp_grouped_tensor_get_dtype (pipe->part[PART_SCALES]),
                                                1, gmlp_grouped_tensor_get_cols (pipe->part[PART_SCALES]),
                                                NULL, error);
      if (scales == NULL)
        return NULL;
    }
  for (i = 0; i < pipe->n_parts; i++)
    if (!move (counts, step, -1, pipe->recv[c * N_PARTS + i], buffers, i == PART_ROWS ? rows : scales,
               GMLP_CHUNK_LAYOUT_MEMBERS_BY_B,
               i == PART_ROWS ? GMLP_MOVE_ROWS_SET_SIZES : GMLP_MOVE_ROWS_NONE, NULL, NULL, error))
      return NULL;
  if (pipe->n_parts == 1)
    return g_steal_pointer (&rows);
  gmlp_grouped_tensor_set_quantized (rows, gmlp_quantizer_get_recipe (self->dispatch_quantizer),
                                     gmlp_grouped_tensor_get_quantize_flags (pipe->q), scales, NULL, FALSE);
  return gmlp_grouped_tensor_dequantize (rows, pipe->dtype, error);
}

/* Chunk c's outputs start back while the next chunk computes. */
static gboolean
pipe_out (Pipe               *pipe,
          guint               c,
          GmlpGroupedTensor  *expert_out,
          GError            **error)
{
  GmlpMoEParallelStep *step = pipe->step;
  GmlpMoELayer *self = pipe->trip->layer;
  gboolean exact = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT;
  gsize row_bytes = (gsize) step->cols * gmlp_dtype_get_size (pipe->dtype);
  g_autoptr(GmlpGroupedTensor) counts = NULL, send = NULL;
  int w = step->world;
  guint b0, b1;

  chunk_experts (step->n_local, pipe->n_chunks, c, &b0, &b1);
  counts = chunk_counts (self, step, step->recv_counts, b0, b1, error);
  send = exact ? gmlp_moe_parallel_new_buffer (self, step, pipe->dtype, pipe_in_rows (pipe, b0, b1),
                                               step->cols, error)
               : g_object_ref (pipe->back_send);
  if (counts == NULL || send == NULL ||
      !move (counts, step, -1, expert_out, GMLP_CHUNK_LAYOUT_MEMBERS_BY_B, send,
             exact ? GMLP_CHUNK_LAYOUT_PACKED : GMLP_CHUNK_LAYOUT_SLOTS, GMLP_MOVE_ROWS_NONE,
             NULL, NULL, error))
    return FALSE;
  chunk_spans (step, step->recv_grid, TRUE, b0, b1, row_bytes, pipe->spans, pipe->spans + w);
  chunk_spans (step, step->send_grid, FALSE, b0, b1, row_bytes, pipe->spans + 2 * w, pipe->spans + 3 * w);
  return send_chunk (pipe->trip, &pipe->flight, send, pipe->spans, pipe->back_recv, pipe->spans + 2 * w,
                     error);
}

/* Every chunk back: into the permuted layout (in graph-safe mode the rows
 * a slot dropped as zeros). */
static GmlpGroupedTensor *
pipe_end (Pipe    *pipe,
          GError **error)
{
  GmlpMoEParallelStep *step = pipe->step;
  gboolean exact = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT;

  if (!wait_sent (pipe->trip->layer, &pipe->flight, pipe->flight.events->len - 1, error))
    return NULL;
  if (!pipe->in_place &&
      !move (exact ? step->sizes : step->kept, step, -1, pipe->back_recv,
             exact ? GMLP_CHUNK_LAYOUT_PACKED : GMLP_CHUNK_LAYOUT_SLOTS, pipe->out,
             GMLP_CHUNK_LAYOUT_MEMBERS, exact ? GMLP_MOVE_ROWS_NONE : GMLP_MOVE_ROWS_ZERO_REST,
             NULL, NULL, error))
    return NULL;
  return g_steal_pointer (&pipe->out);
}

/* The forward by chunks; saving (@saved given), each chunk's experts save
 * their own activations, children of one set in chunk order, which the
 * backward takes chunk by chunk (gmlp_moe_parallel_backward_chunked()). */
GmlpGroupedTensor *
gmlp_moe_parallel_forward_chunked (Trip                    *trip,
                                   GmlpMoEParallelStep     *step,
                                   GmlpGroupedTensor       *permuted,
                                   guint                    n_chunks,
                                   GmlpSavedActivations   **saved,
                                   GmlpGroupedTensor       *dropped,
                                   GmlpMoEParallelOverlap   overlap,
                                   gpointer                 overlap_data,
                                   GError                 **error)
{
  g_auto(Pipe) pipe;
  g_autoptr(GmlpSavedActivations) all = saved != NULL ? gmlp_saved_activations_new (0) : NULL;
  GmlpGroupedTensor *out;
  guint c;

  pipe_init (&pipe, trip, step, n_chunks, TRUE);
  if (!pipe_start (&pipe, permuted, dropped, error) ||
      (overlap != NULL && !overlap (overlap_data, error)) ||
      !pipe_back (&pipe, error))
    return NULL;
  for (c = 0; c < n_chunks; c++)
    {
      g_autoptr(GmlpGroupedTensor) expert_in = pipe_in (&pipe, c, error), expert_out = NULL;
      g_autoptr(GmlpSavedActivations) chunk_saved = NULL;

      if (expert_in == NULL)
        return NULL;
      expert_out = gmlp_grouped_mlp_forward (trip->layer->experts, expert_in,
                                             saved != NULL ? &chunk_saved : NULL, error);
      if (expert_out == NULL || !pipe_out (&pipe, c, expert_out, error))
        return NULL;
      if (all != NULL)
        gmlp_saved_activations_add_child (all, chunk_saved);
    }
  out = pipe_end (&pipe, error);
  if (out != NULL && saved != NULL)
    *saved = g_steal_pointer (&all);
  return out;
}

static GmlpGroupedTensor *
hook_grad_output (gpointer   data,
                  guint      c,
                  GError   **error)
{
  return pipe_in (data, c, error);
}

static gboolean
hook_grad_input (gpointer            data,
                 guint               c,
                 GmlpGroupedTensor  *grad_input,
                 GError            **error)
{
  return pipe_out (data, c, grad_input, error);
}

/* The backward of gmlp_moe_parallel_forward_chunked(): the output gradients travel by the
 * same chunks and the experts' input gradients of chunk c start back while
 * chunk c + 1 computes. The experts' weight gradients come last, one
 * computation per layer over every chunk's rows (each chunk's products
 * write its own experts' gradients only): the gradient contract's, as
 * unchunked. */
GmlpGroupedTensor *
gmlp_moe_parallel_backward_chunked (Trip                    *trip,
                                    GmlpMoEParallelStep     *step,
                                    GmlpSavedActivations    *saved,
                                    GmlpGroupedTensor       *grad_output,
                                    GmlpMoEParallelOverlap   overlap,
                                    gpointer                 overlap_data,
                                    GError                 **error)
{
  g_auto(Pipe) pipe;
  g_autofree GmlpSavedActivations **chunks = g_new (GmlpSavedActivations *, step->n_chunks);
  g_autofree guint *bounds = g_new (guint, step->n_chunks + 1);
  GmlpMLPChunkHooks hooks = { hook_grad_output, hook_grad_input, &pipe };
  guint c, b0, b1;

  for (c = 0; c < step->n_chunks; c++)
    {
      chunks[c] = gmlp_saved_activations_get_child (saved, c);
      chunk_experts (step->n_local, step->n_chunks, c, &b0, &b1);
      bounds[c] = b0;
      bounds[c + 1] = b1;
    }
  pipe_init (&pipe, trip, step, step->n_chunks, FALSE);
  if (!pipe_start (&pipe, grad_output, NULL, error) ||
      (overlap != NULL && !overlap (overlap_data, error)) ||
      !pipe_back (&pipe, error) ||
      !gmlp_grouped_mlp_backward_chunks (trip->layer->experts, chunks, bounds, step->n_chunks, &hooks,
                                         error))
    return NULL;
  return pipe_end (&pipe, error);
}
