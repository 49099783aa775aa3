/* gmlp-cpu-quantize.c: FP8 quantization on the CPU backend
 *
 * The reference for the CUDA kernels: the same arithmetic
 * (gmlp-quantize-numeric.h), the same layouts and the same clamping of the
 * group sizes, visited block by block in plain loops. Since every amax is an
 * exact maximum and every scale and element a pure function of its inputs,
 * the order of the loops does not change a bit of the result. The layouts
 * (GmlpCpuQuantLayout) are shared with the fused activation and
 * quantization (gmlp-cpu-activation-quantize.c).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "backend/cpu/gmlp-cpu-quantize.h"
#include "gmlp-error.h"
#include "gmlp-numeric.h"
#include "gmlp-quantize-numeric.h"

/* One group of a quantize call, where its members are. */
typedef struct {
  int           recipe;
  int           flags;
  int           fp8_dtype;
  int           src_dtype;
  const guint8 *src;
  gint64        m;
  gint64        k;
  guint32       scale_size;
} Group;

static float
group_value (const Group *grp,
             gint64       r,
             gint64       c)
{
  return gmlp_num_load_float (grp->src, grp->src_dtype, (guint64) r * (guint64) grp->k + (guint64) c);
}

static guint32
group_amax (const Group *grp,
            gint64       r0,
            gint64       r1,
            gint64       c0,
            gint64       c1)
{
  guint32 amax = 0;
  gint64 r, c;

  for (r = r0; r < r1; r++)
    for (c = c0; c < c1; c++)
      amax = gmlp_quant_amax_fold_for (grp->recipe, amax, group_value (grp, r, c));
  return amax;
}

/* Quantizes a group block by block, blocks of block_rows × block_cols (0:
 * the whole extent). member_scale, when given, is the scale of every block
 * (per-tensor recipes); otherwise each block's amax gives its scale. The
 * scales go to scales (a grid of scale_cols columns) unless it is NULL; the
 * values go to out, transposed (out[c × m + r]) for the columnwise copy. */
static void
quantize_blocks (const Group               *grp,
                 gint64                     block_rows,
                 gint64                     block_cols,
                 const GmlpQuantBlockScale *member_scale,
                 guint8                    *scales,
                 gint64                     scale_cols,
                 guint8                    *out,
                 gboolean                   transposed)
{
  gint64 n_down = gmlp_quant_blocks_along (grp->m, block_rows);
  gint64 n_across = gmlp_quant_blocks_along (grp->k, block_cols);
  gint64 bi, bj, r, c;

  for (bi = 0; bi < n_down; bi++)
    for (bj = 0; bj < n_across; bj++)
      {
        gint64 r0 = block_rows ? bi * block_rows : 0;
        gint64 r1 = block_rows ? MIN (r0 + block_rows, grp->m) : grp->m;
        gint64 c0 = block_cols ? bj * block_cols : 0;
        gint64 c1 = block_cols ? MIN (c0 + block_cols, grp->k) : grp->k;
        GmlpQuantBlockScale s;

        if (member_scale != NULL)
          s = *member_scale;
        else
          s = gmlp_quant_block_scale (grp->recipe, grp->flags, grp->fp8_dtype,
                                      group_amax (grp, r0, r1, c0, c1), 0.0f);

        if (scales != NULL)
          {
            gint64 index = bi * scale_cols + bj;

            if (grp->scale_size == 1)
              scales[index] = s.e8m0;
            else
              ((float *) scales)[index] = s.scale_inv;
          }

        for (r = r0; r < r1; r++)
          for (c = c0; c < c1; c++)
            {
              guint8 q = gmlp_quant_encode (group_value (grp, r, c), &s, grp->fp8_dtype);

              if (transposed)
                out[(guint64) c * (guint64) grp->m + (guint64) r] = q;
              else
                out[(guint64) r * (guint64) grp->k + (guint64) c] = q;
            }
      }
}

