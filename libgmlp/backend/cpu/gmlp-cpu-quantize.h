/* gmlp-cpu-quantize.h: FP8 quantization entries of the CPU backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* See the quantize, dequantize and quantizer_update entries of GmlpBackend. */
gboolean gmlp_cpu_quantize         (GmlpBackendDevice          *device,
                                    const GmlpBackendQuantize  *quantize,
                                    GError                    **error);
gboolean gmlp_cpu_dequantize       (GmlpBackendDevice          *device,
                                    const GmlpBackendQuantize  *quantize,
                                    GError                    **error);
gboolean gmlp_cpu_quantizer_update (GmlpBackendDevice       *device,
                                    float                   *state,
                                    guint                    n_groups,
                                    guint                    history_length,
                                    int                      fp8_dtype,
                                    int                      margin,
                                    GError                 **error);

/* For the quantize entries, plain and fused (gmlp-cpu-activation-quantize.c). */

/* The operands of a quantization, in the order of GmlpCpuQuantLayout. */
typedef enum {
  GMLP_CPU_QUANT_SRC,
  GMLP_CPU_QUANT_DATA,          /* and the columnwise copy */
  GMLP_CPU_QUANT_SCALE,
  GMLP_CPU_QUANT_COLUMN_SCALE,
  GMLP_CPU_QUANT_N_OPERANDS,
  GMLP_CPU_QUANT_DST = GMLP_CPU_QUANT_COLUMN_SCALE,   /* dequantize: the output */
} GmlpCpuQuantOperand;

/* How a quantization lays out its operands (docs/memory-layout.md): the
 * block geometry of the recipe, and where the members of the group at hand
 * lie. Member i of operand l has gmlp_quant_blocks_along (m_i,
 * row_block[l]) rows of row_bytes[l] bytes. */
typedef struct {
  gint64   block_rows, block_cols;          /* rowwise blocks, 0: per tensor */
  gint64   col_block_rows, col_block_cols;  /* columnwise blocks */
  gint64   scale_cols, col_scale_cols;      /* columns of the scale grids */
  guint32  scale_size;                      /* 4, or 1 for E8M0 */
  gint64   row_block[GMLP_CPU_QUANT_N_OPERANDS];
  guint64  row_bytes[GMLP_CPU_QUANT_N_OPERANDS];
  guint64  offset[GMLP_CPU_QUANT_N_OPERANDS];  /* of the group at hand */
} GmlpCpuQuantLayout;

/* The layout of a quantization of cols columns whose source rows have
 * src_row_bytes bytes, at the first group. */
void     gmlp_cpu_quant_layout_init       (GmlpCpuQuantLayout *layout,
                                           int                 recipe,
                                           int                 flags,
                                           gint64              cols,
                                           guint64             src_row_bytes);
/* On to the next group, past the members of the one at hand (rows rows,
 * clamped). */
void     gmlp_cpu_quant_layout_next_group (GmlpCpuQuantLayout *layout,
                                           gint64              rows);

G_END_DECLS
