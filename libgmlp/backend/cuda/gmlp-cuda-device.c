/* gmlp-cuda-device.c: the device, at the bottom of the CUDA backend module
 *
 * What works on a GmlpBackendDevice alone (gmlp-cuda-device.h has its
 * fields): errors as GErrors, making the device current, memory from its
 * pool in a stream's order, its tuning, and the scratch workspace of the
 * device-sizes kernels. Nothing here calls into another file of the module;
 * every other file stands on this one. gmlp-cuda-backend.c opens and closes
 * devices.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <stdint.h>

#include "gmlp-cuda-device.h"

static int
gmlp_cuda_error_code (cudaError_t err)
{
  switch (err)
    {
    case cudaErrorMemoryAllocation:
      return GMLP_ERROR_OUT_OF_MEMORY;
    case cudaErrorInvalidValue:
      return GMLP_ERROR_INVALID_ARGUMENT;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInsufficientDriver:
      return GMLP_ERROR_NO_DEVICE;
    default:
      return GMLP_ERROR_BACKEND;
    }
}

/* Reports a failed runtime call as a GError and clears the runtime's record
 * of it, so that the next check does not see it again. (Sticky errors, which
 * leave the context unusable, stay: every later call reports them.) */
gboolean
gmlp_cuda_fail (GError      **error,
                const char   *what,
                cudaError_t   err)
{
  (void) cudaGetLastError ();
  g_set_error (error, GMLP_CUDA_ERROR, gmlp_cuda_error_code (err),
               "CUDA: %s failed: %s (%s)",
               what, cudaGetErrorString (err), cudaGetErrorName (err));
  return FALSE;
}

/* Maps a kernel status to a GError; what names the kernel entry point. */
gboolean
gmlp_cuda_kernel_result (GmlpKernelStatus   status,
                         const char        *what,
                         GError           **error)
{
  switch (status)
    {
    case GMLP_KERNEL_SUCCESS:
      return TRUE;
    case GMLP_KERNEL_INVALID_VALUE:
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: %s: invalid arguments", what);
      return FALSE;
    case GMLP_KERNEL_UNSUPPORTED:
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: %s: not supported for these types or sizes", what);
      return FALSE;
    case GMLP_KERNEL_LAUNCH_FAILED:
      return gmlp_cuda_fail (error, what, gmlp_kernel_get_last_cuda_error ());
    default:
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_BACKEND,
                   "CUDA: %s: %s", what, gmlp_kernel_status_to_string (status));
      return FALSE;
    }
}

/* cudaSetDevice (ordinal), skipped where ordinal is current already.
 *
 * NOTE: cudaSetDevice() costs far more host time than cudaGetDevice(), a
 * read of the runtime's thread-local state, and every entry of the backend
 * comes here. So ask first, rather than remember what was set last: other
 * code in the process may make another device current behind our back. */
cudaError_t
gmlp_cuda_set_current (int ordinal)
{
  int current = -1;

  if (cudaGetDevice (&current) == cudaSuccess && current == ordinal)
    return cudaSuccess;
  return cudaSetDevice (ordinal);
}

/* Makes the device current on the calling thread; the runtime keeps the
 * current device per thread, and any thread may call into the backend. */
gboolean
gmlp_cuda_activate (GmlpBackendDevice  *device,
                    GError            **error)
{
  cudaError_t err = gmlp_cuda_set_current (device->ordinal);

  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaSetDevice", err);
  return TRUE;
}

/* Allocates from the device's pool in the order of stream, the compute or
 * the copy stream. */
gpointer
gmlp_cuda_alloc_on_stream (GmlpBackendDevice  *device,
                           gsize               nbytes,
                           cudaStream_t        stream,
                           GError            **error)
{
  void *ptr = NULL;
  cudaError_t err;

  if (!gmlp_cuda_activate (device, error))
    return NULL;

  /* Pool allocations are aligned to at least 256 bytes, like cudaMalloc's. */
  err = cudaMallocFromPoolAsync (&ptr, MAX (nbytes, GMLP_CUDA_MIN_ALLOCATION),
                                 device->pool, stream);
  if (err != cudaSuccess)
    {
      gmlp_cuda_fail (error, "cudaMallocFromPoolAsync", err);
      return NULL;
    }
  return ptr;
}

/* Makes the copy stream wait for all the work enqueued on the compute stream
 * so far; the device must be current. On failure *what names the call.
 *
 * One event serves every call: cudaStreamWaitEvent() waits for the event's
 * latest record when it is called. Should another thread record it in
 * between, that record is later on the same compute stream, so waiting for
 * it waits for ours as well. */
cudaError_t
gmlp_cuda_copies_after_compute (GmlpBackendDevice  *device,
                                const char        **what)
{
  cudaError_t err;

  err = cudaEventRecord (device->copy_after_compute, device->stream);
  if (err != cudaSuccess)
    {
      *what = "cudaEventRecord";
      return err;
    }
  err = cudaStreamWaitEvent (device->copy_stream, device->copy_after_compute, 0);
  if (err != cudaSuccess)
    {
      *what = "cudaStreamWaitEvent";
      return err;
    }
  return cudaSuccess;
}

