/* gmlp-offload-context.h: CPU offload of saved activations, nestable
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(GMLP_INSIDE) && !defined(GMLP_COMPILATION)
# error "Only <gmlp.h> can be included directly."
#endif

#include <glib-object.h>

#include "gmlp-version-macros.h"
#include "gmlp-device.h"
#include "gmlp-saved-activations.h"

G_BEGIN_DECLS

#define GMLP_TYPE_OFFLOAD_CONTEXT (gmlp_offload_context_get_type ())

/**
 * GmlpOffloadContextClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpOffloadContext, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpOffloadContext, gmlp_offload_context, GMLP, OFFLOAD_CONTEXT, GObject)

GMLP_AVAILABLE_IN_0_1
GmlpOffloadContext *gmlp_offload_context_new                    (GmlpDevice            *device,
                                                                 GError               **error);
GMLP_AVAILABLE_IN_0_1
void                gmlp_offload_context_push_thread_default    (GmlpOffloadContext    *self,
                                                                 gboolean               enabled);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_offload_context_pop_thread_default     (GmlpOffloadContext    *self,
                                                                 GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpOffloadContext *gmlp_offload_context_get_thread_default     (void);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_offload_context_get_enabled            (GmlpOffloadContext    *self);
GMLP_AVAILABLE_IN_0_1
guint               gmlp_offload_context_get_depth              (void);
GMLP_AVAILABLE_IN_0_1
void                gmlp_offload_context_flush                  (GmlpOffloadContext    *self);
GMLP_AVAILABLE_IN_0_1
gboolean            gmlp_offload_context_prefetch               (GmlpOffloadContext    *self,
                                                                 GmlpSavedActivations  *saved,
                                                                 GError               **error);
GMLP_AVAILABLE_IN_0_1
GmlpDevice         *gmlp_offload_context_get_device             (GmlpOffloadContext    *self);
GMLP_AVAILABLE_IN_0_1
guint64             gmlp_offload_context_get_bytes_offloaded    (GmlpOffloadContext    *self);
GMLP_AVAILABLE_IN_0_1
guint64             gmlp_offload_context_get_bytes_on_host      (GmlpOffloadContext    *self);
GMLP_AVAILABLE_IN_0_1
guint64             gmlp_offload_context_get_host_pool_bytes    (GmlpOffloadContext    *self);
GMLP_AVAILABLE_IN_0_1
guint               gmlp_offload_context_get_reload_waits       (GmlpOffloadContext    *self);
GMLP_AVAILABLE_IN_0_1
guint               gmlp_offload_context_get_prefetches         (GmlpOffloadContext    *self);

G_END_DECLS
