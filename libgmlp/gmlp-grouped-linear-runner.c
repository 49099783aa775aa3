/* gmlp-grouped-linear-runner.c: how GmlpGroupedLinear's products run
 *
 * What the layer's plain products (gmlp-grouped-linear-products.c) and FP8
 * products (gmlp-grouped-linear-fp8.c) share, below both: the checks of an
 * activation's device and shape and of the offload context, the outputs
 * made with the group sizes of an input, the operands of the backend's
 * descriptor (GmlpBackendGemm) and their group sizes, and
 * gmlp_linear_run_product(), which hands a Product
 * (gmlp-grouped-linear-impl.h) to the backend's gemm as one descriptor,
 * with the group sizes on the host or only on the device (split products
 * go to gmlp-grouped-linear-split.c); then the bias gradient, the count of
 * a weight-gradient computation's writes, and the dtype that FP8's
 * fall-back multiplies in.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-grouped-linear-impl.h"
#include "gmlp-error.h"
#include "gmlp-offload-context-private.h"

/* The dtype the fallback multiplies dequantized operands in: 16 bits, for
 * the tensor cores; FP16 for an FP16 layer, whose outputs the backends'
 * products only write from FP16 or FP32 operands. */
GmlpDType
gmlp_linear_fp8_fallback_dtype (GmlpGroupedLinear *self)
{
  return self->dtype == GMLP_DTYPE_FLOAT16 ? GMLP_DTYPE_FLOAT16 : GMLP_DTYPE_BFLOAT16;
}

/* That an activation (input or grad_output) is on the layer's device. */
gboolean
gmlp_linear_check_activation_device (GmlpGroupedLinear  *self,
                                     GmlpGroupedTensor  *tensor,
                                     const char         *what,
                                     GError            **error)
{
  if (gmlp_grouped_tensor_get_device (tensor) != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%s is on %s, the layer on %s", what,
                   gmlp_device_get_name (gmlp_grouped_tensor_get_device (tensor)),
                   gmlp_device_get_name (self->device));
      return FALSE;
    }
  return TRUE;
}

/* That an activation has the layer's groups and cols columns. */
gboolean
gmlp_linear_check_activation_shape (GmlpGroupedLinear  *self,
                                    GmlpGroupedTensor  *tensor,
                                    gint64              cols,
                                    const char         *what,
                                    GError            **error)
{
  if (gmlp_grouped_tensor_get_n_groups (tensor) != self->n_groups)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "%s has %u groups; the layer has %u", what,
                   gmlp_grouped_tensor_get_n_groups (tensor), self->n_groups);
      return FALSE;
    }
  if (gmlp_grouped_tensor_get_cols (tensor) != cols)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "%s has %" G_GINT64_FORMAT " columns; the layer needs %" G_GINT64_FORMAT,
                   what, gmlp_grouped_tensor_get_cols (tensor), cols);
      return FALSE;
    }
  return TRUE;
}

/* An enabled offload context of another device cannot take this layer's
 * activations, and offload cannot be captured in a graph (its copies go to
 * pinned host buffers that the host recycles): both said before anything
 * is written. */
gboolean
gmlp_linear_check_offload_context (GmlpGroupedLinear  *self,
                                   GError            **error)
{
  gboolean enabled;
  GmlpOffloadContext *context = gmlp_offload_context_peek_innermost (&enabled);

  if (context != NULL && enabled && gmlp_offload_context_get_device (context) != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The innermost offload context is for %s, the layer is on %s",
                   gmlp_device_get_name (gmlp_offload_context_get_device (context)),
                   gmlp_device_get_name (self->device));
      return FALSE;
    }
  if (context != NULL && enabled && gmlp_device_is_capturing (self->device))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "Offloading saved activations cannot be captured in a graph: disable the "
                   "offload context (push_thread_default (FALSE)) around the captured step");
      return FALSE;
    }
  return TRUE;
}

/* A new activation of @cols columns with the group sizes of @like: the
 * same host sizes, or, for device-only sizes, the same sizes tensor and row
 * capacity (so nothing on the host needs to read them). */
GmlpGroupedTensor *
gmlp_linear_new_activation_like (GmlpGroupedLinear  *self,
                                 GmlpGroupedTensor  *like,
                                 gint64              cols,
                                 GError            **error)
{
  GmlpGroupedTensor *sizes;

  if (gmlp_grouped_tensor_has_host_sizes (like))
    return gmlp_grouped_tensor_new (self->device, self->dtype, gmlp_grouped_tensor_peek_rows (like),
                                    self->n_groups, cols, error);

  sizes = gmlp_grouped_tensor_get_sizes (like, error);
  if (sizes == NULL)
    return NULL;
  return gmlp_grouped_tensor_new_with_device_sizes (self->device, self->dtype, sizes,
                                                    gmlp_grouped_tensor_get_row_capacity (like),
                                                    cols, error);
}

GmlpBackendOperand
gmlp_linear_rows_operand (GmlpGroupedTensor *tensor)
{
  return (GmlpBackendOperand) {
    .layout = GMLP_BACKEND_OPERAND_ROWS,
    .dtype = (int) gmlp_grouped_tensor_get_dtype (tensor),
    .base = gmlp_grouped_tensor_get_data (tensor),
  };
}

/* Member i of a uniform tensor starts i strides from its data. */
static guint64
uniform_stride (GmlpGroupedTensor *uniform)
{
  return gmlp_grouped_tensor_get_n_groups (uniform) > 1 ?
         (guint64) gmlp_grouped_tensor_get_member_offset (uniform, 1) : 0;
}

