/* gmlp-graph.h: work captured from a device's stream, replayed as one launch
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

#define GMLP_TYPE_GRAPH (gmlp_graph_get_type ())

/**
 * GmlpGraphClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpGraph, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpGraph, gmlp_graph, GMLP, GRAPH, GObject)

/* The device's methods that make a graph, declared with it (defined in
 * gmlp-graph.c): the device itself only knows whether it is capturing. */
GMLP_AVAILABLE_IN_0_1
gboolean    gmlp_device_begin_capture (GmlpDevice  *self,
                                       GError     **error);
GMLP_AVAILABLE_IN_0_1
GmlpGraph  *gmlp_device_end_capture   (GmlpDevice  *self,
                                       GError     **error);

GMLP_AVAILABLE_IN_0_1
gboolean    gmlp_graph_replay         (GmlpGraph   *self,
                                       GError     **error);
GMLP_AVAILABLE_IN_0_1
GmlpDevice *gmlp_graph_get_device     (GmlpGraph   *self);

G_END_DECLS
