/* gmlp-grouped-tensor-layout.c: the checks of a grouped tensor's layout
 *
 * The limits on a layout's dtype, number of groups, columns and group sizes,
 * and its byte count with every member aligned, checked for overflow: the
 * arithmetic that the constructors in gmlp-grouped-tensor.c and
 * gmlp-grouped-tensor-interop.c share. The object is in
 * gmlp-grouped-tensor.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "gmlp-grouped-tensor-private.h"
#include "gmlp-dtype-private.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-numeric.h"

/* Rounds @bytes up to the member alignment, or FALSE past 64 bits. */
static gboolean
align_member (guint64  bytes,
              guint64 *aligned)
{
  if (!gmlp_checked_add (bytes, kGmlpMemberAlignment - 1, aligned))
    return FALSE;
  *aligned &= ~(guint64) (kGmlpMemberAlignment - 1);
  return TRUE;
}

gboolean
gmlp_grouped_tensor_layout_bytes (guint          n_groups,
                                  const gint64  *rows,
                                  gint64         row_capacity,
                                  guint64        row_bytes,
                                  gsize         *nbytes)
{
  guint64 bytes = 0, member;
  guint g;

  if (rows != NULL)
    {
      for (g = 0; g < n_groups; g++)
        if (rows[g] < 0 ||
            !gmlp_checked_mul ((guint64) rows[g], row_bytes, &member) ||
            !align_member (member, &member) ||
            !gmlp_checked_add (bytes, member, &bytes))
          return FALSE;
    }
  else
    {
      /* As gmlp_num_device_sized_bytes(), checked. */
      if (row_capacity < 0 || !gmlp_checked_mul ((guint64) row_capacity, row_bytes, &bytes))
        return FALSE;
      if (row_bytes % kGmlpMemberAlignment != 0 &&
          !gmlp_checked_add (bytes, (guint64) n_groups * (kGmlpMemberAlignment - 1), &bytes))
        return FALSE;
      if (!align_member (bytes, &bytes))
        return FALSE;
      g_assert (bytes == gmlp_num_device_sized_bytes (n_groups, row_capacity, row_bytes));
    }

  if (bytes > GMLP_MAX_BYTES)
    return FALSE;
  *nbytes = bytes;
  return TRUE;
}

gboolean
gmlp_grouped_tensor_check_common (GmlpDevice  *device,
                                  GmlpDType    dtype,
                                  guint        n_groups,
                                  gint64       cols,
                                  GError     **error)
{
  if (gmlp_dtype_get_size (dtype) == 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Invalid dtype %d", (int) dtype);
      return FALSE;
    }
  if (n_groups == 0 || n_groups > GMLP_MAX_GROUPS)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A grouped tensor has 1 to %d groups, not %u", GMLP_MAX_GROUPS, n_groups);
      return FALSE;
    }
  if (cols <= 0 || cols > GMLP_MAX_COLS)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "cols must be between 1 and %" G_GINT64_FORMAT ", not %" G_GINT64_FORMAT,
                   GMLP_MAX_COLS, cols);
      return FALSE;
    }
  return TRUE;
}

/* Checks host group sizes; returns their sum in *total_rows. */
gboolean
gmlp_grouped_tensor_check_rows (const gint64  *rows,
                                guint          n_groups,
                                gint64         cols,
                                GmlpDType      dtype,
                                gint64        *total_rows,
                                GError       **error)
{
  guint64 row_bytes = (guint64) cols * gmlp_dtype_get_size (dtype);
  gint64 total = 0;
  gsize nbytes;
  guint g;

  if (rows == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "No group sizes given");
      return FALSE;
    }

  for (g = 0; g < n_groups; g++)
    {
      if (rows[g] < 0 || rows[g] > GMLP_MAX_ROWS)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "Group %u has %" G_GINT64_FORMAT " rows; sizes must be between 0 and %"
                       G_GINT64_FORMAT, g, rows[g], GMLP_MAX_ROWS);
          return FALSE;
        }
      total += rows[g];
      if (total > GMLP_MAX_ROWS)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "The group sizes add up to more than %" G_GINT64_FORMAT " rows",
                       GMLP_MAX_ROWS);
          return FALSE;
        }
    }

  if (!gmlp_grouped_tensor_layout_bytes (n_groups, rows, total, row_bytes, &nbytes))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "A tensor of %" G_GINT64_FORMAT " × %" G_GINT64_FORMAT " %s is too large",
                   total, cols, gmlp_dtype_get_name (dtype));
      return FALSE;
    }

  *total_rows = total;
  return TRUE;
}

gboolean
gmlp_grouped_tensor_check_host_layout (GmlpDevice    *device,
                                       GmlpDType      dtype,
                                       const gint64  *rows,
                                       guint          n_groups,
                                       gint64         cols,
                                       gint64        *total_rows,
                                       GError       **error)
{
  return gmlp_grouped_tensor_check_common (device, dtype, n_groups, cols, error) &&
         gmlp_grouped_tensor_check_rows (rows, n_groups, cols, dtype, total_rows, error);
}