void
gmlp_cpu_quant_layout_init (GmlpCpuQuantLayout *layout,
                            int                 recipe,
                            int                 flags,
                            gint64              cols,
                            guint64             src_row_bytes)
{
  int l;

  gmlp_quant_blocks (recipe, flags, 0, &layout->block_rows, &layout->block_cols);
  gmlp_quant_blocks (recipe, flags, 1, &layout->col_block_rows, &layout->col_block_cols);
  layout->scale_cols = gmlp_quant_blocks_along (cols, layout->block_cols);
  layout->col_scale_cols = gmlp_quant_blocks_along (cols, layout->col_block_cols);
  layout->scale_size = gmlp_quant_scale_size (recipe);

  layout->row_block[GMLP_CPU_QUANT_SRC] = 1;
  layout->row_bytes[GMLP_CPU_QUANT_SRC] = src_row_bytes;
  layout->row_block[GMLP_CPU_QUANT_DATA] = 1;
  layout->row_bytes[GMLP_CPU_QUANT_DATA] = (guint64) cols;
  layout->row_block[GMLP_CPU_QUANT_SCALE] = layout->block_rows;
  layout->row_bytes[GMLP_CPU_QUANT_SCALE] = (guint64) layout->scale_cols * layout->scale_size;
  layout->row_block[GMLP_CPU_QUANT_COLUMN_SCALE] = layout->col_block_rows;
  layout->row_bytes[GMLP_CPU_QUANT_COLUMN_SCALE] = (guint64) layout->col_scale_cols * layout->scale_size;
  for (l = 0; l < GMLP_CPU_QUANT_N_OPERANDS; l++)
    layout->offset[l] = 0;
}

void
gmlp_cpu_quant_layout_next_group (GmlpCpuQuantLayout *layout,
                                  gint64              rows)
{
  int l;

  for (l = 0; l < GMLP_CPU_QUANT_N_OPERANDS; l++)
    layout->offset[l] += gmlp_num_member_stride (gmlp_quant_blocks_along (rows, layout->row_block[l]),
                                                 layout->row_bytes[l]);
}

gboolean
gmlp_cpu_quantize (GmlpBackendDevice          *device,
                   const GmlpBackendQuantize  *quantize,
                   GError                    **error)
{
  const GmlpBackendShape *shape = &quantize->shape;
  int recipe = quantize->recipe, flags = quantize->flags, fp8_dtype = quantize->fp8_dtype;
  gconstpointer src = quantize->src;
  int src_dtype = quantize->src_dtype;
  gpointer data = quantize->data, scale_inv = quantize->scale_inv;
  gpointer columnwise = quantize->columnwise, columnwise_scale_inv = quantize->columnwise_scale_inv;
  gint64 *derived_rows = quantize->derived_rows;
  float *state = quantize->state;
  guint history_length = quantize->history_length;
  gint64 derived_block, rows_left = shape->row_capacity;
  gboolean own_column_scales = columnwise != NULL && gmlp_quant_columnwise_has_scales (recipe, flags);
  guint32 stride = gmlp_quant_state_stride (history_length);
  GmlpCpuQuantLayout layout;
  Group grp;
  guint g;

  if (recipe < GMLP_QUANT_DELAYED || recipe > GMLP_QUANT_MXFP8 ||
      (recipe == GMLP_QUANT_DELAYED && (state == NULL || history_length < 1)))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: invalid quantization arguments");
      return FALSE;
    }

  gmlp_cpu_quant_layout_init (&layout, recipe, flags, shape->cols,
                              (guint64) shape->cols * gmlp_num_dtype_size (src_dtype));
  derived_block = gmlp_quant_derived_row_block (recipe, flags, columnwise != NULL);

  grp.recipe = recipe;
  grp.flags = flags;
  grp.fp8_dtype = fp8_dtype;
  grp.src_dtype = src_dtype;
  grp.k = shape->cols;
  grp.scale_size = layout.scale_size;

  for (g = 0; g < shape->n_groups; g++)
    {
      guint8 *group_data = (guint8 *) data + layout.offset[GMLP_CPU_QUANT_DATA];
      guint8 *group_scales = (guint8 *) scale_inv + layout.offset[GMLP_CPU_QUANT_SCALE];
      GmlpQuantBlockScale member;
      const GmlpQuantBlockScale *member_scale = NULL;

      /* Clamped to the capacity as the CUDA kernels clamp. */
      grp.m = CLAMP (shape->device_rows[g], 0, rows_left);
      rows_left -= grp.m;
      grp.src = (const guint8 *) src + layout.offset[GMLP_CPU_QUANT_SRC];

      if (layout.block_rows == 0)
        {
          /* Per tensor: the scale of the whole group. */
          guint32 amax = group_amax (&grp, 0, grp.m, 0, grp.k);
          float delayed = 0.0f;

          if (recipe == GMLP_QUANT_DELAYED)
            {
              float *row = state + (gsize) g * stride;
              guint32 seen = gmlp_num_float_bits (row[GMLP_QUANT_STATE_AMAX]);

              delayed = row[GMLP_QUANT_STATE_SCALE];
              if (amax > seen)
                row[GMLP_QUANT_STATE_AMAX] = gmlp_num_bits_float (amax);
            }
          member = gmlp_quant_block_scale (recipe, flags, fp8_dtype, amax, delayed);
          member_scale = &member;
        }

      quantize_blocks (&grp, layout.block_rows, layout.block_cols, member_scale, group_scales,
                       layout.scale_cols, group_data, FALSE);
      if (columnwise != NULL)
        {
          guint8 *group_columnwise = (guint8 *) columnwise + layout.offset[GMLP_CPU_QUANT_DATA];

          if (own_column_scales)
            quantize_blocks (&grp, layout.col_block_rows, layout.col_block_cols, NULL,
                             (guint8 *) columnwise_scale_inv + layout.offset[GMLP_CPU_QUANT_COLUMN_SCALE],
                             layout.col_scale_cols, group_columnwise, TRUE);
          else
            quantize_blocks (&grp, layout.block_rows, layout.block_cols, member_scale, NULL, 0,
                             group_columnwise, TRUE);
        }
      if (derived_rows != NULL && derived_block > 0)
        derived_rows[g] = gmlp_quant_blocks_along (grp.m, derived_block);

      gmlp_cpu_quant_layout_next_group (&layout, grp.m);
    }
  return TRUE;
}

