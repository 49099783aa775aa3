/* gmlp-backend.h: the private backend interface
 *
 * A backend serves one kind of device. The GObjects call into it through this
 * table of function pointers and know nothing else of the device. All device
 * work is enqueued on the device's stream in call order; only `download` and
 * `synchronize` wait for it. Pointers called "device memory" are host
 * pointers for the CPU backend.
 *
 * The CUDA backend is a loadable module (libgmlp-backend-cuda.so) exporting
 * gmlp_backend_cuda_get(), so that libgmlp itself never links CUDA.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Bumped whenever the table changes; a module built for another version is
 * refused. */
#define GMLP_BACKEND_ABI_VERSION 1

typedef struct _GmlpBackendDevice GmlpBackendDevice;

/* A grouped shape whose group sizes are in device memory (n_groups INT64
 * values). Members are laid out with gmlp_num_member_stride(). Sizes beyond
 * row_capacity are clamped by the kernels so nothing outside the allocation is
 * ever touched. */
typedef struct {
  const gint64 *device_rows;
  guint         n_groups;
  gint64        cols;
  gint64        row_capacity;
} GmlpBackendShape;

typedef struct {
  int          abi_version;
  const char  *name;

  int                 (*get_device_count)  (void);
  GmlpBackendDevice  *(*open_device)       (int                 ordinal,
                                            GError            **error);
  void                (*close_device)      (GmlpBackendDevice  *device);
  char               *(*get_device_name)   (GmlpBackendDevice  *device);

  /* Stream-ordered allocation from the device's pool; the result is aligned
   * to at least 256 bytes. nbytes == 0 gives a valid unique pointer. */
  gpointer            (*alloc)             (GmlpBackendDevice  *device,
                                            gsize               nbytes,
                                            GError            **error);
  /* Stream-ordered: the memory returns to the pool once the work enqueued
   * before this call has finished. */
  void                (*free)              (GmlpBackendDevice  *device,
                                            gpointer            ptr);

  /* Host to device; the host buffer may be reused as soon as this returns. */
  gboolean            (*upload)            (GmlpBackendDevice  *device,
                                            gpointer            dst,
                                            gconstpointer       src,
                                            gsize               nbytes,
                                            GError            **error);
  /* Device to host; waits for the stream, so the data is there on return. */
  gboolean            (*download)          (GmlpBackendDevice  *device,
                                            gpointer            dst,
                                            gconstpointer       src,
                                            gsize               nbytes,
                                            GError            **error);
  gboolean            (*copy)              (GmlpBackendDevice  *device,
                                            gpointer            dst,
                                            gconstpointer       src,
                                            gsize               nbytes,
                                            GError            **error);
  /* Sets nbytes bytes at dst to value (0..255), stream-ordered. */
  gboolean            (*fill_bytes)        (GmlpBackendDevice  *device,
                                            gpointer            dst,
                                            int                 value,
                                            gsize               nbytes,
                                            GError            **error);
  gboolean            (*synchronize)       (GmlpBackendDevice  *device,
                                            GError            **error);

  /* Element-wise conversion of every member, one launch. dtype codes are
   * GmlpDType values; the caller has checked gmlp_dtype_can_convert(). */
  gboolean            (*convert)           (GmlpBackendDevice      *device,
                                            const GmlpBackendShape *shape,
                                            gconstpointer           src,
                                            int                     src_dtype,
                                            gpointer                dst,
                                            int                     dst_dtype,
                                            GError                **error);
  /* Fills n_elements of a floating dtype with gmlp_num_random_uniform(seed,
   * i, scale) for i = 0 .. n_elements-1. */
  gboolean            (*fill_random)       (GmlpBackendDevice  *device,
                                            gpointer            dst,
                                            int                 dtype,
                                            guint64             n_elements,
                                            guint64             seed,
                                            float               scale,
                                            GError            **error);
} GmlpBackend;

const GmlpBackend *gmlp_backend_cpu_get  (void);
/* The CUDA backend, loaded on first use; NULL (with a debug message) when the
 * module or the CUDA libraries it needs cannot be loaded. */
const GmlpBackend *gmlp_backend_cuda_load (void);

/* The entry point a backend module exports. */
typedef const GmlpBackend *(*GmlpBackendGetFunc) (void);

G_END_DECLS
