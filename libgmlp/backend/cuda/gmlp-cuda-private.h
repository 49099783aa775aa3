/* gmlp-cuda-private.h: what the files of the CUDA backend module share
 *
 * The module stands in floors, each calling only into those below it:
 *
 *  - gmlp-cuda-backend.c: the backend table, and the opening and closing
 *    of devices;
 *  - gmlp-cuda-gemm-entry.c: the gemm and gemm_supported entries, which
 *    describe each product and ask the route once, over the GEMM
 *    executors;
 *  - the executors, a file each: the GEMMs, bias, activations,
 *    quantization, permutation, the router, events, offloading,
 *    communicators and element-wise arithmetic, declared below;
 *  - gmlp-cuda-memory.c: alloc, free, tables and copies on the compute
 *    stream (gmlp-cuda-memory.h);
 *  - gmlp-cuda-graph.c: captures, graphs and the memory they keep
 *    (gmlp-cuda-graph.h);
 *  - gmlp-cuda-block-cache.c: freed blocks kept for reuse, and the real
 *    frees (gmlp-cuda-block-cache.h);
 *  - gmlp-cuda-device.c: the device's fields, errors, the current device,
 *    the pool and the scratch workspace (gmlp-cuda-device.h);
 *  - gmlp-cuda-route.c: which kernel or library runs a product, a pure
 *    function of the product, the device's properties and its tuning
 *    (gmlp-cuda-route.h; no CUDA, docs/routes.md), and the description
 *    of a product that it reads.
 *
 * A file of the lower five includes only the headers of the floors below
 * it, and its own; the executors and the table include this header, which
 * brings all five.
 *
 * Nothing here leaves the module: it is built with hidden visibility and
 * exports only gmlp_backend_cuda_get().
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-cuda-device.h"
#include "gmlp-cuda-block-cache.h"
#include "gmlp-cuda-graph.h"
#include "gmlp-cuda-memory.h"

G_BEGIN_DECLS

struct _GmlpBackendEvent
{
  cudaEvent_t  event;
  int          ordinal;   /* the device whose stream recorded it */
};

/* The GEMMs (docs/routes.md). gmlp-cuda-gemm-entry.c holds the backend's
 * one gemm entry and gemm_supported. Both describe the product once
 * (gmlp_cuda_route_describe(), with host sizes through the descriptor's
 * GmlpCudaGroups, and the Hopper kernel's answer), ask gmlp_cuda_route()
 * once, and hand its answer to the executors of the route: the Hopper and
 * the portable kernels for device sizes (gmlp-cuda-gemm-device.c), cuBLAS
 * (gmlp-cuda-gemm.c) and cuBLASLt (gmlp-cuda-gemm-fp8.c) for host sizes,
 * and the Hopper kernel for either. The executors check the call, and run
 * the route they are given; none describes or routes the product again.
 * The entry holds scratch_lock from the description (the route reads the
 * tuning) to the end of the execution. */
typedef struct {
  GmlpCudaRouteProduct  product;
  GmlpCudaRouteChoice   choice;
  /* The kernels' view of the product: with device sizes always, with host
   * sizes where the kernel was asked and the operands are laid out as it
   * reads them; what the Hopper kernel's route runs. */
  GmlpKernelDeviceGemm  kernel_gemm;
} GmlpCudaGemmRoute;

/* gmlp-cuda-gemm-entry.c: the gemm and gemm_supported entries. */
gboolean  gmlp_cuda_gemm            (GmlpBackendDevice      *device,
                                     const GmlpBackendGemm  *gemm,
                                     GError                **error);
gboolean  gmlp_cuda_gemm_supported  (GmlpBackendDevice      *device,
                                     const GmlpBackendGemm  *gemm,
                                     const char            **reason);

/* gmlp-cuda-gemm.c: 16-bit and FP32 products with host sizes (the route's
 * Hopper kernel and cuBLAS), the bias in the epilogue. */
G_GNUC_PRINTF (5, 6)
gboolean  gmlp_cuda_blas_fail       (GError            **error,
                                     const char         *library,
                                     const char         *what,
                                     cublasStatus_t      status,
                                     const char         *detail_format,
                                     ...);
gboolean  gmlp_cuda_cublas_init     (GmlpBackendDevice  *device,
                                     GError            **error);
void      gmlp_cuda_cublas_fini     (GmlpBackendDevice  *device);
gboolean  gmlp_cuda_gemm_groups     (GmlpBackendDevice        *device,
                                     const GmlpCudaGroups     *groups,
                                     const GmlpCudaGemmRoute  *route,
                                     GError                  **error);
