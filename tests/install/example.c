/* A C program against an installed libgmlp (tests/install/test-install.sh). */
#include <gmlp.h>

int
main (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpDevice) device = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, &error);
  gint64 rows[] = { 3, 0, 5 };
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL;

  if (device == NULL)
    g_error ("%s", error->message);
  x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, rows, 3, 16, &error);
  layer = gmlp_grouped_linear_new (device, 3, 16, 8, &error);
  if (x == NULL || layer == NULL || !gmlp_grouped_tensor_fill_random (x, 1, 1.0, &error))
    g_error ("%s", error->message);
  y = gmlp_grouped_linear_forward (layer, x, &saved, &error);
  if (y == NULL)
    g_error ("%s", error->message);
  g_print ("c: libgmlp %s, y has %" G_GINT64_FORMAT " rows of %" G_GINT64_FORMAT "\n",
           GMLP_VERSION_S, gmlp_grouped_tensor_get_total_rows (y), gmlp_grouped_tensor_get_cols (y));
  return gmlp_grouped_tensor_get_total_rows (y) == 8 && gmlp_grouped_tensor_get_cols (y) == 8 ? 0 : 1;
}
