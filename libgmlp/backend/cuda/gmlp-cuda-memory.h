/* gmlp-cuda-memory.h: memory and copies on the compute stream
 *
 * alloc, free, tables for the kernels, and the backend table's copies
 * (gmlp-cuda-memory.c).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-cuda-device.h"

G_BEGIN_DECLS

gpointer  gmlp_cuda_alloc           (GmlpBackendDevice  *device,
                                     gsize               nbytes,
                                     GError            **error);
/* Lets go of memory from alloc: back to the pool in compute-stream order,
 * or, where a graph or the capture in progress keeps it, once they let go
 * too (gmlp_cuda_release()). */
void      gmlp_cuda_free            (GmlpBackendDevice  *device,
                                     gpointer            ptr);
gpointer  gmlp_cuda_upload_table    (GmlpBackendDevice  *device,
                                     gconstpointer       table,
                                     gsize               table_bytes,
                                     gsize               extra_bytes,
                                     gpointer           *extra,
                                     GError            **error);

/* The backend table's copies, fill and synchronization. */
gboolean  gmlp_cuda_upload          (GmlpBackendDevice  *device,
                                     gpointer            dst,
                                     gconstpointer       src,
                                     gsize               nbytes,
                                     GError            **error);
gboolean  gmlp_cuda_download        (GmlpBackendDevice  *device,
                                     gpointer            dst,
                                     gconstpointer       src,
                                     gsize               nbytes,
                                     GError            **error);
gboolean  gmlp_cuda_copy            (GmlpBackendDevice  *device,
                                     gpointer            dst,
                                     gconstpointer       src,
                                     gsize               nbytes,
                                     GError            **error);
gboolean  gmlp_cuda_fill_bytes      (GmlpBackendDevice  *device,
                                     gpointer            dst,
                                     int                 value,
                                     gsize               nbytes,
                                     GError            **error);
gboolean  gmlp_cuda_synchronize     (GmlpBackendDevice  *device,
                                     GError            **error);

G_END_DECLS
