/* gmlp-cuda-graph.h: capture of the compute stream into CUDA graphs
 *
 * The captures, the graphs made of them, and the table of memory that they
 * keep alive (gmlp-cuda-graph.c).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-cuda-device.h"

G_BEGIN_DECLS

/* Graphs (gmlp-cuda-graph.c). */
void              gmlp_cuda_graph_init_device (GmlpBackendDevice  *device);
void              gmlp_cuda_graph_fini_device (GmlpBackendDevice  *device);
/* Drops the owner's reference to device memory (after_copies: freed with
 * free_after_copies): frees it now when no graph or capture keeps it. */
void              gmlp_cuda_release        (GmlpBackendDevice  *device,
                                            gpointer            ptr,
                                            gboolean            after_copies);
/* alloc while capturing, with the capture lock held: memory from the pool
 * outside the capture, kept by it as well as by its owner. */
gpointer          gmlp_cuda_capture_alloc  (GmlpBackendDevice  *device,
                                            gsize               nbytes,
                                            GError            **error);
/* upload while capturing: copied at once, outside the capture. */
gboolean          gmlp_cuda_capture_upload (GmlpBackendDevice  *device,
                                            gpointer            dst,
                                            gconstpointer       src,
                                            gsize               nbytes,
                                            GError            **error);
/* GMLP_ERROR_INVALID_STATE while capturing, for what waits for the stream. */
gboolean          gmlp_cuda_check_not_capturing (GmlpBackendDevice  *device,
                                                 const char         *what,
                                                 GError            **error);
gboolean          gmlp_cuda_capture_begin  (GmlpBackendDevice  *device,
                                            GError            **error);
GmlpBackendGraph *gmlp_cuda_capture_end    (GmlpBackendDevice  *device,
                                            GError            **error);
gboolean          gmlp_cuda_is_capturing   (GmlpBackendDevice  *device);
gboolean          gmlp_cuda_graph_launch   (GmlpBackendGraph   *graph,
                                            GError            **error);
void              gmlp_cuda_graph_free     (GmlpBackendGraph   *graph);

G_END_DECLS
