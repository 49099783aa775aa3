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
