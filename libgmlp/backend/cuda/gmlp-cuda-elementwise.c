/* gmlp-cuda-elementwise.c: tensor arithmetic, conversion and random fill of the CUDA backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-cuda-private.h"

gboolean
gmlp_cuda_axpby (GmlpBackendDevice      *device,
                 const GmlpBackendShape *shape,
                 gconstpointer           x,
                 int                     x_dtype,
                 gpointer                y,
                 int                     y_dtype,
                 float                   alpha,
                 float                   beta,
                 GError                **error)
{
  GmlpKernelGroupedShape kernel_shape;

  if (!gmlp_cuda_activate (device, error))
    return FALSE;
  gmlp_cuda_kernel_shape (shape, &kernel_shape);
  return gmlp_cuda_kernel_result (gmlp_kernel_grouped_axpby (&kernel_shape, x, x_dtype, y, y_dtype,
                                                             alpha, beta, device->stream),
                                  "gmlp_kernel_grouped_axpby", error);
}

gboolean
gmlp_cuda_sum_squares (GmlpBackendDevice      *device,
                       const GmlpBackendShape *shape,
                       gconstpointer           x,
                       int                     dtype,
                       double                 *result,
                       GError                **error)
{
  GmlpKernelGroupedShape kernel_shape;
  g_autofree double *host = NULL;
  double *partials;
  gsize n, i;
  cudaError_t err;
  gboolean ok;

  *result = 0.0;
  if (!gmlp_cuda_activate (device, error))
    return FALSE;
  gmlp_cuda_kernel_shape (shape, &kernel_shape);
  n = gmlp_kernel_grouped_sum_squares_partials (&kernel_shape);
  if (n == 0)
    return TRUE;

  partials = gmlp_cuda_alloc (device, n * sizeof (double), error);
  if (partials == NULL)
    return FALSE;
  ok = gmlp_cuda_kernel_result (gmlp_kernel_grouped_sum_squares (&kernel_shape, x, dtype, partials,
                                                                 device->stream),
                                "gmlp_kernel_grouped_sum_squares", error);
  if (ok)
    {
      /* The result goes to the host: wait for it, then add the partials in
       * order, so the same input gives the same sum every time. */
      host = g_new (double, n);
      err = cudaMemcpyAsync (host, partials, n * sizeof (double), cudaMemcpyDeviceToHost,
                             device->stream);
      if (err == cudaSuccess)
        err = cudaStreamSynchronize (device->stream);
      if (err != cudaSuccess)
        ok = gmlp_cuda_fail (error, "cudaMemcpyAsync (sum of squares)", err);
    }
  gmlp_cuda_free (device, partials);
  if (!ok)
    return FALSE;

  for (i = 0; i < n; i++)
    *result += host[i];
  return TRUE;
}

G_STATIC_ASSERT (GMLP_KERNEL_MAX_SPLIT_OUTPUTS == GMLP_BACKEND_MAX_SPLIT_OUTPUTS);
G_STATIC_ASSERT (GMLP_KERNEL_MAX_SPLIT_PARTS == GMLP_BACKEND_MAX_SPLIT_PARTS);

/* The parts of FP32 values (split.cu). The checks are the backend's
 * (gmlp-backend.h), made before anything is enqueued. */
gboolean
gmlp_cuda_split_bfloat16 (GmlpBackendDevice       *device,
                          const GmlpBackendSplit  *split,
                          GError                 **error)
{
  const char *invalid = gmlp_backend_split_invalid (split);
  GmlpKernelSplit kernel_split;

  if (invalid != NULL)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: split_bfloat16: %s", invalid);
      return FALSE;
    }
  if (split->rows == 0 || split->cols == 0)
    return TRUE;
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  kernel_split = (GmlpKernelSplit) {
    .rows = split->rows,
    .cols = split->cols,
    .src = split->src,
    .src_stride = split->src_stride,
    .n_parts = split->n_parts,
    .dst = split->dst,
    .dst_row_stride = split->dst_row_stride,
    .dst_col_stride = split->dst_col_stride,
    .n_outputs = split->n_outputs,
  };
  for (guint j = 0; j < split->n_outputs; j++)
    {
      kernel_split.part[j] = split->part[j];
      kernel_split.offset[j] = split->offset[j];
    }
  return gmlp_cuda_kernel_result (gmlp_kernel_split_bfloat16 (&kernel_split, device->stream),
                                  "gmlp_kernel_split_bfloat16", error);
}

gboolean
gmlp_cuda_sum_parts (GmlpBackendDevice          *device,
                     const GmlpBackendSumParts  *sum,
                     GError                    **error)
{
  const char *invalid = gmlp_backend_sum_parts_invalid (sum);
  GmlpKernelSumParts kernel_sum;

  if (invalid != NULL)
    {
      g_set_error (error, GMLP_CUDA_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CUDA: sum_parts: %s", invalid);
      return FALSE;
    }
  if (sum->rows == 0 || sum->cols == 0)
    return TRUE;
  if (!gmlp_cuda_activate (device, error))
    return FALSE;

  kernel_sum = (GmlpKernelSumParts) {
    .rows = sum->rows,
    .cols = sum->cols,
    .src = sum->src,
    .src_stride = sum->src_stride,
    .n_parts = sum->n_parts,
    .dst = sum->dst,
    .dst_stride = sum->dst_stride,
    .accumulate = sum->accumulate ? 1 : 0,
  };
  for (guint q = 0; q < sum->n_parts; q++)
    kernel_sum.offset[q] = sum->offset[q];
  return gmlp_cuda_kernel_result (gmlp_kernel_sum_parts (&kernel_sum, device->stream),
                                  "gmlp_kernel_sum_parts", error);
}

gboolean
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

gboolean
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
