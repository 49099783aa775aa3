/* gmlp-communicator.h: one rank of a group of devices, for collectives
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(GMLP_INSIDE) && !defined(GMLP_COMPILATION)
# error "Only <gmlp.h> can be included directly."
#endif

#include <gio/gio.h>

#include "gmlp-version-macros.h"
#include "gmlp-device.h"
#include "gmlp-event.h"
#include "gmlp-grouped-tensor.h"

G_BEGIN_DECLS

/**
 * GmlpReduceOp:
 * @GMLP_REDUCE_OP_SUM: the sum over the ranks
 * @GMLP_REDUCE_OP_AVERAGE: the sum over the ranks divided by their number
 *
 * What [method@Gmlp.Communicator.all_reduce] computes.
 *
 * Since: 0.1
 */
typedef enum {
  GMLP_REDUCE_OP_SUM,
  GMLP_REDUCE_OP_AVERAGE,
} GmlpReduceOp;

/**
 * GMLP_COMMUNICATOR_DEFAULT_TIMEOUT_MS:
 *
 * The default of [property@Gmlp.Communicator:timeout-ms]: ten minutes, as
 * torch.distributed's.
 *
 * Since: 0.1
 */
#define GMLP_COMMUNICATOR_DEFAULT_TIMEOUT_MS 600000

#define GMLP_TYPE_COMMUNICATOR (gmlp_communicator_get_type ())

/**
 * GmlpCommunicatorClass:
 * @parent_class: the parent class
 *
 * The class structure of #GmlpCommunicator, a final type: it has no virtual methods.
 *
 * Since: 0.1
 */
GMLP_AVAILABLE_IN_0_1
G_DECLARE_FINAL_TYPE (GmlpCommunicator, gmlp_communicator, GMLP, COMMUNICATOR, GObject)

GMLP_AVAILABLE_IN_0_1
GBytes           *gmlp_communicator_new_unique_id  (GmlpDevice         *device,
                                                    GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpCommunicator *gmlp_communicator_new            (GmlpDevice         *device,
                                                    GBytes             *unique_id,
                                                    int                 rank,
                                                    int                 world_size,
                                                    GError            **error);

GMLP_AVAILABLE_IN_0_1
GmlpCommunicator *gmlp_communicator_new_from_launcher (GError     **error);

GMLP_AVAILABLE_IN_0_1
GmlpDevice       *gmlp_communicator_get_device     (GmlpCommunicator   *self);
GMLP_AVAILABLE_IN_0_1
int               gmlp_communicator_get_rank       (GmlpCommunicator   *self);
GMLP_AVAILABLE_IN_0_1
int               gmlp_communicator_get_world_size (GmlpCommunicator   *self);
GMLP_AVAILABLE_IN_0_1
guint             gmlp_communicator_get_timeout_ms (GmlpCommunicator   *self);

GMLP_AVAILABLE_IN_0_1
gboolean          gmlp_communicator_all_reduce     (GmlpCommunicator   *self,
                                                    GmlpGroupedTensor  *tensor,
                                                    GmlpReduceOp        op,
                                                    GError            **error);
GMLP_AVAILABLE_IN_0_1
gboolean          gmlp_communicator_all_gather     (GmlpCommunicator   *self,
                                                    GmlpGroupedTensor  *send,
                                                    GmlpGroupedTensor  *recv,
                                                    GError            **error);
GMLP_AVAILABLE_IN_0_1
gboolean          gmlp_communicator_all_to_all     (GmlpCommunicator   *self,
                                                    GmlpGroupedTensor  *send,
                                                    GmlpGroupedTensor  *recv,
                                                    GError            **error);
GMLP_AVAILABLE_IN_0_1
gboolean          gmlp_communicator_all_to_all_rows (GmlpCommunicator  *self,
                                                    GmlpGroupedTensor  *send,
                                                    const gint64       *send_rows,
                                                    guint               n_send_rows,
                                                    GmlpGroupedTensor  *recv,
                                                    const gint64       *recv_rows,
                                                    guint               n_recv_rows,
                                                    GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpEvent        *gmlp_communicator_all_to_all_start (GmlpCommunicator *self,
                                                    GmlpGroupedTensor  *send,
                                                    GmlpGroupedTensor  *recv,
                                                    GError            **error);
GMLP_AVAILABLE_IN_0_1
GmlpEvent        *gmlp_communicator_all_to_all_rows_start (GmlpCommunicator *self,
                                                    GmlpGroupedTensor  *send,
                                                    const gint64       *send_rows,
                                                    guint               n_send_rows,
                                                    GmlpGroupedTensor  *recv,
                                                    const gint64       *recv_rows,
                                                    guint               n_recv_rows,
                                                    GError            **error);
GMLP_AVAILABLE_IN_0_1
void              gmlp_communicator_abort          (GmlpCommunicator   *self);

G_END_DECLS
