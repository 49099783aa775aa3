/* gmlp-cuda-device.h: the device, at the bottom of the CUDA backend module
 *
 * The fields of a GmlpBackendDevice, and what works on the device alone
 * (gmlp-cuda-device.c). Nothing here leaves the module: it is built with
 * hidden visibility and exports only gmlp_backend_cuda_get().
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <cublas_v2.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "gmlp-error.h"
#include "gmlp-kernels.h"
#include "backend/gmlp-backend.h"
#include "gmlp-cuda-blas-plans.h"
#include "gmlp-cuda-route.h"

G_BEGIN_DECLS

/* The module does not link libgmlp, so it cannot call gmlp_error_quark();
 * the quark of the same string is the same quark. */
#define GMLP_CUDA_ERROR (g_quark_from_static_string ("gmlp-error-quark"))

/* alloc (0) still hands out a distinct pointer of this many bytes, as do
 * copy_stream_alloc (0) and host_alloc (0). */
#define GMLP_CUDA_MIN_ALLOCATION 256

/* A capture in progress (gmlp-cuda-graph.c). */
typedef struct _GmlpCudaCapture GmlpCudaCapture;

struct _GmlpBackendDevice
{
  int             ordinal;
  /* The compute stream: all work but the offload copies. */
  cudaStream_t    stream;
  /* The copy stream, so that offload copies overlap compute
   * (gmlp-cuda-offload.c), and an event without timing that orders it after
   * the compute stream; the event is re-recorded for every use. */
  cudaStream_t    copy_stream;
  cudaEvent_t     copy_after_compute;
  cudaMemPool_t   pool;
  /* Bound to stream, with cublas_workspace (from pool) as its workspace. */
  cublasHandle_t  cublas;
  void           *cublas_workspace;
  /* The loop of per-group cuBLAS calls alternates its products between
   * stream and side_stream, each with a handle and workspace of its own, so
   * that one product's last wave and cuBLAS's set-up of the next overlap
   * (gmlp_cuda_run_looped()); side_fork orders side_stream after stream,
   * side_join stream after side_stream, both re-recorded for every use. */
  cudaStream_t    side_stream;
  cublasHandle_t  side_cublas;
  void           *side_cublas_workspace;
  cudaEvent_t     side_fork, side_join;
  /* The loop's products go through cuBLASLt with plans kept per problem
   * (gmlp-cuda-blas-plans.c), on the workspace of the stream's handle. */
  GmlpCudaBlasPlans *blas_plans;
  /* FP8 products (gmlp-cuda-gemm-fp8.c): cuBLASLt, with its own workspace
   * from pool, used in compute-stream order. */
  cublasLtHandle_t cublaslt;
  void           *cublaslt_workspace;
  char           *name;
  /* What the route reads of the device (gmlp-cuda-route.h), read once by
   * open_device. */
  GmlpCudaDeviceProps props;

  /* Host threads share the device and its streams. Kernels enqueued on one
   * stream run in order, but a product is several calls (a table or plan
   * written into workspace, then the kernel that reads it; cuBLAS's loop
   * with its fork and join events; cuBLAS and cuBLASLt with their
   * workspaces), and two threads' calls must not interleave inside one:
   * the products (gemm, gemm_supported, bias_grad_device) and
   * activation_device hold this while they enqueue. Recursive, as a
   * product may fall back to another. */
  GRecMutex         scratch_lock;

  /* Graphs (gmlp-cuda-graph.c). capture_lock guards capture and kept, and
   * the use of outside_stream: memory is freed from any thread. */
  GMutex            capture_lock;
  GmlpCudaCapture  *capture;         /* the capture of stream in progress, or NULL */
  GHashTable       *kept;            /* device pointer -> its references from graphs */
  /* Allocations and uploads during a capture run here, outside it, after
   * capture_start, recorded on stream just before the capture began. */
  cudaStream_t      outside_stream;
  cudaEvent_t       capture_start;

  /* Scratch of the device-sizes kernels (gmlp_cuda_device_workspace()):
   * the buffer in use, its size, and the smaller buffers it replaced, which
   * graphs captured earlier may still use; all freed by close_device. */
  void             *workspace;
  gsize             workspace_bytes;
  GSList           *workspace_retired;

  /* Freed blocks kept for the next allocation of their size
   * (gmlp-cuda-block-cache.c): the live blocks (pointer -> size class) and
   * the kept ones (size class -> GPtrArray of pointers), under cache_lock. */
  GMutex            cache_lock;
  GHashTable       *live_blocks;
  GHashTable       *kept_blocks;
  gsize             kept_bytes, kept_limit;
  gsize             keep_limit;   /* kept_limit while the cache is on */

  /* The tuning (gmlp_cuda_set_tuning()): what the routes read, and its
   * Hopper-kernel part in the kernels' terms; zeros (the heuristics'
   * choices) from open_device. Written and read under scratch_lock. */
  GmlpBackendTuning     tuning;
  GmlpKernelSm90Tuning  sm90_tuning;
};

/* gmlp-cuda-device.c */
gboolean  gmlp_cuda_fail            (GError            **error,
                                     const char         *what,
                                     cudaError_t         err);
gboolean  gmlp_cuda_kernel_result   (GmlpKernelStatus    status,
                                     const char         *what,
                                     GError            **error);
cudaError_t gmlp_cuda_set_current   (int                 ordinal);
gboolean  gmlp_cuda_activate        (GmlpBackendDevice  *device,
                                     GError            **error);
gpointer  gmlp_cuda_alloc_on_stream (GmlpBackendDevice  *device,
                                     gsize               nbytes,
                                     cudaStream_t        stream,
                                     GError            **error);
/* Makes the copy stream wait for the compute stream's work so far; the
 * device must be current. On failure *what names the call. */
cudaError_t gmlp_cuda_copies_after_compute (GmlpBackendDevice  *device,
                                            const char        **what);

/* The kernels' view of a backend shape. */
void      gmlp_cuda_kernel_shape    (const GmlpBackendShape *shape,
                                     GmlpKernelGroupedShape *kernel_shape);

/* The device's tuning from now on, under scratch_lock. */
void      gmlp_cuda_set_tuning      (GmlpBackendDevice        *device,
                                     const GmlpBackendTuning  *tuning);

/* Scratch for the device-sizes kernels (end of gmlp-cuda-device.c): a
 * device buffer of at least nbytes for work enqueued on the compute stream.
 * Successive calls return the same buffer until one needs more; the buffer
 * is then replaced by a larger one, and the old one stays allocated until
 * close_device, because graphs captured earlier may still use it. Works
 * while the stream is being captured; never waits for the stream (growing
 * it calls cudaMalloc). */
gpointer  gmlp_cuda_device_workspace      (GmlpBackendDevice  *device,
                                           gsize               nbytes,
                                           GError            **error);
/* Frees every workspace buffer; close_device calls it. */
void      gmlp_cuda_device_workspace_fini (GmlpBackendDevice  *device);

G_END_DECLS
