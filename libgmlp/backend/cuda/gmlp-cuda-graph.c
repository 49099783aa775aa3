/* gmlp-cuda-graph.c: capture of the compute stream into CUDA graphs
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-private.h"

gboolean
gmlp_cuda_capture_begin (GmlpBackendDevice  *device,
                         GError            **error)
{
  g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED, "CUDA: graphs are not implemented yet");
  return FALSE;
}

GmlpBackendGraph *
gmlp_cuda_capture_end (GmlpBackendDevice  *device,
                       GError            **error)
{
  g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_STATE, "CUDA: no capture in progress");
  return NULL;
}

gboolean
gmlp_cuda_is_capturing (GmlpBackendDevice *device)
{
  return FALSE;
}

gboolean
gmlp_cuda_graph_launch (GmlpBackendGraph  *graph,
                        GError           **error)
{
  g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED, "CUDA: graphs are not implemented yet");
  return FALSE;
}

void
gmlp_cuda_graph_free (GmlpBackendGraph *graph)
{
}
