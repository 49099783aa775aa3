/* gmlp-cuda-memory.c: memory and copies on the compute stream
 *
 * alloc and free as the executors and the backend table call them: blocks
 * from the block cache, or, while the compute stream is captured, memory
 * from outside the capture, which the table of memory that graphs keep
 * (gmlp-cuda-graph.c) holds as long as they use it. Then the host tables
 * that the kernels read, uploaded through kernel parameters, and the
 * backend table's copies between host and device, fill and
 * synchronization. The executors stand on this file; it stands on
 * gmlp-cuda-graph.c, gmlp-cuda-block-cache.c and gmlp-cuda-device.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "gmlp-cuda-block-cache.h"
#include "gmlp-cuda-graph.h"
#include "gmlp-cuda-memory.h"

gpointer
gmlp_cuda_alloc (GmlpBackendDevice  *device,
                 gsize               nbytes,
                 GError            **error)
{
  gpointer ptr;

  /* While the compute stream is captured, an allocation on it would become
   * a node of the graph, which could then not be replayed twice:
   * gmlp-cuda-graph.c allocates outside the capture. The lock keeps a
   * capture from beginning in between. */
  g_mutex_lock (&device->capture_lock);
  if (device->capture != NULL)
    ptr = gmlp_cuda_capture_alloc (device, nbytes, error);
  else
    ptr = gmlp_cuda_block_cache_alloc (device, nbytes, error);
  g_mutex_unlock (&device->capture_lock);
  return ptr;
}

void
gmlp_cuda_free (GmlpBackendDevice *device,
                gpointer           ptr)
{
  if (ptr != NULL)
    gmlp_cuda_release (device, ptr, FALSE);
}

/* Allocates table_bytes, rounded up to the pool's 256-byte alignment, plus
 * extra_bytes from the pool and enqueues one copy of the host table into
 * the start of it; the extra bytes follow at the rounded offset (*extra,
 * when extra is not NULL). The copy goes through kernel parameters: the
 * caller may free its table at once, nothing waits for the stream, and the
 * copy can be captured in a graph (which a copy from the caller's pageable
 * memory could not: the memory would be gone at a replay). Free the result
 * with gmlp_cuda_free() once the work using it is enqueued. */
gpointer
gmlp_cuda_upload_table (GmlpBackendDevice  *device,
                        gconstpointer       table,
                        gsize               table_bytes,
                        gsize               extra_bytes,
                        gpointer           *extra,
                        GError            **error)
{
  gsize table_space = (table_bytes + GMLP_CUDA_MIN_ALLOCATION - 1) /
                      GMLP_CUDA_MIN_ALLOCATION * GMLP_CUDA_MIN_ALLOCATION;
  g_autofree guint64 *words = NULL;
  gsize word_bytes = (table_bytes + sizeof (guint64) - 1) / sizeof (guint64) * sizeof (guint64);
  GmlpKernelStatus status;
  gpointer ptr;

  if (table_space < table_bytes || extra_bytes > G_MAXSIZE - table_space)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_OUT_OF_MEMORY,
                   "CUDA: a table of %" G_GSIZE_FORMAT " bytes and %" G_GSIZE_FORMAT
                   " bytes of scratch do not fit in memory", table_bytes, extra_bytes);
      return NULL;
    }

  ptr = gmlp_cuda_alloc (device, table_space + extra_bytes, error);
  if (ptr == NULL)
    return NULL;
  if (extra != NULL)
    *extra = (guint8 *) ptr + table_space;
  if (table_bytes == 0)
    return ptr;

  /* The kernel writes whole 8-byte words: a table of another length is
   * padded with zeros, which land in the rounding to table_space. */
  if (word_bytes != table_bytes)
    {
      words = g_new0 (guint64, word_bytes / sizeof (guint64));
      memcpy (words, table, table_bytes);
      table = words;
    }
  status = gmlp_kernel_write_table (ptr, table, word_bytes, device->stream);
  if (status != GMLP_KERNEL_SUCCESS)
    {
      gmlp_cuda_kernel_result (status, "gmlp_kernel_write_table", error);
      gmlp_cuda_free (device, ptr);
      return NULL;
    }
  return ptr;
}

