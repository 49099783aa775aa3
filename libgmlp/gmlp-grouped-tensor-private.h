/* gmlp-grouped-tensor-private.h: internals for the layers and the tests
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-grouped-tensor.h"
#include "gmlp-device-private.h"

G_BEGIN_DECLS

/* Most groups a grouped tensor may have (the kernels' grid limit). */
#define GMLP_MAX_GROUPS 65535

/* Sizes beyond these are reported as errors, not attempted: no real tensor
 * comes near them. Byte counts are checked for overflow on the way
 * (gmlp_grouped_tensor_layout_bytes()), and once a layout is within
 * GMLP_MAX_BYTES every later count derived from it is too. */
#define GMLP_MAX_ROWS  (G_GINT64_CONSTANT (1) << 40)
#define GMLP_MAX_COLS  (G_GINT64_CONSTANT (1) << 31)
#define GMLP_MAX_BYTES (G_GUINT64_CONSTANT (1) << 50)

/* Device pointer to the first byte of the tensor (its member 0). */
gpointer  gmlp_grouped_tensor_get_data          (GmlpGroupedTensor *self);
/* Bytes the allocation for this layout needs (the worst case when sizes are
 * on the device), every product and sum checked: FALSE for negative sizes or
 * when the count overflows or passes the largest tensor libgmlp makes. The
 * one size check of every path that lays a tensor out. */
gboolean  gmlp_grouped_tensor_layout_bytes      (guint              n_groups,
                                                 const gint64      *rows,
                                                 gint64             row_capacity,
                                                 guint64            row_bytes,
                                                 gsize             *nbytes);
/* FALSE with the reason when @self has no storage: made by a bare
 * g_object_new(), or its construction from properties failed. Public
 * methods check their tensors with it before anything else. */
gboolean  gmlp_grouped_tensor_check_usable      (GmlpGroupedTensor *self,
                                                 GError           **error);
/* The shape, as the backends take it; uploads host sizes on first use. */
gboolean  gmlp_grouped_tensor_get_backend_shape (GmlpGroupedTensor *self,
                                                 GmlpBackendShape  *shape,
                                                 GError           **error);

G_END_DECLS

G_BEGIN_DECLS

/* Device pointer to member @index (host sizes only). */
gpointer  gmlp_grouped_tensor_get_member_data   (GmlpGroupedTensor *self,
                                                 guint              index);
/* The host group sizes (NULL when device-only); owned by the tensor. */
const gint64 *gmlp_grouped_tensor_peek_rows     (GmlpGroupedTensor *self);

G_END_DECLS

G_BEGIN_DECLS

/* What it takes to rebuild a tensor of the same layout on other storage
 * (offload and reload of saved activations). */
typedef struct {
  GmlpDevice        *device;
  GmlpDType          dtype;
  guint              n_groups;
  gint64             cols;
  gint64             row_capacity;
  gint64            *rows;       /* NULL when the sizes are device-only */
  GmlpGroupedTensor *sizes;      /* the device sizes when device-only */
  gsize              nbytes;     /* the span of the storage */
} GmlpTensorLayout;

void               gmlp_grouped_tensor_get_layout      (GmlpGroupedTensor      *self,
                                                        GmlpTensorLayout       *layout);
void               gmlp_tensor_layout_clear            (GmlpTensorLayout       *layout);
/* A tensor of @layout over @buffer (whole, from its start); refs @buffer. */
GmlpGroupedTensor *gmlp_grouped_tensor_new_with_buffer (const GmlpTensorLayout *layout,
                                                        GmlpBuffer             *buffer);
/* A tensor of @n_groups groups of @rows rows (host sizes), @self's dtype
 * and columns, over @self's storage from its first byte: what @self holds
 * read as another layout. NULL where that layout passes @self's storage,
 * or @self starts inside its buffer (a member view). */
GmlpGroupedTensor *gmlp_grouped_tensor_new_rows_view   (GmlpGroupedTensor      *self,
                                                        const gint64           *rows,
                                                        guint                   n_groups);
GmlpBuffer        *gmlp_grouped_tensor_get_buffer      (GmlpGroupedTensor      *self);

G_END_DECLS

G_BEGIN_DECLS

/* The checks of any layout (gmlp-grouped-tensor-layout.c): the dtype, the
 * number of groups and the columns; and host group sizes, with their sum in
 * @total_rows. */
gboolean           gmlp_grouped_tensor_check_common      (GmlpDevice         *device,
                                                          GmlpDType           dtype,
                                                          guint               n_groups,
                                                          gint64              cols,
                                                          GError            **error);
