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
 * This file has the backend table and opens and closes devices. The entry
 * points live below it, in floors that call only downwards: the executors
 * (the GEMMs, the bias operations, the activations, the events, offloading
 * and the rest, a file each), the memory (gmlp-cuda-memory.c,
 * gmlp-cuda-graph.c, gmlp-cuda-block-cache.c) and the device
 * (gmlp-cuda-device.c); gmlp-cuda-private.h lists them and what they
 * share.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <stdint.h>

#include "gmlp-cuda-private.h"
#include "gmlp-cuda-quantize.h"
#include "gmlp-cuda-router.h"
#include "gmlp-cuda-activation-quantize.h"
#include "gmlp-cuda-permute.h"
#include "gmlp-cuda-row-chunks.h"

__attribute__((visibility ("default")))
const GmlpBackend *gmlp_backend_cuda_get (void);

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
  device->props = (GmlpCudaDeviceProps) {
    .major = props.major,
    .minor = props.minor,
    .n_sms = props.multiProcessorCount,
  };

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

/* The routes' part of the tuning, and whether freed blocks are kept. */
static void
gmlp_cuda_backend_set_tuning (GmlpBackendDevice        *device,
                              const GmlpBackendTuning  *tuning)
{
  gmlp_cuda_set_tuning (device, tuning);
  gmlp_cuda_block_cache_set_keep (device, tuning->block_cache != GMLP_TUNING_NEVER);
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
  .gemm_supported = gmlp_cuda_gemm_supported,
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
  .activation_quantize = gmlp_cuda_activation_quantize,

  /* Token permutation (gmlp-cuda-permute.c). */
  .routing_count = gmlp_cuda_routing_count,
  .routing_map = gmlp_cuda_routing_map,
  .permute = gmlp_cuda_permute,
  /* Router (gmlp-cuda-router.c). */
  .router_forward = gmlp_cuda_router_forward,
  .router_backward = gmlp_cuda_router_backward,
  .router_update_bias = gmlp_cuda_router_update_bias,

  .set_tuning = gmlp_cuda_backend_set_tuning,

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

  /* FP32 values as BF16 parts (gmlp-cuda-elementwise.c). */
  .split_bfloat16 = gmlp_cuda_split_bfloat16,
  .sum_parts = gmlp_cuda_sum_parts,
};

/* The module's one exported symbol; see GmlpBackendGetFunc. */
const GmlpBackend *
gmlp_backend_cuda_get (void)
{
  return &gmlp_cuda_backend;
}
