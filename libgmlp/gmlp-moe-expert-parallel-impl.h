/* gmlp-moe-expert-parallel-impl.h: what the files of the expert-parallel
 * step share
 *
 * The experts' step over the ranks is three files, one job each, each
 * calling only those below it:
 *
 * - gmlp-moe-expert-parallel.c: the step's entry points, forward and
 *   backward, which run the step in one chunk or pipelined;
 * - gmlp-moe-expert-parallel-chunks.c: the pipeline of several chunks of
 *   local experts (expert-parallel-chunks);
 * - gmlp-moe-expert-parallel-trips.c: the trips of the rows: the step's
 *   counts, the buffers and the all-to-alls, and the dispatch and the
 *   return trip of one chunk.
 *
 * No other file includes it: the layer's view of the step is
 * gmlp-moe-expert-parallel-private.h.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-moe-layer-impl.h"
#include "gmlp-moe-expert-parallel-private.h"
#include "gmlp-row-chunks-private.h"

G_BEGIN_DECLS

struct _GmlpMoEParallelStep
{
  GmlpExpertParallelMode  mode;
  int                     world;
  guint                   n_local;
  gint64                  cols;
  /* The permuted layout: rows per expert (E values, the chunks' counts on
   * the way out) and its row capacity. */
  GmlpGroupedTensor      *sizes;
  gint64                  row_capacity;
  /* W × L: what each chunk (rank a, local expert b) kept in its slot
   * (graph-safe; the counts on the way back), and what came from rank a
   * for local expert b. */
  GmlpGroupedTensor      *kept;
  GmlpGroupedTensor      *recv_counts;
  /* The local experts' input: L sizes, its row capacity. */
  GmlpGroupedTensor      *expert_sizes;
  gint64                  expert_rows;
  /* graph-safe: the rows of a slot */
  gint64                  slot_rows;
  /* exact, on the host: the rows to and from each rank, and their sums;
   * per chunk (a, b) of the W × L grid, the rows to rank a's expert b and
   * from rank a for local expert b */
  gint64                 *send_rows;
  gint64                 *recv_rows;
  gint64                 *send_grid;
  gint64                 *recv_grid;
  gint64                  total_send;
  gint64                  total_recv;
  /* The forward's chunks of local experts (expert-parallel-chunks); a
   * backward takes the same. */
  guint                   n_chunks;
};

/* One step's calls: a local failure once a collective was entered fails
 * the group (gmlp_communicator_abort()), so that the other ranks, which
 * wait in the next collective, get GMLP_ERROR_ABORTED at once instead of
 * at the timeout; a collective's own failure every rank sees already. */
typedef struct {
  GmlpMoELayer  *layer;
  gboolean       entered;
  gboolean       collective_failed;
} Trip;

static inline gboolean
collective (Trip     *trip,
            gboolean  ok)
{
  trip->entered = TRUE;
  trip->collective_failed = !ok;
  return ok;
}

/* gmlp_row_chunks_move() over the step's W × L grid. */
static inline gboolean
move (GmlpGroupedTensor  *counts,
      GmlpMoEParallelStep *step,
      gint64              max_chunk_rows,
      GmlpGroupedTensor  *src,
      GmlpChunkLayout     src_layout,
      GmlpGroupedTensor  *dst,
      GmlpChunkLayout     dst_layout,
      GmlpMoveRowsFlags   flags,
      GmlpGroupedTensor  *kept,
      GmlpGroupedTensor  *dropped,
      GError            **error)
{
  GmlpChunkSide from = { src, src_layout }, to = { dst, dst_layout };

  return gmlp_row_chunks_move (counts, (guint) step->world, step->n_local, max_chunk_rows, &from,
                               &to, flags, kept, dropped, error);
}

/* A new INT64 tensor of one group of @n counts. */
static inline GmlpGroupedTensor *
new_counts (GmlpMoELayer  *self,
            gint64         n,
            GError       **error)
{
  return gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_INT64, &n, 1, 1, error);
}

/* What a dispatch sends: the rows, and with an FP8 dispatch their scales,
 * which are rows too (one per row: 1 × 128 or 1 × 32 blocks) and travel
 * with the same counts and layouts. */
enum { PART_ROWS, PART_SCALES, N_PARTS };

/* gmlp-moe-expert-parallel-trips.c */
gboolean           gmlp_moe_parallel_exact_counts      (Trip                    *trip,
                                                        GmlpMoEParallelStep     *step,
                                                        GError                 **error);
gboolean           gmlp_moe_parallel_graph_safe_counts (GmlpMoEParallelStep     *step,
                                                        GmlpMoELayer            *self,
                                                        GmlpRouting             *routing,
                                                        GError                 **error);
GmlpGroupedTensor *gmlp_moe_parallel_new_buffer        (GmlpMoELayer            *self,
                                                        GmlpMoEParallelStep     *step,
                                                        GmlpDType                dtype,
                                                        gint64                   rows,
                                                        gint64                   cols,
                                                        GError                 **error);
GmlpGroupedTensor *gmlp_moe_parallel_packed_view       (GmlpMoEParallelStep     *step,
                                                        GmlpGroupedTensor       *members);
gboolean           gmlp_moe_parallel_join              (GmlpMoELayer            *self,
                                                        GPtrArray               *events,
                                                        GError                 **error);
GmlpGroupedTensor *gmlp_moe_parallel_pack              (Trip                    *trip,
                                                        GmlpMoEParallelStep     *step,
                                                        GmlpGroupedTensor       *part,
                                                        gboolean                 count,
                                                        GmlpGroupedTensor       *dropped,
                                                        GError                 **error);
gboolean           gmlp_moe_parallel_exchange_kept     (Trip                    *trip,
                                                        GmlpMoEParallelStep     *step,
                                                        GError                 **error);
GmlpGroupedTensor *gmlp_moe_parallel_dispatch          (Trip                    *trip,
                                                        GmlpMoEParallelStep     *step,
                                                        GmlpGroupedTensor       *rows,
                                                        gboolean                 first,
                                                        GmlpGroupedTensor       *dropped,
                                                        GmlpMoEParallelOverlap   overlap,
                                                        gpointer                 overlap_data,
                                                        GError                 **error);
GmlpGroupedTensor *gmlp_moe_parallel_return_trip       (Trip                    *trip,
                                                        GmlpMoEParallelStep     *step,
                                                        GmlpGroupedTensor       *rows,
                                                        GError                 **error);

/* gmlp-moe-expert-parallel-chunks.c */
GmlpGroupedTensor *gmlp_moe_parallel_forward_chunked   (Trip                    *trip,
                                                        GmlpMoEParallelStep     *step,
                                                        GmlpGroupedTensor       *permuted,
                                                        guint                    n_chunks,
                                                        GmlpSavedActivations   **saved,
                                                        GmlpGroupedTensor       *dropped,
                                                        GmlpMoEParallelOverlap   overlap,
                                                        gpointer                 overlap_data,
                                                        GError                 **error);
GmlpGroupedTensor *gmlp_moe_parallel_backward_chunked  (Trip                    *trip,
                                                        GmlpMoEParallelStep     *step,
                                                        GmlpSavedActivations    *saved,
                                                        GmlpGroupedTensor       *grad_output,
                                                        GmlpMoEParallelOverlap   overlap,
                                                        gpointer                 overlap_data,
                                                        GError                 **error);

G_END_DECLS