/* Whether host memory at ptr is pinned or managed, i.e. whether the runtime
 * reads it directly when the copy runs rather than staging it first. */
static gboolean
gmlp_cuda_host_is_pinned (gconstpointer ptr)
{
  struct cudaPointerAttributes attributes;

  if (cudaPointerGetAttributes (&attributes, ptr) != cudaSuccess)
    {
      (void) cudaGetLastError ();
      return FALSE;
    }
  return attributes.type == cudaMemoryTypeHost ||
         attributes.type == cudaMemoryTypeManaged;
}

/* One stream-ordered copy; with wait, returns only once it has completed. */
static gboolean
gmlp_cuda_memcpy (GmlpBackendDevice  *device,
                  gpointer            dst,
                  gconstpointer       src,
                  gsize               nbytes,
                  enum cudaMemcpyKind kind,
                  gboolean            wait,
                  GError            **error)
{
  cudaError_t err;

  if (nbytes == 0)
    return TRUE;
  if (!gmlp_cuda_activate (device, error))
    return FALSE;
  if (wait && !gmlp_cuda_check_not_capturing (device, "a copy that waits for the stream", error))
    return FALSE;

  err = cudaMemcpyAsync (dst, src, nbytes, kind, device->stream);
  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaMemcpyAsync", err);
  if (wait)
    {
      err = cudaStreamSynchronize (device->stream);
      if (err != cudaSuccess)
        return gmlp_cuda_fail (error, "cudaStreamSynchronize", err);
    }
  return TRUE;
}

gboolean
gmlp_cuda_upload (GmlpBackendDevice  *device,
                  gpointer            dst,
                  gconstpointer       src,
                  gsize               nbytes,
                  GError            **error)
{
  /* From pageable memory the runtime copies the source into its staging
   * buffers before cudaMemcpyAsync() returns, so the caller may reuse its
   * buffer at once while the copy to the device is still in flight. From
   * pinned or managed memory the DMA reads the source itself, later: there,
   * wait for the copy so that the same promise holds. During a capture the
   * copy is made at once, outside it: a replay would find the host buffer
   * gone. */
  if (nbytes > 0 && gmlp_cuda_is_capturing (device))
    return gmlp_cuda_activate (device, error) &&
           gmlp_cuda_capture_upload (device, dst, src, nbytes, error);
  return gmlp_cuda_memcpy (device, dst, src, nbytes, cudaMemcpyHostToDevice,
                           nbytes > 0 && gmlp_cuda_host_is_pinned (src), error);
}

gboolean
gmlp_cuda_download (GmlpBackendDevice  *device,
                    gpointer            dst,
                    gconstpointer       src,
                    gsize               nbytes,
                    GError            **error)
{
  return gmlp_cuda_memcpy (device, dst, src, nbytes, cudaMemcpyDeviceToHost, TRUE, error);
}

gboolean
gmlp_cuda_copy (GmlpBackendDevice  *device,
                gpointer            dst,
                gconstpointer       src,
                gsize               nbytes,
                GError            **error)
{
  return gmlp_cuda_memcpy (device, dst, src, nbytes, cudaMemcpyDeviceToDevice, FALSE, error);
}

gboolean
gmlp_cuda_fill_bytes (GmlpBackendDevice  *device,
                      gpointer            dst,
                      int                 value,
                      gsize               nbytes,
                      GError            **error)
{
  cudaError_t err;

  if (value < 0 || value > 255)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: fill value %d is not a byte value", value);
      return FALSE;
    }
  if (nbytes == 0)
    return TRUE;
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  err = cudaMemsetAsync (dst, value, nbytes, device->stream);
  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaMemsetAsync", err);
  return TRUE;
}

gboolean
gmlp_cuda_synchronize (GmlpBackendDevice  *device,
                       GError            **error)
{
  cudaError_t err;

  if (!gmlp_cuda_activate (device, error) ||
      !gmlp_cuda_check_not_capturing (device, "a synchronization", error))
    return FALSE;

  /* Everything enqueued on the device: the copies of offloaded activations
   * too. */
  err = cudaStreamSynchronize (device->stream);
  if (err == cudaSuccess)
    err = cudaStreamSynchronize (device->copy_stream);
  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaStreamSynchronize", err);
  return TRUE;
}
