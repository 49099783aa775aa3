/* bench-shapes.h: the anchor shapes of ../shared/bench and their routing
 * splits, shared by the benchmark programs
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* E experts, M routed rows, K in, N out features. */
typedef struct {
  const char *name;
  gint64      experts, rows, in, out;
} BenchShape;

extern const BenchShape bench_anchor_shapes[];
extern const guint      bench_n_anchor_shapes;

gint64 *bench_split_rows (gint64   experts,
                          gint64   rows,
                          gboolean skew,
                          gint64   align);

G_END_DECLS
