/* bench-shapes.c: the anchor shapes of ../shared/bench and their routing
 * splits, shared by the benchmark programs
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "bench-shapes.h"

const BenchShape bench_anchor_shapes[] = {
  { "mixtral-fc1", 8, 16384, 4096, 14336 },
  { "dsv3-fc1", 32, 32768, 7168, 2048 },
  { "qwen3-fc1", 128, 65536, 2048, 768 },
  { "small-e64", 64, 8192, 1024, 1024 },
};

const guint bench_n_anchor_shapes = G_N_ELEMENTS (bench_anchor_shapes);

/* Group sizes (g_free() them): balanced, the remainder on expert 0, or the
 * skewed split of cublas_anchor.cu: the same generator, each size a
 * multiple of align (16 there), the remainder on expert 0. */
gint64 *
bench_split_rows (gint64   experts,
                  gint64   rows,
                  gboolean skew,
                  gint64   align)
{
  gint64 *m = g_new (gint64, experts);
  g_autofree double *w = NULL;
  double total = 0.0;
  guint32 x = 12345;
  gint64 e, acc = 0;

  if (!skew)
    {
      for (e = 0; e < experts; e++)
        m[e] = rows / experts;
      m[0] += rows - (rows / experts) * experts;
      return m;
    }

  w = g_new (double, experts);
  for (e = 0; e < experts; e++)
    {
      x = x * 1103515245u + 12345u;
      w[e] = 1.0 + ((x >> 8) % 1000) / 250.0;
      total += w[e];
    }
  for (e = 0; e < experts; e++)
    {
      m[e] = (gint64) (w[e] / total * rows / align) * align;
      acc += m[e];
    }
  m[0] += rows - acc;
  return m;
}
