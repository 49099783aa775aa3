/* gmlp-event.h: a point in a device's stream
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

G_BEGIN_DECLS

#define GMLP_TYPE_EVENT (gmlp_event_get_type ())

/**
 * GmlpEventClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpEvent, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpEvent, gmlp_event, GMLP, EVENT, GObject)

GMLP_AVAILABLE_IN_0_1
GmlpEvent  *gmlp_event_new_recorded      (GmlpDevice  *device,
                                          GError     **error);
GMLP_AVAILABLE_IN_0_1
GmlpDevice *gmlp_event_get_device        (GmlpEvent   *self);
GMLP_AVAILABLE_IN_0_1
gboolean    gmlp_event_is_complete       (GmlpEvent   *self);
GMLP_AVAILABLE_IN_0_1
gboolean    gmlp_event_synchronize       (GmlpEvent   *self,
                                          GError     **error);
GMLP_AVAILABLE_IN_0_1
gboolean    gmlp_event_wait_on_device    (GmlpEvent   *self,
                                          GmlpDevice  *device,
                                          GError     **error);
GMLP_AVAILABLE_IN_0_1
gboolean    gmlp_event_elapsed_ms        (GmlpEvent   *start,
                                          GmlpEvent   *end,
                                          double      *ms,
                                          GError     **error);
GMLP_AVAILABLE_IN_0_1
gpointer    gmlp_event_get_native_handle (GmlpEvent   *self);

G_END_DECLS
