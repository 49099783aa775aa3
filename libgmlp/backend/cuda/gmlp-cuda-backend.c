/* gmlp-cuda-backend.c: the CUDA backend module
 *
 * Host-side C over the CUDA runtime, cuBLAS and the kernels' C ABI. Built
 * as the loadable module libgmlp-backend-cuda.so with the CUDA runtime
 * linked statically, so that at run time it needs nothing from CUDA but
 * libcublas (found through the module's runpath) and the driver's
 * libcuda.so.1, and the latter only once a device is used: on a machine
 * without an NVIDIA driver the module loads and reports no devices.
 *
 * Each GmlpBackendDevice owns a non-blocking stream, a memory pool and a
 * cuBLAS handle on its device. All work is enqueued on that stream;
 * allocations come from the pool in stream order, so steady-state allocation
 * never reaches the driver. A second stream, the copy stream, carries only
 * the copies of offloaded activations (gmlp-cuda-offload.c).
 *
 * This file has the device, memory and element-wise entry points and the
 * backend table; the GEMMs, the bias operations, the activations, the events
 * and offloading have files of their own (gmlp-cuda-private.h lists what
 * they share).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <stdint.h>
#include <string.h>

#include "gmlp-cuda-private.h"
#include "gmlp-cuda-quantize.h"
#include "gmlp-cuda-router.h"
#include "gmlp-cuda-activation-quantize.h"
#include "gmlp-cuda-permute.h"
#include "gmlp-cuda-row-chunks.h"

__attribute__((visibility ("default")))
const GmlpBackend *gmlp_backend_cuda_get (void);

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

/* Makes the device current on the calling thread; the runtime keeps the
 * current device per thread, and any thread may call into the backend. */
gboolean
gmlp_cuda_activate (GmlpBackendDevice  *device,
                    GError            **error)
{
  cudaError_t err = cudaSetDevice (device->ordinal);

  if (err != cudaSuccess)
    return gmlp_cuda_fail (error, "cudaSetDevice", err);
  return TRUE;
}

static int
gmlp_cuda_get_device_count (void)
{
  int count = 0;
  cudaError_t err;

  /* No driver, a driver too old for this runtime, or no GPU: all mean that
   * this backend has no devices, and none of them is worth a message. */
  err = cudaGetDeviceCount (&count);
  if (err != cudaSuccess)
    {
      (void) cudaGetLastError ();
      return 0;
    }
  return count;
}

static void
gmlp_cuda_close_device (GmlpBackendDevice *device)
{
  if (device == NULL)
    return;

  /* First: a capture left running would record the frees below. */
  gmlp_cuda_graph_fini_device (device);
  if (cudaSetDevice (device->ordinal) == cudaSuccess)
    {
      /* Before the stream goes: the workspace is freed on it. */
      gmlp_cuda_cublas_fini (device);
      gmlp_cuda_cublaslt_fini (device);
      /* The device-sizes kernels' scratch (cudaFree waits for them). */
      gmlp_cuda_device_workspace_fini (device);
      /* Kept blocks go back to the pool on the stream, before it goes. */
      gmlp_cuda_block_cache_fini (device);
      /* Copies still in flight write to host memory that the caller frees
       * once the device is closed. */
      if (device->copy_stream != NULL)
        {
          (void) cudaStreamSynchronize (device->copy_stream);
          (void) cudaStreamDestroy (device->copy_stream);
        }
      if (device->stream != NULL)
        {
          (void) cudaStreamSynchronize (device->stream);
          (void) cudaStreamDestroy (device->stream);
        }
      if (device->copy_after_compute != NULL)
        (void) cudaEventDestroy (device->copy_after_compute);
      /* Memory still allocated from the pool keeps it alive until freed. */
      if (device->pool != NULL)
        (void) cudaMemPoolDestroy (device->pool);
    }
  (void) cudaGetLastError ();

  g_rec_mutex_clear (&device->scratch_lock);
  g_free (device->name);
  g_free (device);
}