GmlpBackendOperand
gmlp_linear_fixed_operand (GmlpGroupedTensor *uniform)
{
  return (GmlpBackendOperand) {
    .layout = GMLP_BACKEND_OPERAND_STRIDED,
    .dtype = (int) gmlp_grouped_tensor_get_dtype (uniform),
    .base = gmlp_grouped_tensor_get_data (uniform),
    .stride = uniform_stride (uniform),
  };
}

GmlpBackendOperand
gmlp_linear_param_operand (const Param *param)
{
  GmlpBackendOperand op;

  if (!param->rebound && param->grouped != NULL)
    return gmlp_linear_fixed_operand (param->grouped);
  op = (GmlpBackendOperand) {
    .layout = GMLP_BACKEND_OPERAND_TABLE,
    .dtype = (int) gmlp_grouped_tensor_get_dtype (param->members[0]),
    .table = param->table,
  };
  return op;
}

gboolean
gmlp_linear_gemm_sizes (GmlpBackendGemm    *gemm,
                        GmlpGroupedTensor  *sized_by,
                        GError            **error)
{
  GmlpBackendShape shape;

  gemm->rows = gmlp_grouped_tensor_peek_rows (sized_by);
  if (gemm->rows != NULL)
    return TRUE;
  if (!gmlp_grouped_tensor_get_backend_shape (sized_by, &shape, error))
    return FALSE;
  gemm->device_rows = shape.device_rows;
  gemm->row_capacity = shape.row_capacity;
  return TRUE;
}

gboolean
gmlp_linear_run_product (GmlpGroupedLinear  *self,
                         const Product      *product,
                         GError            **error)
{
  gboolean wgrad = product->kind == GMLP_GEMM_WGRAD;
  int ab_dtype = (int) (product->dequantized ? gmlp_linear_fp8_fallback_dtype (self) : self->dtype);
  GmlpBackendGemm gemm = {
    .kind = product->kind,
    .n_groups = self->n_groups,
    .n = self->out_features,
    .k = self->in_features,
    .a = gmlp_linear_rows_operand (product->a),
    .b = wgrad ? gmlp_linear_rows_operand (product->b_rows) : gmlp_linear_param_operand (product->fixed),
    .c = wgrad ? gmlp_linear_param_operand (product->fixed) : gmlp_linear_rows_operand (product->c_rows),
    .accumulate = wgrad ? product->accumulate : NULL,
  };

  if (gmlp_linear_product_splits (self, product))
    return gmlp_linear_run_split_product (self, product, error);
  gemm.a.dtype = gemm.b.dtype = ab_dtype;
  gemm.c.dtype = (int) product->c_dtype;
  /* The bias goes into the epilogue, before the product's one rounding. */
  if (product->bias)
    gemm.bias = gmlp_linear_param_operand (&self->bias);
  if (!gmlp_linear_gemm_sizes (&gemm, product->sized_by, error))
    return FALSE;
  return GMLP_DEVICE_CALL (self->device, gemm, &gemm, error);
}

/* db_i = Σ_rows dy_i into @pdb[i], over the group sizes of @sized_by. */
gboolean
gmlp_linear_run_bias_grad_into (GmlpGroupedLinear  *self,
                                GmlpGroupedTensor  *sized_by,
                                GmlpGroupedTensor  *grad_output,
                                void * const       *pdb,
                                GError            **error)
{
  const gint64 *rows = gmlp_grouped_tensor_peek_rows (sized_by);
  GmlpBackendShape shape;

  if (rows != NULL)
    {
      g_autofree gpointer *pa = g_new (gpointer, self->n_groups);
      guint g;

      for (g = 0; g < self->n_groups; g++)
        pa[g] = gmlp_grouped_tensor_get_member_data (grad_output, g);
      return GMLP_DEVICE_CALL (self->device, bias_grad, self->n_groups, rows, self->out_features,
                               (int) self->dtype, (const void * const *) pa, pdb, error);
    }

  if (!gmlp_grouped_tensor_get_backend_shape (sized_by, &shape, error))
    return FALSE;
  shape.cols = self->out_features;
  return GMLP_DEVICE_CALL (self->device, bias_grad_device, &shape, (int) self->dtype,
                           gmlp_grouped_tensor_get_data (grad_output), pdb, error);
}

/* db_i = Σ_rows dy_i into bgrad, over the group sizes of @sized_by. */
gboolean
gmlp_linear_run_bias_grad (GmlpGroupedLinear  *self,
                           GmlpGroupedTensor  *sized_by,
                           GmlpGroupedTensor  *grad_output,
                           GError            **error)
{
  return gmlp_linear_run_bias_grad_into (self, sized_by, grad_output, self->bgrad.table, error);
}

/* Counts the write of a weight-gradient computation in the versions of its
 * outputs: once per storage (per-group main_grads may be views of one). */
void
gmlp_linear_bump_wgrad_versions (GmlpGroupedLinear *self)
{
  GmlpVersionCounter *last = NULL;
  guint g;

  if (!has_flag (self, GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION))
    gmlp_grouped_tensor_bump_version (self->wgrad.grouped);
  else if (has_flag (self, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT))
    gmlp_grouped_tensor_bump_version (self->main_grad.grouped);
  else
    for (g = 0; g < self->n_groups; g++)
      {
        GmlpVersionCounter *counter = gmlp_grouped_tensor_get_version_counter (self->main_grad.members[g]);

        if (counter != last)
          gmlp_grouped_tensor_bump_version (self->main_grad.members[g]);
        last = counter;
      }
  if (self->bgrad.grouped != NULL)
    gmlp_grouped_tensor_bump_version (self->bgrad.grouped);
}
