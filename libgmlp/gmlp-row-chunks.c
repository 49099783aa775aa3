/* gmlp-row-chunks.c: chunks of rows whose counts are only on the device,
 * moved between layouts
 *
 * The checks that need only the host (layouts, dtypes, devices, overlaps),
 * then one call of the backend's move_rows entry, which reads the counts
 * and the sizes on the device (gmlp-row-chunks-private.h).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-row-chunks-private.h"
#include "gmlp-error.h"
#include "gmlp-grouped-tensor-private.h"

static const char *const layout_names[] = { "SLOTS", "PACKED", "MEMBERS", "MEMBERS_BY_B" };

G_STATIC_ASSERT ((int) GMLP_CHUNK_LAYOUT_SLOTS == (int) GMLP_BACKEND_CHUNKS_SLOTS);
G_STATIC_ASSERT ((int) GMLP_CHUNK_LAYOUT_PACKED == (int) GMLP_BACKEND_CHUNKS_PACKED);
G_STATIC_ASSERT ((int) GMLP_CHUNK_LAYOUT_MEMBERS == (int) GMLP_BACKEND_CHUNKS_MEMBERS);
G_STATIC_ASSERT ((int) GMLP_CHUNK_LAYOUT_MEMBERS_BY_B == (int) GMLP_BACKEND_CHUNKS_MEMBERS_BY_B);

/* An INT64 tensor of @n values on @device, one dense group. */
static gboolean
check_ints (GmlpGroupedTensor  *tensor,
            GmlpDevice         *device,
            guint64             n,
            const char         *what,
            GError            **error)
{
  if (!gmlp_grouped_tensor_check_usable (tensor, error))
    return FALSE;
  if (gmlp_grouped_tensor_get_device (tensor) != device ||
      gmlp_grouped_tensor_get_dtype (tensor) != GMLP_DTYPE_INT64 ||
      gmlp_grouped_tensor_get_n_groups (tensor) != 1 ||
      !gmlp_grouped_tensor_has_host_sizes (tensor) ||
      (guint64) gmlp_grouped_tensor_get_total_rows (tensor) *
      (guint64) gmlp_grouped_tensor_get_cols (tensor) != n)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "Moving rows: %s must be one group of %" G_GUINT64_FORMAT " INT64 values on %s",
                   what, n, gmlp_device_get_name (device));
      return FALSE;
    }
  return TRUE;
}

static gboolean
describe_side (const GmlpChunkSide   *side,
               guint                  n_a,
               guint                  n_b,
               GmlpDevice            *device,
               const char            *what,
               GmlpBackendChunkSide  *out,
               GError               **error)
{
  GmlpGroupedTensor *t = side->tensor;
  guint n_groups = gmlp_grouped_tensor_get_n_groups (t);
  gboolean host = gmlp_grouped_tensor_has_host_sizes (t);
  GmlpBackendShape shape;
  gboolean ok;

  if (gmlp_grouped_tensor_get_device (t) != device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Moving rows: the %s is on %s, the counts on %s", what,
                   gmlp_device_get_name (gmlp_grouped_tensor_get_device (t)),
                   gmlp_device_get_name (device));
      return FALSE;
    }

  switch (side->layout)
    {
    case GMLP_CHUNK_LAYOUT_SLOTS:
      ok = host && n_groups == (guint64) n_a * n_b && gmlp_grouped_tensor_is_uniform (t);
      break;
    case GMLP_CHUNK_LAYOUT_PACKED:
      ok = host && n_groups == 1;
      break;
    case GMLP_CHUNK_LAYOUT_MEMBERS:
      ok = !host && n_groups == (guint64) n_a * n_b;
      break;
    case GMLP_CHUNK_LAYOUT_MEMBERS_BY_B:
      ok = !host && n_groups == n_b;
      break;
    default:
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Moving rows: unknown layout %d of the %s", side->layout, what);
      return FALSE;
    }
  if (!ok)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                   "Moving rows: the %s (%u groups, sizes on the %s) is not a %s layout of %u × %u "
                   "chunks", what, n_groups, host ? "host" : "device",
                   layout_names[side->layout], n_a, n_b);
      return FALSE;
    }

  *out = (GmlpBackendChunkSide) {
    .layout = (GmlpBackendChunkLayout) side->layout,
    .base = gmlp_grouped_tensor_get_data (t),
    .capacity = gmlp_grouped_tensor_get_nbytes (t),
  };
  if (side->layout == GMLP_CHUNK_LAYOUT_SLOTS)
    {
      out->slot_rows = gmlp_grouped_tensor_get_rows (t, 0);
      out->slot_stride = n_groups > 1 ? (guint64) gmlp_grouped_tensor_get_member_offset (t, 1)
                                      : out->capacity;
    }
  else if (side->layout != GMLP_CHUNK_LAYOUT_PACKED)
    {
      if (!gmlp_grouped_tensor_get_backend_shape (t, &shape, error))
        return FALSE;
      out->member_rows = shape.device_rows;
      out->n_members = n_groups;
    }
  return TRUE;
}

