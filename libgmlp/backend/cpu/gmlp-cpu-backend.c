/* gmlp-cpu-backend.c: the reference backend
 *
 * Plain C on the host. Device memory is host memory; the stream is the
 * calling thread, so every call completes before it returns.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "backend/gmlp-backend.h"
#include "gmlp-error.h"
#include "gmlp-numeric.h"

struct _GmlpBackendDevice
{
  int ordinal;
};

static int
cpu_get_device_count (void)
{
  return 1;
}

static GmlpBackendDevice *
cpu_open_device (int      ordinal,
                 GError **error)
{
  GmlpBackendDevice *device = g_new0 (GmlpBackendDevice, 1);

  device->ordinal = ordinal;
  return device;
}

static void
cpu_close_device (GmlpBackendDevice *device)
{
  g_free (device);
}

static char *
cpu_get_device_name (GmlpBackendDevice *device)
{
  return g_strdup ("cpu");
}

static gpointer
cpu_alloc (GmlpBackendDevice  *device,
           gsize               nbytes,
           GError            **error)
{
  gsize rounded = (MAX (nbytes, 1) + kGmlpMemberAlignment - 1) & ~(gsize) (kGmlpMemberAlignment - 1);
  gpointer ptr = NULL;

  if (rounded < nbytes || posix_memalign (&ptr, kGmlpMemberAlignment, rounded) != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_OUT_OF_MEMORY,
                   "Out of host memory allocating %" G_GSIZE_FORMAT " bytes", nbytes);
      return NULL;
    }
  return ptr;
}

static void
cpu_free (GmlpBackendDevice *device,
          gpointer           ptr)
{
  free (ptr);
}

static gboolean
cpu_copy (GmlpBackendDevice  *device,
          gpointer            dst,
          gconstpointer       src,
          gsize               nbytes,
          GError            **error)
{
  if (nbytes > 0)
    memmove (dst, src, nbytes);
  return TRUE;
}

static gboolean
cpu_fill_bytes (GmlpBackendDevice  *device,
                gpointer            dst,
                int                 value,
                gsize               nbytes,
                GError            **error)
{
  if (nbytes > 0)
    memset (dst, value, nbytes);
  return TRUE;
}

static gboolean
cpu_synchronize (GmlpBackendDevice  *device,
                 GError            **error)
{
  return TRUE;
}

static void
convert_elements (const guint8 *src,
                  int           src_dtype,
                  guint8       *dst,
                  int           dst_dtype,
                  guint64       n)
{
  guint64 i;

  if (src_dtype == dst_dtype)
    {
      memcpy (dst, src, n * gmlp_num_dtype_size (src_dtype));
    }
  else if (src_dtype == GMLP_NUM_INT32 && dst_dtype == GMLP_NUM_INT64)
    {
      for (i = 0; i < n; i++)
        ((gint64 *) dst)[i] = ((const gint32 *) src)[i];
    }
  else if (src_dtype == GMLP_NUM_INT64 && dst_dtype == GMLP_NUM_INT32)
    {
      for (i = 0; i < n; i++)
        ((gint32 *) dst)[i] = (gint32) ((const gint64 *) src)[i];
    }
  else
    {
      for (i = 0; i < n; i++)
        gmlp_num_store_float (dst, dst_dtype, i, gmlp_num_load_float (src, src_dtype, i));
    }
}

static gboolean
cpu_convert (GmlpBackendDevice      *device,
             const GmlpBackendShape *shape,
             gconstpointer           src,
             int                     src_dtype,
             gpointer                dst,
             int                     dst_dtype,
             GError                **error)
{
  guint64 src_row_bytes = (guint64) shape->cols * gmlp_num_dtype_size (src_dtype);
  guint64 dst_row_bytes = (guint64) shape->cols * gmlp_num_dtype_size (dst_dtype);
  guint64 src_offset = 0, dst_offset = 0;
  gint64 rows_left = shape->row_capacity;
  guint g;

  for (g = 0; g < shape->n_groups; g++)
    {
      /* Clamp as the CUDA kernels do: never beyond the row capacity. */
      gint64 rows = CLAMP (shape->device_rows[g], 0, rows_left);

      convert_elements ((const guint8 *) src + src_offset, src_dtype,
                        (guint8 *) dst + dst_offset, dst_dtype,
                        (guint64) rows * (guint64) shape->cols);
      src_offset += gmlp_num_member_stride (rows, src_row_bytes);
      dst_offset += gmlp_num_member_stride (rows, dst_row_bytes);
      rows_left -= rows;
    }

  return TRUE;
}

static gboolean
cpu_fill_random (GmlpBackendDevice  *device,
                 gpointer            dst,
                 int                 dtype,
                 guint64             n_elements,
                 guint64             seed,
                 float               scale,
                 GError            **error)
{
  guint64 i;

  for (i = 0; i < n_elements; i++)
    gmlp_num_store_float (dst, dtype, i, gmlp_num_random_uniform (seed, i, scale));
  return TRUE;
}

static const GmlpBackend cpu_backend = {
  .abi_version = GMLP_BACKEND_ABI_VERSION,
  .name = "cpu",
  .get_device_count = cpu_get_device_count,
  .open_device = cpu_open_device,
  .close_device = cpu_close_device,
  .get_device_name = cpu_get_device_name,
  .alloc = cpu_alloc,
  .free = cpu_free,
  .upload = cpu_copy,
  .download = cpu_copy,
  .copy = cpu_copy,
  .fill_bytes = cpu_fill_bytes,
  .synchronize = cpu_synchronize,
  .convert = cpu_convert,
  .fill_random = cpu_fill_random,
};

const GmlpBackend *
gmlp_backend_cpu_get (void)
{
  return &cpu_backend;
}