/* gmlp-cuda-gemm-fp8.c: FP8 products with host sizes (the route's Hopper
 * kernel and cuBLASLt); _padded_supported says, without enqueuing
 * anything, whether the Hopper kernel takes the padded copies of
 * GMLP_CUDA_ROUTE_SM90_PADDED (FALSE: why, and the caller dequantizes). */
gboolean  gmlp_cuda_cublaslt_init   (GmlpBackendDevice  *device,
                                     GError            **error);
void      gmlp_cuda_cublaslt_fini   (GmlpBackendDevice  *device);
gboolean  gmlp_cuda_gemm_fp8_groups (GmlpBackendDevice        *device,
                                     const GmlpCudaGroups     *groups,
                                     const GmlpCudaGemmRoute  *route,
                                     GError                  **error);
gboolean  gmlp_cuda_gemm_fp8_padded_supported (GmlpBackendDevice     *device,
                                               const GmlpCudaGroups  *groups,
                                               const char           **reason);

/* gmlp-cuda-bias.c */
gboolean  gmlp_cuda_add_bias        (GmlpBackendDevice   *device,
                                     guint                n_groups,
                                     const gint64        *rows,
                                     gint64               n,
                                     int                  dtype,
                                     void * const        *c,
                                     const void * const  *bias,
                                     GError             **error);
gboolean  gmlp_cuda_bias_grad       (GmlpBackendDevice   *device,
                                     guint                n_groups,
                                     const gint64        *rows,
                                     gint64               n,
                                     int                  dtype,
                                     const void * const  *a,
                                     void * const        *dbias,
                                     GError             **error);

/* gmlp-cuda-activation.c */
gboolean  gmlp_cuda_activation      (GmlpBackendDevice   *device,
                                     int                  activation,
                                     guint                n_groups,
                                     const gint64        *rows,
                                     gint64               f,
                                     int                  dtype,
                                     const void * const  *in,
                                     const void * const  *d_out,
                                     void * const        *out,
                                     GError             **error);
gboolean  gmlp_cuda_activation_device (GmlpBackendDevice       *device,
                                       const GmlpBackendShape  *shape,
                                       int                      activation,
                                       int                      dtype,
                                       gconstpointer            in,
                                       gconstpointer            d_out,
                                       gpointer                 out,
                                       GError                 **error);

/* gmlp-cuda-event.c */
GmlpBackendEvent *gmlp_cuda_event_record      (GmlpBackendDevice  *device,
                                               GError            **error);
GmlpBackendEvent *gmlp_cuda_event_record_on_stream (GmlpBackendDevice  *device,
                                                    cudaStream_t        stream,
                                                    GError            **error);
gboolean          gmlp_cuda_event_synchronize (GmlpBackendEvent   *event,
                                               GError            **error);
gboolean          gmlp_cuda_event_query       (GmlpBackendEvent   *event);
gboolean          gmlp_cuda_event_wait        (GmlpBackendDevice  *device,
                                               GmlpBackendEvent   *event,
                                               GError            **error);
gboolean          gmlp_cuda_event_elapsed     (GmlpBackendEvent   *start,
                                               GmlpBackendEvent   *end,
                                               double             *ms,
                                               GError            **error);
gpointer          gmlp_cuda_event_get_native  (GmlpBackendEvent   *event);
void              gmlp_cuda_event_free        (GmlpBackendEvent   *event);

/* gmlp-cuda-offload.c */
gpointer          gmlp_cuda_host_alloc        (GmlpBackendDevice  *device,
                                               gsize               nbytes,
                                               GError            **error);
void              gmlp_cuda_host_free         (GmlpBackendDevice  *device,
                                               gpointer            ptr);
GmlpBackendEvent *gmlp_cuda_copy_async        (GmlpBackendDevice  *device,
                                               gpointer            dst,
                                               gconstpointer       src,
                                               gsize               nbytes,
                                               gboolean            to_host,
                                               gboolean            after_compute,
                                               GError            **error);
gpointer          gmlp_cuda_copy_stream_alloc (GmlpBackendDevice  *device,
                                               gsize               nbytes,
                                               GError            **error);
void              gmlp_cuda_free_after_copies (GmlpBackendDevice  *device,
                                               gpointer            ptr);


/* Tensor arithmetic (gmlp-cuda-elementwise.c). */
gboolean  gmlp_cuda_axpby           (GmlpBackendDevice      *device,
                                     const GmlpBackendShape *shape,
                                     gconstpointer           x,
                                     int                     x_dtype,
                                     gpointer                y,
                                     int                     y_dtype,
                                     float                   alpha,
                                     float                   beta,
                                     GError                **error);