/* See gmlp-row-chunks-private.h. */
gboolean
gmlp_row_chunks_move (GmlpGroupedTensor    *counts,
                      guint                 n_a,
                      guint                 n_b,
                      gint64                max_chunk_rows,
                      const GmlpChunkSide  *src,
                      const GmlpChunkSide  *dst,
                      GmlpMoveRowsFlags     flags,
                      GmlpGroupedTensor    *kept,
                      GmlpGroupedTensor    *dropped,
                      GError              **error)
{
  GmlpGroupedTensor *written[4] = { NULL, };
  GmlpGroupedTensor *sizes = NULL;
  GmlpBackendMoveRows move;
  const GmlpBackend *backend;
  GmlpDevice *device;
  gboolean dst_members;
  guint i, j, n_written = 0;

  g_return_val_if_fail (GMLP_IS_GROUPED_TENSOR (counts), FALSE);
  g_return_val_if_fail (src != NULL && GMLP_IS_GROUPED_TENSOR (src->tensor), FALSE);
  g_return_val_if_fail (dst != NULL && GMLP_IS_GROUPED_TENSOR (dst->tensor), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gmlp_grouped_tensor_check_usable (counts, error) ||
      !gmlp_grouped_tensor_check_usable (src->tensor, error) ||
      !gmlp_grouped_tensor_check_usable (dst->tensor, error))
    return FALSE;
  device = gmlp_grouped_tensor_get_device (counts);
  if (n_a == 0 || n_b == 0 || (guint64) n_a * n_b > GMLP_MAX_GROUPS || max_chunk_rows < -1)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Moving rows: %u × %u chunks (1 to %d in all), at most %" G_GINT64_FORMAT
                   " rows each", n_a, n_b, GMLP_MAX_GROUPS, max_chunk_rows);
      return FALSE;
    }
  if (!check_ints (counts, device, (guint64) n_a * n_b, "the counts", error) ||
      (kept != NULL && !check_ints (kept, device, (guint64) n_a * n_b, "the kept rows", error)) ||
      (dropped != NULL && !check_ints (dropped, device, 1, "the dropped rows", error)))
    return FALSE;
  if (gmlp_grouped_tensor_get_dtype (src->tensor) != gmlp_grouped_tensor_get_dtype (dst->tensor) ||
      gmlp_grouped_tensor_get_cols (src->tensor) != gmlp_grouped_tensor_get_cols (dst->tensor))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_DTYPE_MISMATCH,
                   "Moving rows: the source has %" G_GINT64_FORMAT " columns of %s, the "
                   "destination %" G_GINT64_FORMAT " of %s",
                   gmlp_grouped_tensor_get_cols (src->tensor),
                   gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (src->tensor)),
                   gmlp_grouped_tensor_get_cols (dst->tensor),
                   gmlp_dtype_get_name (gmlp_grouped_tensor_get_dtype (dst->tensor)));
      return FALSE;
    }

  move = (GmlpBackendMoveRows) {
    .n_a = n_a,
    .n_b = n_b,
    .counts = gmlp_grouped_tensor_get_data (counts),
    .max_chunk_rows = max_chunk_rows,
    .row_bytes = (guint64) gmlp_grouped_tensor_get_cols (src->tensor) *
                 gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (src->tensor)),
    .zero_rest = (flags & GMLP_MOVE_ROWS_ZERO_REST) != 0,
    .kept = kept != NULL ? gmlp_grouped_tensor_get_data (kept) : NULL,
    .dropped = dropped != NULL ? gmlp_grouped_tensor_get_data (dropped) : NULL,
  };
  if (!describe_side (src, n_a, n_b, device, "source", &move.src, error) ||
      !describe_side (dst, n_a, n_b, device, "destination", &move.dst, error))
    return FALSE;

  dst_members = dst->layout == GMLP_CHUNK_LAYOUT_MEMBERS ||
                dst->layout == GMLP_CHUNK_LAYOUT_MEMBERS_BY_B;
  if ((flags & ~(GMLP_MOVE_ROWS_SET_SIZES | GMLP_MOVE_ROWS_ZERO_REST)) != 0 ||
      (flags != 0 && !dst_members))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Moving rows: flags 0x%x need a destination of groups with device sizes",
                   (guint) flags);
      return FALSE;
    }
  if (flags & GMLP_MOVE_ROWS_SET_SIZES)
    {
      sizes = gmlp_grouped_tensor_get_sizes (dst->tensor, error);
      if (sizes == NULL)
        return FALSE;
      move.dst_sizes = gmlp_grouped_tensor_get_data (sizes);
    }

  /* What is written must not overlap anything the call reads or writes. */
  written[n_written++] = dst->tensor;
  if (kept != NULL)
    written[n_written++] = kept;
  if (dropped != NULL)
    written[n_written++] = dropped;
  if (sizes != NULL)
    written[n_written++] = sizes;
  for (i = 0; i < n_written; i++)
    {
      GmlpGroupedTensor *others[] = { counts, src->tensor };

      for (j = 0; j < G_N_ELEMENTS (others); j++)
        if (gmlp_grouped_tensor_overlaps (written[i], others[j]))
          goto overlap;
      for (j = i + 1; j < n_written; j++)
        if (gmlp_grouped_tensor_overlaps (written[i], written[j]))
          goto overlap;
    }
  /* Written sizes must not be sizes the source is laid out by. */
  if (sizes != NULL && !gmlp_grouped_tensor_has_host_sizes (src->tensor) &&
      gmlp_grouped_tensor_overlaps (sizes, gmlp_grouped_tensor_get_sizes (src->tensor, NULL)))
    goto overlap;

  backend = gmlp_device_get_backend (device);
  if (backend->move_rows == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "Moving rows in chunks is not on this backend (%s)", gmlp_device_get_name (device));
      return FALSE;
    }

  for (i = 0; i < n_written; i++)
    gmlp_grouped_tensor_bump_version (written[i]);
  return GMLP_DEVICE_CALL (device, move_rows, &move, error);

overlap:
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
               "Moving rows: a tensor the call writes overlaps another it reads or writes");
  return FALSE;
}