void
gmlp_cuda_kernel_shape (const GmlpBackendShape *shape,
                        GmlpKernelGroupedShape *kernel_shape)
{
  kernel_shape->device_rows = (const int64_t *) shape->device_rows;
  kernel_shape->n_groups = shape->n_groups;
  kernel_shape->cols = shape->cols;
  kernel_shape->row_capacity = shape->row_capacity;
}

/* The kernels' values of a choice are the backend's. */
G_STATIC_ASSERT ((int) GMLP_KERNEL_CHOICE_AUTO == (int) GMLP_TUNING_AUTO &&
                 (int) GMLP_KERNEL_CHOICE_NEVER == (int) GMLP_TUNING_NEVER &&
                 (int) GMLP_KERNEL_CHOICE_ALWAYS == (int) GMLP_TUNING_ALWAYS);

/* Held under scratch_lock, which every product holds while it reads the
 * tuning and enqueues. */
void
gmlp_cuda_set_tuning (GmlpBackendDevice        *device,
                      const GmlpBackendTuning  *tuning)
{
  g_rec_mutex_lock (&device->scratch_lock);
  device->tuning = *tuning;
  device->sm90_tuning = (GmlpKernelSm90Tuning) {
    .fp8_tile_n = tuning->sm90_fp8_tile_n,
    .direct = (GmlpKernelChoice) tuning->sm90_direct,
    .short_tiles = (GmlpKernelChoice) tuning->sm90_short_tiles,
    .pairs = (GmlpKernelChoice) tuning->sm90_pairs,
    .even_waves = (GmlpKernelChoice) tuning->sm90_even_waves,
    .stream_k = (GmlpKernelChoice) tuning->sm90_stream_k,
    .max_ctas = tuning->sm90_max_ctas,
  };
  g_rec_mutex_unlock (&device->scratch_lock);
}

/* ---- Scratch workspace of the device-sizes kernels ------------------------
 *
 * One buffer per device, for the tables and scratch that the kernels of
 * gmlp-kernels.h taking device group sizes need (gmlp-cuda-gemm-device.c,
 * gmlp-cuda-bias.c). Those calls write their tables into it in stream order,
 * so calls on the compute stream can share it, one call at a time: each is
 * several launches, which the caller enqueues under scratch_lock. It is
 * allocated with cudaMalloc, outside the pool: the pool's stream-ordered
 * allocation would become a node of a graph being captured, and memory a
 * graph may use must outlive it anyway. */

static GMutex workspace_lock;

gpointer
gmlp_cuda_device_workspace (GmlpBackendDevice  *device,
                            gsize               nbytes,
                            GError            **error)
{
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  const gsize granule = 64 * 1024;
  gpointer ptr = NULL;
  gsize size;
  cudaError_t err;

  g_mutex_lock (&workspace_lock);
  if (device->workspace != NULL && device->workspace_bytes >= nbytes)
    {
      ptr = device->workspace;
      g_mutex_unlock (&workspace_lock);
      return ptr;
    }

  /* At least double, so that a layer whose sizes creep up reallocates only
   * a few times; never empty, so that the result is a real pointer. */
  size = MAX (MAX (nbytes, 2 * device->workspace_bytes), granule);
  if (size > G_MAXSIZE - granule)
    {
      g_mutex_unlock (&workspace_lock);
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_OUT_OF_MEMORY,
                   "CUDA: a workspace of %" G_GSIZE_FORMAT " bytes does not fit in memory", nbytes);
      return NULL;
    }
  size = (size + granule - 1) / granule * granule;

  if (!gmlp_cuda_activate (device, error))
    {
      g_mutex_unlock (&workspace_lock);
      return NULL;
    }
  /* NOTE: cudaMalloc is refused while a stream is captured in the global
   * or thread-local mode; this thread may do it in the relaxed mode, and it
   * does not touch the stream being captured. */
  err = cudaThreadExchangeStreamCaptureMode (&mode);
  if (err == cudaSuccess)
    {
      err = cudaMalloc (&ptr, size);
      (void) cudaThreadExchangeStreamCaptureMode (&mode);
    }
  if (err != cudaSuccess)
    {
      g_mutex_unlock (&workspace_lock);
      gmlp_cuda_fail (error, "cudaMalloc (workspace)", err);
      return NULL;
    }

  if (device->workspace != NULL)
    device->workspace_retired = g_slist_prepend (device->workspace_retired, device->workspace);
  device->workspace = ptr;
  device->workspace_bytes = size;
  g_mutex_unlock (&workspace_lock);
  return ptr;
}

void
gmlp_cuda_device_workspace_fini (GmlpBackendDevice *device)
{
  GSList *l;

  g_mutex_lock (&workspace_lock);
  for (l = device->workspace_retired; l != NULL; l = l->next)
    (void) cudaFree (l->data);
  g_clear_pointer (&device->workspace_retired, g_slist_free);
  if (device->workspace != NULL)
    (void) cudaFree (device->workspace);
  device->workspace = NULL;
  device->workspace_bytes = 0;
  g_mutex_unlock (&workspace_lock);
}