static GmlpBackendDevice *
gmlp_cuda_open_device (int      ordinal,
                       GError **error)
{
  GmlpBackendDevice *device;
  struct cudaDeviceProp props;
  struct cudaMemPoolProps pool_props = { 0 };
  uint64_t release_threshold = UINT64_MAX;
  int count = gmlp_cuda_get_device_count ();
  int pools_supported = 0;
  cudaError_t err;

  if (ordinal < 0 || ordinal >= count)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_NO_DEVICE,
                   "CUDA: no device cuda:%d (%d CUDA devices found)", ordinal, count);
      return NULL;
    }

  device = g_new0 (GmlpBackendDevice, 1);
  device->ordinal = ordinal;
  g_rec_mutex_init (&device->scratch_lock);
  gmlp_cuda_graph_init_device (device);

  if (!gmlp_cuda_activate (device, error))
    goto fail;

  err = cudaGetDeviceProperties (&props, ordinal);
  if (err != cudaSuccess)
    {
      gmlp_cuda_fail (error, "cudaGetDeviceProperties", err);
      goto fail;
    }
  device->name = g_strndup (props.name, sizeof props.name);

  err = cudaDeviceGetAttribute (&pools_supported, cudaDevAttrMemoryPoolsSupported, ordinal);
  if (err != cudaSuccess)
    {
      gmlp_cuda_fail (error, "cudaDeviceGetAttribute", err);
      goto fail;
    }
  if (!pools_supported)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CUDA: %s (cuda:%d) does not support stream-ordered memory pools",
                   device->name, ordinal);
      goto fail;
    }

  err = cudaStreamCreateWithFlags (&device->stream, cudaStreamNonBlocking);
  if (err != cudaSuccess)
    {
      device->stream = NULL;
      gmlp_cuda_fail (error, "cudaStreamCreateWithFlags", err);
      goto fail;
    }

  /* Non-blocking too, so that neither stream waits for the legacy default
   * stream, and the copies for nothing but the events they are given. */
  err = cudaStreamCreateWithFlags (&device->copy_stream, cudaStreamNonBlocking);
  if (err != cudaSuccess)
    {
      device->copy_stream = NULL;
      gmlp_cuda_fail (error, "cudaStreamCreateWithFlags", err);
      goto fail;
    }
  /* Only ever waited on: without timing, recording it and waiting for it
   * cost the least. */
  err = cudaEventCreateWithFlags (&device->copy_after_compute, cudaEventDisableTiming);
  if (err != cudaSuccess)
    {
      device->copy_after_compute = NULL;
      gmlp_cuda_fail (error, "cudaEventCreateWithFlags", err);
      goto fail;
    }

  /* A pool of our own rather than the device's default pool, so that other
   * users of the device do not change its settings under us. Memory freed
   * to it is kept (the threshold never lets the pool shrink on a
   * synchronize), which keeps steady-state allocation cheap.
   *
   * Both streams allocate from it and free to it. The reuse policies are
   * left at their defaults (all enabled): memory freed on one stream goes
   * to an allocation on the other only once that stream has waited for the
   * free through an event, once the free has completed, or, failing
   * those, once the driver has made the allocating stream wait for the
   * free. Each keeps stream order, so this is safe; turning them off would
   * only keep memory freed on one stream from serving the other. */
  pool_props.allocType = cudaMemAllocationTypePinned;
  pool_props.handleTypes = cudaMemHandleTypeNone;
  pool_props.location.type = cudaMemLocationTypeDevice;
  pool_props.location.id = ordinal;
  err = cudaMemPoolCreate (&device->pool, &pool_props);
  if (err != cudaSuccess)
    {
      device->pool = NULL;
      gmlp_cuda_fail (error, "cudaMemPoolCreate", err);
      goto fail;
    }
  err = cudaMemPoolSetAttribute (device->pool, cudaMemPoolAttrReleaseThreshold,
                                 &release_threshold);
  if (err != cudaSuccess)
    {
      gmlp_cuda_fail (error, "cudaMemPoolSetAttribute", err);
      goto fail;
    }

  gmlp_cuda_block_cache_init (device);

  if (!gmlp_cuda_cublas_init (device, error))
    goto fail;
  if (!gmlp_cuda_cublaslt_init (device, error))
    goto fail;

  return device;

