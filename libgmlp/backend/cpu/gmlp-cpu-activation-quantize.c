/* gmlp-cpu-activation-quantize.c: activation and FP8 quantization of the
 * FC2 input of a GroupedMLP, on the CPU backend
 *
 * The reference for the fused CUDA kernel. Group by group: the activation
 * of the group's rows goes, in FP32 and rounded to the dtype as the
 * activation entry stores it (gmlp-activation-numeric.h), into a scratch
 * buffer the size of the group's output, which the CPU quantize code
 * (gmlp-cpu-quantize.c) then quantizes into the group's members of the
 * outputs, with the group's row of the delayed-scaling state. The result is
 * therefore that of the activation entry followed by the quantize entry, by
 * construction; the CPU has no memory traffic to save, and only the group's
 * scratch is ever held.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "backend/cpu/gmlp-cpu-activation-quantize.h"
#include "backend/cpu/gmlp-cpu-quantize.h"
#include "gmlp-activation-numeric.h"
#include "gmlp-error.h"
#include "gmlp-numeric.h"
#include "gmlp-quantize-numeric.h"

G_STATIC_ASSERT ((int) GMLP_ACT_GELU == (int) GMLP_NUM_ACT_GELU);
G_STATIC_ASSERT ((int) GMLP_ACT_RELU == (int) GMLP_NUM_ACT_RELU);
G_STATIC_ASSERT ((int) GMLP_ACT_SRELU == (int) GMLP_NUM_ACT_SRELU);
G_STATIC_ASSERT ((int) GMLP_ACT_SWIGLU == (int) GMLP_NUM_ACT_SWIGLU);
G_STATIC_ASSERT ((int) GMLP_ACT_GEGLU == (int) GMLP_NUM_ACT_GEGLU);

static gboolean
check_arguments (const GmlpBackendShape  *shape,
                 int                      activation,
                 gconstpointer            in,
                 int                      dtype,
                 int                      recipe,
                 int                      flags,
                 int                      fp8_dtype,
                 gpointer                 data,
                 gpointer                 scale_inv,
                 gpointer                 columnwise,
                 gpointer                 columnwise_scale_inv,
                 float                   *state,
                 guint                    history_length,
                 GError                 **error)
{
  const char *why = NULL;

  if (dtype != GMLP_NUM_FLOAT32 && dtype != GMLP_NUM_FLOAT16 && dtype != GMLP_NUM_BFLOAT16)
    why = "the input must be float32, float16 or bfloat16";
  else if (fp8_dtype != GMLP_NUM_FLOAT8_E4M3 && fp8_dtype != GMLP_NUM_FLOAT8_E5M2)
    why = "the target must be an FP8 dtype";
  else if (activation < GMLP_ACT_GELU || activation > GMLP_ACT_GEGLU)
    why = "unknown activation";
  else if (recipe < GMLP_QUANT_DELAYED || recipe > GMLP_QUANT_MXFP8)
    why = "unknown scaling recipe";
  else if (recipe == GMLP_QUANT_DELAYED &&
           (state == NULL || history_length < 1 || history_length > kGmlpQuantMaxHistory))
    why = "delayed scaling needs its state";
  else if (shape->device_rows == NULL || shape->cols < 1 || shape->cols > G_MAXINT32 ||
           shape->row_capacity < 0)
    why = "invalid shape";
  else if (in == NULL || data == NULL || scale_inv == NULL)
    why = "missing operand";
  else if (columnwise != NULL && gmlp_quant_columnwise_has_scales (recipe, flags) &&
           columnwise_scale_inv == NULL)
    why = "the columnwise copy needs its scales";

  if (why == NULL)
    return TRUE;
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
               "CPU: activation and quantization: %s", why);
  return FALSE;
}

gboolean
gmlp_cpu_activation_quantize (GmlpBackendDevice          *device,
                              const GmlpBackendQuantize  *quantize,
                              GError                    **error)
{
  const GmlpBackendShape *shape = &quantize->shape;
  int activation = quantize->activation;
  gconstpointer in = quantize->src;
  int dtype = quantize->src_dtype;
  int recipe = quantize->recipe, flags = quantize->flags, fp8_dtype = quantize->fp8_dtype;
  gpointer data = quantize->data, scale_inv = quantize->scale_inv;
  gpointer columnwise = quantize->columnwise, columnwise_scale_inv = quantize->columnwise_scale_inv;
  gint64 *derived_rows = quantize->derived_rows;
  float *state = quantize->state;
  guint history_length = quantize->history_length;
  const gboolean gated = gmlp_act_is_gated (activation);
  gint64 f = shape->cols, in_cols;
  gint64 rows_left = shape->row_capacity;
  GmlpCpuQuantLayout layout;
  gboolean own_column_scales;
  guint32 stride, size;
  guint g;

  if (shape->n_groups == 0)
    return TRUE;
  if (!check_arguments (shape, activation, in, dtype, recipe, flags, fp8_dtype, data, scale_inv,
                        columnwise, columnwise_scale_inv, state, history_length, error))
    return FALSE;

  size = gmlp_num_dtype_size (dtype);
  in_cols = gated ? 2 * f : f;
  /* The outputs' members lie where a quantization of in would put them. */
  gmlp_cpu_quant_layout_init (&layout, recipe, flags, f, (guint64) in_cols * size);
  own_column_scales = columnwise != NULL && gmlp_quant_columnwise_has_scales (recipe, flags);
  stride = gmlp_quant_state_stride (history_length);

  for (g = 0; g < shape->n_groups; g++)
    {
      /* Clamped to the capacity as every backend clamps. */
      gint64 m = CLAMP (shape->device_rows[g], 0, rows_left);
      const guint8 *group_in = (const guint8 *) in + layout.offset[GMLP_CPU_QUANT_SRC];
      g_autofree guint8 *act = g_malloc (MAX ((gsize) m * (gsize) f * size, 1));
      GmlpBackendShape one = { .device_rows = &m, .n_groups = 1, .cols = f, .row_capacity = m };
      gint64 r, j;

      rows_left -= m;
      for (r = 0; r < m; r++)
        for (j = 0; j < f; j++)
          {
            guint64 i = (guint64) r * (guint64) in_cols + (guint64) j;
            float a = gmlp_num_load_float (group_in, dtype, i);
            float b = gated ? gmlp_num_load_float (group_in, dtype, i + (guint64) f) : 1.0f;

            gmlp_num_store_float (act, dtype, (guint64) r * (guint64) f + (guint64) j,
                                  gmlp_act_forward (activation, a, b));
          }

      {
        GmlpBackendQuantize one_quantize = {
          .shape = one,
          .recipe = recipe,
          .flags = flags,
          .fp8_dtype = fp8_dtype,
          .src = act,
          .src_dtype = dtype,
          .data = (guint8 *) data + layout.offset[GMLP_CPU_QUANT_DATA],
          .scale_inv = (guint8 *) scale_inv + layout.offset[GMLP_CPU_QUANT_SCALE],
          .columnwise = columnwise != NULL ? (guint8 *) columnwise + layout.offset[GMLP_CPU_QUANT_DATA]
                                           : NULL,
          .columnwise_scale_inv = own_column_scales ? (guint8 *) columnwise_scale_inv +
                                                      layout.offset[GMLP_CPU_QUANT_COLUMN_SCALE]
                                                    : NULL,
          .derived_rows = derived_rows != NULL ? derived_rows + g : NULL,
          .state = state != NULL ? state + (gsize) g * stride : NULL,
          .history_length = history_length,
        };

        if (!gmlp_cpu_quantize (device, &one_quantize, error))
          return FALSE;
      }

      gmlp_cpu_quant_layout_next_group (&layout, m);
    }
  return TRUE;
}
