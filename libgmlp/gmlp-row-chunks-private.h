/* gmlp-row-chunks-private.h: chunks of rows whose counts are only on the
 * device, moved between layouts
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * An expert-parallel MoE layer moves each expert's rows to the expert's
 * rank and back without the host knowing how many there are: a grid of
 * n_a × n_b chunks (a: a rank, b: one of its experts), chunk (a, b) of
 * counts[a × n_b + b] rows, is taken from one layout and written into
 * another, in one stream-ordered call that reads the counts on the device.
 */

#pragma once

#include "gmlp-grouped-tensor.h"

G_BEGIN_DECLS

/* Where chunk (a, b) of an n_a × n_b grid lies in a tensor:
 *   SLOTS         a tensor of n_a × n_b groups of equal host sizes (the
 *                 slots): chunk (a, b) at the start of group a × n_b + b;
 *                 a chunk keeps at most the slot's rows (the rest drop)
 *   PACKED        a tensor of one group (host size): the chunks back to
 *                 back in (a, b) order, from its first row
 *   MEMBERS       a tensor of n_a × n_b groups with device sizes: chunk
 *                 (a, b) at the start of group a × n_b + b
 *   MEMBERS_BY_B  a tensor of n_b groups with device sizes: chunk (a, b) in
 *                 group b, after the chunks (a' < a, b)
 * A chunk never reaches past a group (MEMBERS*) or past the tensor's rows
 * (PACKED): what would is dropped, and counted. */
typedef enum {
  GMLP_CHUNK_LAYOUT_SLOTS,
  GMLP_CHUNK_LAYOUT_PACKED,
  GMLP_CHUNK_LAYOUT_MEMBERS,
  GMLP_CHUNK_LAYOUT_MEMBERS_BY_B,
} GmlpChunkLayout;

typedef enum {
  GMLP_MOVE_ROWS_NONE      = 0,
  /* MEMBERS* destination: its device sizes become the chunks' rows (kept
   * counts; for MEMBERS_BY_B group b gets Σ_a of them), written by the
   * same call; without it the destination's own sizes place the groups. */
  GMLP_MOVE_ROWS_SET_SIZES = 1 << 0,
  /* MEMBERS* destination: the rows of each group that no chunk writes
   * become zeros (a combine's dropped rows). */
  GMLP_MOVE_ROWS_ZERO_REST = 1 << 1,
} GmlpMoveRowsFlags;

typedef struct {
  GmlpGroupedTensor  *tensor;
  GmlpChunkLayout     layout;
} GmlpChunkSide;

/* Moves every chunk (a, b): counts[a × n_b + b] rows (an INT64 tensor of
 * n_a × n_b values on the device, one group; a negative count is 0),
 * kept up to max_chunk_rows (-1: no limit) and to the room either layout
 * has, from @src to @dst. @src and @dst have the same columns and element
 * size (any dtype: FP8 data and their scales move alike), live on the
 * counts' device and do not overlap.
 *
 * @kept (optional): an INT64 tensor of n_a × n_b values, written with the
 * rows each chunk kept. @dropped (optional): an INT64 tensor of one value
 * to which the rows dropped are added.
 *
 * Nothing is read on the host: the call can be captured in a graph. Bad
 * arguments (layouts that don't fit the tensors, dtypes, devices, shapes)
 * get an error before anything is enqueued. */
gboolean gmlp_row_chunks_move (GmlpGroupedTensor    *counts,
                               guint                 n_a,
                               guint                 n_b,
                               gint64                max_chunk_rows,
                               const GmlpChunkSide  *src,
                               const GmlpChunkSide  *dst,
                               GmlpMoveRowsFlags     flags,
                               GmlpGroupedTensor    *kept,
                               GmlpGroupedTensor    *dropped,
                               GError              **error);

G_END_DECLS