gboolean           gmlp_grouped_tensor_check_rows        (const gint64       *rows,
                                                          guint               n_groups,
                                                          gint64              cols,
                                                          GmlpDType           dtype,
                                                          gint64             *total_rows,
                                                          GError            **error);
/* For the constructors and operations in gmlp-grouped-tensor-interop.c and
 * gmlp-grouped-tensor-ops.c. The checks of a host-sizes layout that every
 * constructor makes (device, dtype, count, columns, then the sizes), with
 * their sum in @total_rows. */
gboolean           gmlp_grouped_tensor_check_host_layout (GmlpDevice         *device,
                                                          GmlpDType           dtype,
                                                          const gint64       *rows,
                                                          guint               n_groups,
                                                          gint64              cols,
                                                          gint64             *total_rows,
                                                          GError            **error);
/* A tensor of a checked layout (@rows NULL for device sizes, which the
 * caller then sets), without storage: give it one with
 * gmlp_grouped_tensor_take_buffer(), which takes @buffer's reference. */
GmlpGroupedTensor *gmlp_grouped_tensor_new_layout        (GmlpDevice         *device,
                                                          GmlpDType           dtype,
                                                          const gint64       *rows,
                                                          guint               n_groups,
                                                          gint64              cols,
                                                          gint64              row_capacity);
void               gmlp_grouped_tensor_take_buffer       (GmlpGroupedTensor  *self,
                                                          GmlpBuffer         *buffer);
/* gmlp_grouped_tensor_new_layout() with fresh storage. */
GmlpGroupedTensor *gmlp_grouped_tensor_new_internal      (GmlpDevice         *device,
                                                          GmlpDType           dtype,
                                                          const gint64       *rows,
                                                          guint               n_groups,
                                                          gint64              cols,
                                                          gint64              row_capacity,
                                                          GError            **error);
/* Whether @a and @b have the same columns and group sizes: equal host
 * sizes, or the same device sizes tensor and row capacity. */
gboolean           gmlp_grouped_tensor_same_shape        (GmlpGroupedTensor  *a,
                                                          GmlpGroupedTensor  *b);

G_END_DECLS

G_BEGIN_DECLS

/* The version counter of the tensor's storage (gmlp-device-private.h);
 * NULL for a tensor without storage. */
GmlpVersionCounter *gmlp_grouped_tensor_get_version_counter (GmlpGroupedTensor *self);
/* For the library's own writes into existing storage: once per call that
 * writes, before the write is enqueued. */
void                gmlp_grouped_tensor_bump_version        (GmlpGroupedTensor *self);
/* Whether other code may write the storage behind its version: it came from
 * DLPack, or went out through it. */
gboolean            gmlp_grouped_tensor_is_shared           (GmlpGroupedTensor *self);
/* Marks the storage as exported through DLPack. */
void                gmlp_grouped_tensor_mark_exported       (GmlpGroupedTensor *self);
/* Where the tensor's bytes lie (the storage is not referenced). */
void                gmlp_grouped_tensor_get_span            (GmlpGroupedTensor *self,
                                                             GmlpSpan          *span);
/* Whether the bytes of @a and @b overlap (gmlp_spans_overlap()). */
gboolean            gmlp_grouped_tensor_overlaps            (GmlpGroupedTensor *a,
                                                             GmlpGroupedTensor *b);

G_END_DECLS

G_BEGIN_DECLS

/* A new tensor of @dtype with the group sizes of @self: the same host
 * sizes, or the same device sizes tensor and row capacity. */
GmlpGroupedTensor *gmlp_grouped_tensor_new_like           (GmlpGroupedTensor  *self,
                                                           GmlpDType           dtype,
                                                           GError            **error);

/* Quantized tensors (gmlp-grouped-tensor-quantized.c), for the rest of the
 * tensor: whether convert() must go through convert_scaled() (the values
 * of @self mean nothing without their scales, or are scales that are not
 * values); convert() of such a tensor, dequantized where the result is a
 * floating type that can hold it, else an error that says what to do
 * instead; and the mark of MXFP8's E8M0 scales (bytes typed E4M3), which
 * a member view of such scales keeps (gmlp-grouped-tensor-members.c). */
gboolean           gmlp_grouped_tensor_is_scaled          (GmlpGroupedTensor  *self);
GmlpGroupedTensor *gmlp_grouped_tensor_convert_scaled     (GmlpGroupedTensor  *self,
                                                           GmlpDType           dtype,
                                                           GError            **error);
void               gmlp_grouped_tensor_mark_e8m0_scales   (GmlpGroupedTensor  *self);

G_END_DECLS
