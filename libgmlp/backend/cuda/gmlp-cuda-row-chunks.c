/* gmlp-cuda-row-chunks.c: chunks of rows between layouts on the CUDA
 * backend
 *
 * The move_rows entry over kernels/row_chunks.cu. The plan of the chunks
 * goes through the device's workspace (see scratch_lock); nothing waits
 * for the device, so the call can be captured in a graph.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-private.h"
#include "gmlp-cuda-row-chunks.h"

G_STATIC_ASSERT ((int) GMLP_BACKEND_CHUNKS_SLOTS == (int) GMLP_KERNEL_CHUNKS_SLOTS);
G_STATIC_ASSERT ((int) GMLP_BACKEND_CHUNKS_PACKED == (int) GMLP_KERNEL_CHUNKS_PACKED);
G_STATIC_ASSERT ((int) GMLP_BACKEND_CHUNKS_MEMBERS == (int) GMLP_KERNEL_CHUNKS_MEMBERS);
G_STATIC_ASSERT ((int) GMLP_BACKEND_CHUNKS_MEMBERS_BY_B == (int) GMLP_KERNEL_CHUNKS_MEMBERS_BY_B);

static GmlpKernelChunkSide
kernel_side (const GmlpBackendChunkSide *side)
{
  return (GmlpKernelChunkSide) {
    .layout = (int) side->layout,
    .base = side->base,
    .capacity = side->capacity,
    .slot_rows = side->slot_rows,
    .slot_stride = side->slot_stride,
    .member_rows = side->member_rows,
    .n_members = side->n_members,
  };
}

gboolean
gmlp_cuda_move_rows (GmlpBackendDevice          *device,
                     const GmlpBackendMoveRows  *move,
                     GError                    **error)
{
  GmlpKernelMoveRows kernel_move;
  gpointer workspace;
  gboolean ok;

  kernel_move = (GmlpKernelMoveRows) {
    .n_a = move->n_a,
    .n_b = move->n_b,
    .counts = move->counts,
    .max_chunk_rows = move->max_chunk_rows,
    .row_bytes = move->row_bytes,
    .src = kernel_side (&move->src),
    .dst = kernel_side (&move->dst),
    .dst_sizes = move->dst_sizes,
    .zero_rest = move->zero_rest,
    .kept = move->kept,
    .dropped = move->dropped,
  };
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  g_rec_mutex_lock (&device->scratch_lock);
  workspace = gmlp_cuda_device_workspace (device, gmlp_kernel_move_rows_workspace_bytes (&kernel_move),
                                          error);
  ok = workspace != NULL &&
       gmlp_cuda_kernel_result (gmlp_kernel_move_rows (&kernel_move, workspace, device->stream),
                                "gmlp_kernel_move_rows", error);
  g_rec_mutex_unlock (&device->scratch_lock);
  return ok;
}