gboolean  gmlp_cuda_sum_squares     (GmlpBackendDevice      *device,
                                     const GmlpBackendShape *shape,
                                     gconstpointer           x,
                                     int                     dtype,
                                     double                 *result,
                                     GError                **error);
gboolean  gmlp_cuda_split_bfloat16  (GmlpBackendDevice          *device,
                                     const GmlpBackendSplit     *split,
                                     GError                    **error);
gboolean  gmlp_cuda_sum_parts       (GmlpBackendDevice          *device,
                                     const GmlpBackendSumParts  *sum,
                                     GError                    **error);
gboolean  gmlp_cuda_convert         (GmlpBackendDevice      *device,
                                     const GmlpBackendShape *shape,
                                     gconstpointer           src,
                                     int                     src_dtype,
                                     gpointer                dst,
                                     int                     dst_dtype,
                                     GError                **error);
gboolean  gmlp_cuda_fill_random     (GmlpBackendDevice      *device,
                                     gpointer                dst,
                                     int                     dtype,
                                     guint64                 n_elements,
                                     guint64                 seed,
                                     float                   scale,
                                     GError                **error);

/* Group sizes on the device (gmlp-cuda-gemm-device.c): the kernels' view
 * of the descriptor (tables holds GMLP_CUDA_DEVICE_TABLES × n_groups
 * pointers), and the executor of its route, libgmlp's own Hopper kernel or
 * the portable one. */
#define GMLP_CUDA_DEVICE_TABLES 4
void      gmlp_cuda_kernel_device_gemm    (const GmlpBackendGemm    *gemm,
                                           gpointer                 *tables,
                                           GmlpKernelDeviceGemm     *kernel_gemm);
gboolean  gmlp_cuda_gemm_device_sizes     (GmlpBackendDevice        *device,
                                           const GmlpCudaGemmRoute  *route,
                                           GError                  **error);
/* The Hopper kernel, for every product (gmlp-cuda-gemm-device.c): whether it
 * covers a product on this device (if not, why in *reason, a static
 * string), and its launch, for a product it covers. */
gboolean  gmlp_cuda_gemm_sm90_covers (GmlpBackendDevice           *device,
                                      const GmlpKernelDeviceGemm  *kernel_gemm,
                                      const char                 **reason);
gboolean  gmlp_cuda_gemm_sm90_run    (GmlpBackendDevice           *device,
                                      const GmlpKernelDeviceGemm  *kernel_gemm,
                                      GError                     **error);
/* The kernel's description of a product with host sizes, bias included:
 * FALSE (and why, in *reason) where the operands are not laid out as a
 * grouped tensor lays them out, which the kernel needs. */
gboolean  gmlp_cuda_groups_kernel_gemm (const GmlpCudaGroups  *groups,
                                        GmlpKernelDeviceGemm  *kernel_gemm,
                                        const char           **reason);

/* gmlp-cuda-bias.c */
gboolean  gmlp_cuda_bias_grad_device (GmlpBackendDevice            *device,
                                      const GmlpBackendShape       *shape,
                                      int                           dtype,
                                      gconstpointer                 a,
                                      void * const                 *dbias,
                                      GError                      **error);

/* gmlp-cuda-comm.c: communicators on NCCL, loaded at run time */
gboolean          gmlp_cuda_comm_unique_id  (GmlpBackendDevice  *device,
                                             guint8             *id,
                                             GError            **error);
GmlpBackendComm  *gmlp_cuda_comm_init       (GmlpBackendDevice  *device,
                                             const guint8       *id,
                                             int                 rank,
                                             int                 world_size,
                                             guint               timeout_ms,
                                             GError            **error);
gboolean          gmlp_cuda_comm_join       (GmlpBackendComm    *comm,
                                             GError            **error);
void              gmlp_cuda_comm_abort      (GmlpBackendComm    *comm);
void              gmlp_cuda_comm_free       (GmlpBackendComm    *comm);
gboolean          gmlp_cuda_comm_all_reduce (GmlpBackendComm    *comm,
                                             gpointer            data,
                                             gsize               count,
                                             int                 dtype,
                                             int                 op,
                                             GError            **error);
gboolean          gmlp_cuda_comm_all_gather (GmlpBackendComm    *comm,
                                             gconstpointer       send,
                                             gpointer            recv,
                                             gsize               nbytes,
                                             GError            **error);
gboolean          gmlp_cuda_comm_all_to_all (GmlpBackendComm    *comm,
                                             gconstpointer       send,
                                             const gsize        *send_offsets,
                                             const gsize        *send_bytes,
                                             gpointer            recv,
                                             const gsize        *recv_offsets,
                                             const gsize        *recv_bytes,
                                             GmlpBackendEvent  **done,
                                             GError            **error);

G_END_DECLS
