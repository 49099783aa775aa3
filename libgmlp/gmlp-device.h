/* gmlp-device.h: a compute device with its stream and memory pool
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

/**
 * GmlpDeviceKind:
 * @GMLP_DEVICE_KIND_CPU: the host CPU, served by the reference backend
 * @GMLP_DEVICE_KIND_CUDA: an NVIDIA GPU, served by the CUDA backend
 *
 * The kind of a [class@Gmlp.Device].
 *
 * Since: 0.1
 */
typedef enum {
  GMLP_DEVICE_KIND_CPU,
  GMLP_DEVICE_KIND_CUDA,
} GmlpDeviceKind;

#define GMLP_TYPE_DEVICE (gmlp_device_get_type ())

/**
 * GmlpDeviceClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpDevice, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpDevice, gmlp_device, GMLP, DEVICE, GObject)

GMLP_AVAILABLE_IN_0_1
GmlpDevice     *gmlp_device_get_default        (void);
GMLP_AVAILABLE_IN_0_1
GmlpDevice     *gmlp_device_new                (GmlpDeviceKind   kind,
                                                int              ordinal,
                                                GError         **error);
GMLP_AVAILABLE_IN_0_1
GmlpDevice     *gmlp_device_new_from_string    (const char      *spec,
                                                GError         **error);
GMLP_AVAILABLE_IN_0_1
int             gmlp_device_get_count          (GmlpDeviceKind   kind);
GMLP_AVAILABLE_IN_0_1
GmlpDeviceKind  gmlp_device_get_kind           (GmlpDevice      *self);
GMLP_AVAILABLE_IN_0_1
int             gmlp_device_get_ordinal        (GmlpDevice      *self);
GMLP_AVAILABLE_IN_0_1
const char     *gmlp_device_get_name           (GmlpDevice      *self);
GMLP_AVAILABLE_IN_0_1
guint64         gmlp_device_get_bytes_in_use   (GmlpDevice      *self);
GMLP_AVAILABLE_IN_0_1
gboolean        gmlp_device_synchronize        (GmlpDevice      *self,
                                                GError         **error);
GMLP_AVAILABLE_IN_0_1
gboolean        gmlp_device_is_capturing       (GmlpDevice      *self);

G_END_DECLS
