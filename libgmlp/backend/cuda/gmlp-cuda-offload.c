/* gmlp-cuda-offload.c: offloading saved activations to host memory
 *
 * The copies run on the device's copy stream, so that they overlap the
 * compute stream's work. The two streams meet only through events: a copy
 * of an activation out waits for the compute stream that produced it, and
 * the compute stream waits for a reload through the event copy_async()
 * returns (event_wait). Host memory is pinned, so the copies are true DMA
 * that neither stages the data nor blocks the host.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-private.h"

gpointer
gmlp_cuda_host_alloc (GmlpBackendDevice  *device,
                      gsize               nbytes,
                      GError            **error)
{
  void *ptr = NULL;
  cudaError_t err;

  /* The pinning is done through this device's context. Under unified
   * addressing (every 64-bit platform) pinned memory serves every device of
   * the process all the same, so a pool of these buffers may be shared. */
  if (!gmlp_cuda_activate (device, error))
    return NULL;

  err = cudaHostAlloc (&ptr, MAX (nbytes, GMLP_CUDA_MIN_ALLOCATION), cudaHostAllocDefault);
  if (err != cudaSuccess)
    {
      gmlp_cuda_fail (error, "cudaHostAlloc", err);
      return NULL;
    }
  return ptr;
}

void
gmlp_cuda_host_free (GmlpBackendDevice *device,
                     gpointer           ptr)
{
  cudaError_t err;

  if (ptr == NULL)
    return;

  err = cudaSetDevice (device->ordinal);
  if (err == cudaSuccess)
    err = cudaFreeHost (ptr);
  if (err != cudaSuccess)
    {
      /* Nothing to report to, as in gmlp_cuda_free(). cudaFreeHost() also
       * returns errors of earlier asynchronous work, which the next call
       * with a GError reports again if they are sticky. */
      g_debug ("CUDA: cudaFreeHost failed: %s (%s)",
               cudaGetErrorString (err), cudaGetErrorName (err));
      (void) cudaGetLastError ();
    }
}

GmlpBackendEvent *
gmlp_cuda_copy_async (GmlpBackendDevice  *device,
                      gpointer            dst,
                      gconstpointer       src,
                      gsize               nbytes,
                      gboolean            to_host,
                      gboolean            after_compute,
                      GError            **error)
{
  const char *what = NULL;
  cudaError_t err;

  if (!gmlp_cuda_activate (device, error))
    return NULL;

  /* Even with nothing to copy, so that the event still means that the
   * producer has finished. */
  if (after_compute)
    {
      err = gmlp_cuda_copies_after_compute (device, &what);
      if (err != cudaSuccess)
        {
          gmlp_cuda_fail (error, what, err);
          return NULL;
        }
    }

  if (nbytes > 0)
    {
      err = cudaMemcpyAsync (dst, src, nbytes,
                             to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                             device->copy_stream);
      if (err != cudaSuccess)
        {
          gmlp_cuda_fail (error, "cudaMemcpyAsync", err);
          return NULL;
        }
    }

  return gmlp_cuda_event_record_on_stream (device, device->copy_stream, error);
}

gpointer
gmlp_cuda_copy_stream_alloc (GmlpBackendDevice  *device,
                             gsize               nbytes,
                             GError            **error)
{
  /* On the copy stream, so that a reload into it need not wait for the
   * compute stream to reach the allocation. */
  return gmlp_cuda_alloc_on_stream (device, nbytes, device->copy_stream, error);
}

void
gmlp_cuda_free_after_copies (GmlpBackendDevice *device,
                             gpointer           ptr)
{
  /* Through the table of memory that graphs keep (gmlp-cuda-graph.c): a
   * graph captured after the copy may still read it. */
  if (ptr != NULL)
    gmlp_cuda_release (device, ptr, TRUE);
}
