/* gmlp-graph-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-graph.h"
#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* Wraps a graph the backend made from a capture of device; takes it over. */
GmlpGraph *gmlp_graph_new_for_backend (GmlpDevice       *device,
                                       GmlpBackendGraph *graph);

G_END_DECLS
