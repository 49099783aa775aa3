/* gmlp-grouped-tensor-impl.h: the grouped tensor's instance struct
 *
 * Shared by the three files of the object itself: gmlp-grouped-tensor.c
 * (type, properties, construction, layout, rows views),
 * gmlp-grouped-tensor-accessors.c (the getters, public and private) and
 * gmlp-grouped-tensor-members.c (member views). The other
 * gmlp-grouped-tensor-*.c files go through the getters
 * (gmlp-grouped-tensor-private.h). No other file includes it.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-grouped-tensor-private.h"

G_BEGIN_DECLS

struct _GmlpGroupedTensor
{
  GObject             parent_instance;

  GmlpDevice         *device;
  GmlpDType           dtype;
  guint               n_groups;
  gint64              cols;
  gint64              row_capacity;
  gint64             *rows;        /* host sizes, or NULL when device-only */
  gint64             *offsets;     /* byte offsets of members (after rows), NULL when device-only */
  GmlpGroupedTensor  *sizes;       /* device INT64 sizes; lazily uploaded for host sizes */
  gconstpointer       kept_rows;   /* atomic: the device's copy of the host sizes, or NULL */
  gint64              one_group[2]; /* rows and offsets of one group, not allocated */
  GmlpBuffer         *buffer;
  gsize               offset;      /* of this tensor inside buffer */
  gsize               nbytes;      /* span of this tensor inside buffer */
  GError             *construct_error;
  guint               uniform : 1;
  guint               is_view : 1;
  guint               construct_props : 1;  /* made by g_object_new() with properties */
};

G_END_DECLS
