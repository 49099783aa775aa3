/* gmlp-host-step.c: the host cost of a GroupedLinear step
 *
 * A forward and backward of a tiny layer (8 groups of one row, 16 → 16
 * features, FP32) on a device, over and over: on the CPU the arithmetic is
 * negligible and what is left is the library's own work per call, which
 * `valgrind --tool=callgrind` counts repeatably (docs/performance.md).
 *
 *   gmlp-host-step [STEPS]     (GMLP_DEVICE chooses the device)
 *
 * Prints the wall time per step.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <stdlib.h>

#include <gmlp.h>

#include "bench-json.h"

int
main (int   argc,
      char *argv[])
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  GmlpDevice *device = gmlp_device_get_default ();
  gint64 rows[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
  int steps = argc > 1 ? atoi (argv[1]) : 2000;
  JsonBuilder *record;
  gint64 start;
  int i;

  setlocale (LC_ALL, "");
  layer = gmlp_grouped_linear_new (device, 8, 16, 16, &error);
  if (layer != NULL)
    x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, rows, 8, 16, &error);
  if (x == NULL || !gmlp_grouped_tensor_fill_random (x, 1, 1.0, &error))
    g_error ("%s", error->message);

  start = g_get_monotonic_time ();
  for (i = 0; i < steps; i++)
    {
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GmlpGroupedTensor) y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
      g_autoptr(GmlpGroupedTensor) dx = NULL;

      if (y != NULL)
        dx = gmlp_grouped_linear_backward (layer, saved, y, &error);
      if (dx == NULL)
        g_error ("%s", error->message);
    }
  if (!gmlp_device_synchronize (device, &error))
    g_error ("%s", error->message);

  record = bench_record_new (NULL, gmlp_device_get_name (device));
  bench_record_int (record, "steps", steps);
  bench_record_double (record, "host_us_per_step",
                       (double) (g_get_monotonic_time () - start) / MAX (steps, 1), "%.2f");
  bench_record_emit (record);
  return 0;
}