fail:
  gmlp_cuda_close_device (device);
  return NULL;
}

static char *
gmlp_cuda_get_device_name (GmlpBackendDevice *device)
{
  return g_strdup (device->name);
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

void
gmlp_cuda_free_now (GmlpBackendDevice *device,
                    gpointer           ptr)
{
  cudaError_t err;

  if (gmlp_cuda_block_cache_free (device, ptr))
    return;
  err = cudaSetDevice (device->ordinal);
  if (err == cudaSuccess)
    err = cudaFreeAsync (ptr, device->stream);
  if (err != cudaSuccess)
    {
      /* Nothing to report to: free cannot fail. This only happens once the
       * context is broken, and then the next call with a GError says so. */
      g_debug ("CUDA: cudaFreeAsync failed: %s (%s)",
               cudaGetErrorString (err), cudaGetErrorName (err));
      (void) cudaGetLastError ();
    }
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

static gboolean
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

static gboolean
gmlp_cuda_download (GmlpBackendDevice  *device,
                    gpointer            dst,
                    gconstpointer       src,
                    gsize               nbytes,
                    GError            **error)
{
  return gmlp_cuda_memcpy (device, dst, src, nbytes, cudaMemcpyDeviceToHost, TRUE, error);
}

static gboolean
gmlp_cuda_copy (GmlpBackendDevice  *device,
                gpointer            dst,
                gconstpointer       src,
                gsize               nbytes,
                GError            **error)
{
  return gmlp_cuda_memcpy (device, dst, src, nbytes, cudaMemcpyDeviceToDevice, FALSE, error);
}

static gboolean
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

static gboolean
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

void
gmlp_cuda_kernel_shape (const GmlpBackendShape *shape,
                        GmlpKernelGroupedShape *kernel_shape)
{
  kernel_shape->device_rows = (const int64_t *) shape->device_rows;
  kernel_shape->n_groups = shape->n_groups;
  kernel_shape->cols = shape->cols;
  kernel_shape->row_capacity = shape->row_capacity;
}

static gboolean
gmlp_cuda_convert (GmlpBackendDevice       *device,
                   const GmlpBackendShape  *shape,
                   gconstpointer            src,
                   int                      src_dtype,
                   gpointer                 dst,
                   int                      dst_dtype,
                   GError                 **error)
{
  GmlpKernelGroupedShape kernel_shape;

  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  gmlp_cuda_kernel_shape (shape, &kernel_shape);

  return gmlp_cuda_kernel_result (gmlp_kernel_convert_grouped (&kernel_shape,
                                                               src, src_dtype,
                                                               dst, dst_dtype,
                                                               device->stream),
                                  "gmlp_kernel_convert_grouped", error);
}

static gboolean
gmlp_cuda_fill_random (GmlpBackendDevice  *device,
                       gpointer            dst,
                       int                 dtype,
                       guint64             n_elements,
                       guint64             seed,
                       float               scale,
                       GError            **error)
{
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  return gmlp_cuda_kernel_result (gmlp_kernel_fill_random (dst, dtype, n_elements,
                                                           seed, scale,
                                                           device->stream),
                                  "gmlp_kernel_fill_random", error);
}

static const GmlpBackend gmlp_cuda_backend = {
  .abi_version = GMLP_BACKEND_ABI_VERSION,
  .name = "cuda",

  .get_device_count = gmlp_cuda_get_device_count,
  .open_device = gmlp_cuda_open_device,
  .close_device = gmlp_cuda_close_device,
  .get_device_name = gmlp_cuda_get_device_name,

  .alloc = gmlp_cuda_alloc,
  .free = gmlp_cuda_free,

  .upload = gmlp_cuda_upload,
  .download = gmlp_cuda_download,
  .copy = gmlp_cuda_copy,
  .fill_bytes = gmlp_cuda_fill_bytes,
  .synchronize = gmlp_cuda_synchronize,

  .convert = gmlp_cuda_convert,
  .fill_random = gmlp_cuda_fill_random,

  .gemm = gmlp_cuda_gemm,
  .add_bias = gmlp_cuda_add_bias,
  .bias_grad = gmlp_cuda_bias_grad,

  .event_record = gmlp_cuda_event_record,
  .event_synchronize = gmlp_cuda_event_synchronize,
  .event_query = gmlp_cuda_event_query,
  .event_wait = gmlp_cuda_event_wait,
  .event_elapsed = gmlp_cuda_event_elapsed,
  .event_get_native = gmlp_cuda_event_get_native,
  .event_free = gmlp_cuda_event_free,

  .host_alloc = gmlp_cuda_host_alloc,
  .host_free = gmlp_cuda_host_free,
  .copy_async = gmlp_cuda_copy_async,
  .copy_stream_alloc = gmlp_cuda_copy_stream_alloc,
  .free_after_copies = gmlp_cuda_free_after_copies,

  .activation = gmlp_cuda_activation,
  .activation_device = gmlp_cuda_activation_device,
  .axpby = gmlp_cuda_axpby,
  .sum_squares = gmlp_cuda_sum_squares,

  .gemm_device = gmlp_cuda_gemm_device,
  .bias_grad_device = gmlp_cuda_bias_grad_device,

  .capture_begin = gmlp_cuda_capture_begin,
  .capture_end = gmlp_cuda_capture_end,
  .is_capturing = gmlp_cuda_is_capturing,
  .graph_launch = gmlp_cuda_graph_launch,
  .graph_free = gmlp_cuda_graph_free,

  /* FP8 quantization (gmlp-quantizer): entries below this line. */
  .quantize = gmlp_cuda_quantize,
  .dequantize = gmlp_cuda_dequantize,
  .quantizer_update = gmlp_cuda_quantizer_update,
  .gemm_fp8 = gmlp_cuda_gemm_fp8,
  .activation_quantize = gmlp_cuda_activation_quantize,

  /* Token permutation (gmlp-cuda-permute.c). */
  .routing_count = gmlp_cuda_routing_count,
  .routing_map = gmlp_cuda_routing_map,
  .permute = gmlp_cuda_permute,
  /* Router (gmlp-cuda-router.c). */
  .router_forward = gmlp_cuda_router_forward,
  .router_backward = gmlp_cuda_router_backward,
  .router_update_bias = gmlp_cuda_router_update_bias,

  .set_tuning = gmlp_cuda_set_tuning,

  /* Communicators (gmlp-cuda-comm.c): entries below this line. */
  .comm_unique_id = gmlp_cuda_comm_unique_id,
  .comm_init = gmlp_cuda_comm_init,
  .comm_join = gmlp_cuda_comm_join,
  .comm_abort = gmlp_cuda_comm_abort,
  .comm_free = gmlp_cuda_comm_free,
  .comm_all_reduce = gmlp_cuda_comm_all_reduce,
  .comm_all_gather = gmlp_cuda_comm_all_gather,
  .comm_all_to_all = gmlp_cuda_comm_all_to_all,
  .move_rows = gmlp_cuda_move_rows,
};

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

/* The module's one exported symbol; see GmlpBackendGetFunc. */
const GmlpBackend *
gmlp_backend_cuda_get (void)
{
  return &gmlp_cuda_backend;
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
