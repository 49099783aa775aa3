/* gmlp-saved-activations.h: what a forward keeps for its backward
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(GMLP_INSIDE) && !defined(GMLP_COMPILATION)
# error "Only <gmlp.h> can be included directly."
#endif

#include <glib-object.h>

#include "gmlp-version-macros.h"

G_BEGIN_DECLS

#define GMLP_TYPE_SAVED_ACTIVATIONS (gmlp_saved_activations_get_type ())

/**
 * GmlpSavedActivationsClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpSavedActivations, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpSavedActivations, gmlp_saved_activations, GMLP, SAVED_ACTIVATIONS, GObject)

GMLP_AVAILABLE_IN_0_1
gboolean gmlp_saved_activations_get_offload   (GmlpSavedActivations *self);
GMLP_AVAILABLE_IN_0_1
gboolean gmlp_saved_activations_is_consumed   (GmlpSavedActivations *self);
GMLP_AVAILABLE_IN_0_1
guint64  gmlp_saved_activations_get_nbytes    (GmlpSavedActivations *self);
GMLP_AVAILABLE_IN_0_1
guint64  gmlp_saved_activations_get_host_nbytes (GmlpSavedActivations *self);

G_END_DECLS
