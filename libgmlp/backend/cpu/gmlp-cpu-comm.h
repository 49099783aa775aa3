/* gmlp-cpu-comm.h: the communicator entries of the CPU backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

gboolean         gmlp_cpu_comm_unique_id  (GmlpBackendDevice  *device,
                                           guint8             *id,
                                           GError            **error);
GmlpBackendComm *gmlp_cpu_comm_init       (GmlpBackendDevice  *device,
                                           const guint8       *id,
                                           int                 rank,
                                           int                 world_size,
                                           guint               timeout_ms,
                                           GError            **error);
gboolean         gmlp_cpu_comm_join       (GmlpBackendComm    *comm,
                                           GError            **error);
void             gmlp_cpu_comm_abort      (GmlpBackendComm    *comm);
void             gmlp_cpu_comm_free       (GmlpBackendComm    *comm);
gboolean         gmlp_cpu_comm_all_reduce (GmlpBackendComm    *comm,
                                           gpointer            data,
                                           gsize               count,
                                           int                 dtype,
                                           int                 op,
                                           GError            **error);
gboolean         gmlp_cpu_comm_all_gather (GmlpBackendComm    *comm,
                                           gconstpointer       send,
                                           gpointer            recv,
                                           gsize               nbytes,
                                           GError            **error);
gboolean         gmlp_cpu_comm_all_to_all (GmlpBackendComm    *comm,
                                           gconstpointer       send,
                                           const gsize        *send_offsets,
                                           const gsize        *send_bytes,
                                           gpointer            recv,
                                           const gsize        *recv_offsets,
                                           const gsize        *recv_bytes,
                                           GmlpBackendEvent  **done,
                                           GError            **error);

G_END_DECLS
