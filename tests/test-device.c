/* test-device.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>

#include "gmlp-test-util.h"

static void
test_default (void)
{
  GmlpDevice *device = gmlp_device_get_default ();
  const char *spec = g_getenv ("GMLP_DEVICE");

  g_assert_true (GMLP_IS_DEVICE (device));
  g_assert_true (gmlp_device_get_default () == device);
  if (spec != NULL && g_str_equal (spec, "cpu"))
    g_assert_cmpint (gmlp_device_get_kind (device), ==, GMLP_DEVICE_KIND_CPU);
  else if (gmlp_device_get_count (GMLP_DEVICE_KIND_CUDA) > 0)
    g_assert_cmpint (gmlp_device_get_kind (device), ==, GMLP_DEVICE_KIND_CUDA);
  else
    g_assert_cmpint (gmlp_device_get_kind (device), ==, GMLP_DEVICE_KIND_CPU);
}

static void
test_properties (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GmlpDevice) again = NULL;
  g_autofree char *name = NULL;
  GmlpDeviceKind kind;
  int ordinal;

  if (device == NULL)
    return;

  again = gmlp_device_new (gmlp_device_get_kind (device), gmlp_device_get_ordinal (device), NULL);
  g_assert_true (again == device);

  g_object_get (device, "kind", &kind, "ordinal", &ordinal, "name", &name, NULL);
  g_assert_cmpint (kind, ==, gmlp_device_get_kind (device));
  g_assert_cmpint (ordinal, ==, 0);
  g_assert_cmpstr (name, ==, gmlp_device_get_name (device));
  if (kind == GMLP_DEVICE_KIND_CPU)
    g_assert_cmpstr (name, ==, "cpu");
  else
    g_assert_cmpuint (strlen (name), >, 0);
  g_assert_true (gmlp_device_synchronize (device, NULL));
}

static void
test_missing_devices (void)
{
  int n_cuda = gmlp_device_get_count (GMLP_DEVICE_KIND_CUDA);
  g_autoptr(GError) error = NULL;
  GmlpDevice *device;

  g_assert_cmpint (gmlp_device_get_count (GMLP_DEVICE_KIND_CPU), ==, 1);

  /* Past the last GPU (the first one where there is no driver). */
  device = gmlp_device_new (GMLP_DEVICE_KIND_CUDA, n_cuda, &error);
  g_assert_null (device);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE);
  g_clear_error (&error);

  device = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 256, &error);
  g_assert_null (device);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE);
  g_clear_error (&error);

  device = gmlp_device_new (GMLP_DEVICE_KIND_CUDA, -1, &error);
  g_assert_null (device);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE);
}

static void
test_from_string (void)
{
  static const char *bad[] = { "tpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "cpu:", "cpu:y", "" };
  g_autoptr(GmlpDevice) cpu = NULL;
  g_autoptr(GmlpDevice) cpu2 = NULL;
  g_autoptr(GmlpDevice) cpu3 = NULL;
  g_autoptr(GmlpDevice) cpu3_again = NULL;
  g_autoptr(GError) cpu_error = NULL;
  guint i;

  cpu = gmlp_device_new_from_string ("cpu", NULL);
  cpu2 = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, NULL);
  g_assert_true (cpu == cpu2);

  /* cpu:N: a CPU device of its own (the ranks of an in-process
   * communicator), one object per ordinal. */
  cpu3 = gmlp_device_new_from_string ("cpu:3", &cpu_error);
  g_assert_no_error (cpu_error);
  cpu3_again = gmlp_device_new (GMLP_DEVICE_KIND_CPU, 3, &cpu_error);
  g_assert_no_error (cpu_error);
  g_assert_true (cpu3 == cpu3_again);
  g_assert_true (cpu3 != cpu);
  g_assert_cmpstr (gmlp_device_get_name (cpu3), ==, "cpu:3");
  g_assert_cmpint (gmlp_device_get_ordinal (cpu3), ==, 3);
  g_assert_cmpint (gmlp_device_get_count (GMLP_DEVICE_KIND_CPU), ==, 1);
  g_assert_null (gmlp_device_new_from_string ("cpu:256", &cpu_error));
  g_assert_error (cpu_error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE);

  for (i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autoptr(GError) error = NULL;
      g_assert_null (gmlp_device_new_from_string (bad[i], &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
    }

  if (gmlp_device_get_count (GMLP_DEVICE_KIND_CUDA) == 0)
    {
      g_autoptr(GError) error = NULL;
      g_assert_null (gmlp_device_new_from_string ("cuda:0", &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE);
    }
}

static void
test_bytes_in_use (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  GmlpGroupedTensor *tensor;
  guint64 before;

  if (device == NULL)
    return;

  before = gmlp_device_get_bytes_in_use (device);
  tensor = gmlp_grouped_tensor_new_uniform (device, GMLP_DTYPE_FLOAT32, 4, 100, 64, NULL);
  g_assert_nonnull (tensor);
  g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==,
                    before + gmlp_grouped_tensor_get_nbytes (tensor));
  g_object_unref (tensor);
  g_assert_true (gmlp_device_synchronize (device, NULL));
  g_assert_cmpuint (gmlp_device_get_bytes_in_use (device), ==, before);
}

int
main (int argc, char *argv[])
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/Device/default", test_default);
  g_test_add_func ("/Gmlp/Device/properties", test_properties);
  g_test_add_func ("/Gmlp/Device/missing-devices", test_missing_devices);
  g_test_add_func ("/Gmlp/Device/from-string", test_from_string);
  g_test_add_func ("/Gmlp/Device/bytes-in-use", test_bytes_in_use);

  return g_test_run ();
}