gboolean
gmlp_cpu_dequantize (GmlpBackendDevice          *device,
                     const GmlpBackendQuantize  *quantize,
                     GError                    **error)
{
  const GmlpBackendShape *shape = &quantize->shape;
  int recipe = quantize->recipe, flags = quantize->flags, fp8_dtype = quantize->fp8_dtype;
  gconstpointer data = quantize->data, scale_inv = quantize->scale_inv;
  gpointer dst = quantize->dst;
  int dst_dtype = quantize->dst_dtype;
  gint64 block_rows, block_cols, scale_cols, rows_left = shape->row_capacity;
  guint32 scale_size;
  GmlpCpuQuantLayout layout;
  guint g;

  /* The layouts of a quantization but for the source (unused) and the
   * output, which takes the place of the columnwise scales. */
  gmlp_cpu_quant_layout_init (&layout, recipe, flags, shape->cols, 0);
  layout.row_block[GMLP_CPU_QUANT_DST] = 1;
  layout.row_bytes[GMLP_CPU_QUANT_DST] = (guint64) shape->cols * gmlp_num_dtype_size (dst_dtype);
  block_rows = layout.block_rows;
  block_cols = layout.block_cols;
  scale_cols = layout.scale_cols;
  scale_size = layout.scale_size;

  for (g = 0; g < shape->n_groups; g++)
    {
      const guint8 *q = (const guint8 *) data + layout.offset[GMLP_CPU_QUANT_DATA];
      const guint8 *scales = (const guint8 *) scale_inv + layout.offset[GMLP_CPU_QUANT_SCALE];
      guint8 *out = (guint8 *) dst + layout.offset[GMLP_CPU_QUANT_DST];
      gint64 m = CLAMP (shape->device_rows[g], 0, rows_left);
      gint64 r, c;

      rows_left -= m;
      for (r = 0; r < m; r++)
        for (c = 0; c < shape->cols; c++)
          {
            guint64 i = (guint64) r * (guint64) shape->cols + (guint64) c;
            gint64 s = (block_rows ? r / block_rows : 0) * scale_cols + (block_cols ? c / block_cols : 0);
            float factor = scale_size == 1 ? gmlp_quant_e8m0_to_float (scales[s])
                                           : ((const float *) scales)[s];

            gmlp_num_store_float (out, dst_dtype, i, gmlp_quant_decode (q[i], factor, fp8_dtype));
          }

      gmlp_cpu_quant_layout_next_group (&layout, m);
    }
  return TRUE;
}

gboolean
gmlp_cpu_quantizer_update (GmlpBackendDevice       *device,
                           float                   *state,
                           guint                    n_groups,
                           guint                    history_length,
                           int                      fp8_dtype,
                           int                      margin,
                           GError                 **error)
{
  guint g;

  for (g = 0; g < n_groups; g++)
    gmlp_quant_delayed_update (state + (gsize) g * gmlp_quant_state_stride (history_length),
                               history_length, fp8_dtype, margin);
  return TRUE;
}
