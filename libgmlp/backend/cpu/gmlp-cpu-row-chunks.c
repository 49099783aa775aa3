/* gmlp-cpu-row-chunks.c: chunks of rows between layouts on the CPU backend
 *
 * The reference for the CUDA kernels (kernels/row_chunks.cu): the same
 * places and kept rows (GmlpBackendMoveRows), worked out chunk by chunk in
 * order. Offsets saturate as the kernels' do, so sizes written by anyone
 * can't make an access out of range.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "backend/cpu/gmlp-cpu-row-chunks.h"
#include "backend/gmlp-backend-permute.h"
#include "gmlp-error.h"
#include "gmlp-numeric.h"

#define SATURATION ((guint64) GMLP_BACKEND_PERMUTE_SATURATION)

static guint64
saturating_add (guint64 a,
                guint64 b)
{
  return a + b < SATURATION ? a + b : SATURATION;
}

static gint64
clamp_rows (gint64 rows)
{
  return rows > 0 ? rows : 0;
}

/* Whether a side's chunks lie in groups with device sizes. */
static gboolean
is_members (const GmlpBackendChunkSide *side)
{
  return side->layout == GMLP_BACKEND_CHUNKS_MEMBERS ||
         side->layout == GMLP_BACKEND_CHUNKS_MEMBERS_BY_B;
}

/* Rows of @rows from byte @offset that fit in @capacity bytes. */
static gint64
rows_that_fit (gint64   rows,
               guint64  offset,
               guint64  capacity,
               guint64  row_bytes)
{
  guint64 fit;

  if (rows <= 0 || offset >= capacity)
    return 0;
  fit = (capacity - offset) / row_bytes;
  return (guint64) rows < fit ? rows : (gint64) fit;
}

/* The group sizes of a MEMBERS* side: its own, or (a destination with
 * dst_sizes) what the chunks keep. */
static gint64 *
side_group_rows (const GmlpBackendMoveRows  *move,
                 const GmlpBackendChunkSide *side,
                 gboolean                    from_kept,
                 const gint64               *kept)
{
  gint64 *rows = g_new0 (gint64, MAX (side->n_members, 1));
  guint a, b;

  if (!from_kept)
    {
      for (b = 0; b < side->n_members; b++)
        rows[b] = clamp_rows (side->member_rows[b]);
      return rows;
    }
  for (a = 0; a < move->n_a; a++)
    for (b = 0; b < move->n_b; b++)
      {
        guint64 c = (guint64) a * move->n_b + b;
        guint m = side->layout == GMLP_BACKEND_CHUNKS_MEMBERS ? (guint) c : b;

        rows[m] = (gint64) saturating_add (rows[m], kept[c]);
      }
  return rows;
}

/* Where each group of a MEMBERS* side starts. */
static guint64 *
side_group_offsets (const GmlpBackendChunkSide *side,
                    const gint64               *group_rows,
                    guint64                     row_bytes)
{
  guint64 *offsets = g_new0 (guint64, MAX (side->n_members, 1));
  guint64 at = 0;
  guint m;

  for (m = 0; m < side->n_members; m++)
    {
      gint64 rows = group_rows[m];

      offsets[m] = at;
      /* Past the saturation point every later offset is out of range. */
      if ((guint64) rows > SATURATION / row_bytes)
        rows = (gint64) (SATURATION / row_bytes);
      at = saturating_add (at, gmlp_num_member_stride (rows, row_bytes));
    }
  return offsets;
}

typedef struct {
  guint64 offset;   /* bytes from base */
  gint64  room;     /* rows the layout lets the chunk have from there */
} Place;

static Place
place_chunk (const GmlpBackendMoveRows  *move,
             const GmlpBackendChunkSide *side,
             guint                       a,
             guint                       b,
             const guint64              *packed_before,
             const gint64               *position,
             const gint64               *group_rows,
             const guint64              *group_offsets)
{
  guint64 c = (guint64) a * move->n_b + b;
  Place p = { SATURATION, 0 };

  switch (side->layout)
    {
    case GMLP_BACKEND_CHUNKS_SLOTS:
      p.offset = c * side->slot_stride;
      p.room = side->slot_rows;
      break;
    case GMLP_BACKEND_CHUNKS_PACKED:
      p.offset = packed_before[c] > SATURATION / move->row_bytes
                 ? SATURATION : packed_before[c] * move->row_bytes;
      p.room = G_MAXINT64;
      break;
    case GMLP_BACKEND_CHUNKS_MEMBERS:
      p.offset = group_offsets[c];
      p.room = group_rows[c];
      break;
    case GMLP_BACKEND_CHUNKS_MEMBERS_BY_B:
      p.offset = saturating_add (group_offsets[b],
                                 (guint64) position[c] > SATURATION / move->row_bytes
                                 ? SATURATION : (guint64) position[c] * move->row_bytes);
      p.room = MAX (group_rows[b] - position[c], 0);
      break;
    default:
      g_assert_not_reached ();
    }
  return p;
}

static gboolean
check_side (const GmlpBackendMoveRows  *move,
            const GmlpBackendChunkSide *side,
            const char                 *name,
            GError                    **error)
{
  guint64 n_chunks = (guint64) move->n_a * move->n_b;
  gboolean ok;

  switch (side->layout)
    {
    case GMLP_BACKEND_CHUNKS_SLOTS:
      ok = side->slot_rows >= 0 && side->slot_stride >= (guint64) side->slot_rows * move->row_bytes;
      break;
    case GMLP_BACKEND_CHUNKS_PACKED:
      ok = TRUE;
      break;
    case GMLP_BACKEND_CHUNKS_MEMBERS:
      ok = side->n_members == n_chunks;
      break;
    case GMLP_BACKEND_CHUNKS_MEMBERS_BY_B:
      ok = side->n_members == move->n_b;
      break;
    default:
      ok = FALSE;
    }
  if (ok && is_members (side))
    ok = side->member_rows != NULL || (side == &move->dst && move->dst_sizes != NULL);
  if (!ok || (side->base == NULL && side->capacity > 0))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: move_rows: the %s does not describe a layout of %u × %u chunks", name,
                   move->n_a, move->n_b);
      return FALSE;
    }
  return TRUE;
}

gboolean
gmlp_cpu_move_rows (GmlpBackendDevice          *device,
                    const GmlpBackendMoveRows  *move,
                    GError                    **error)
{
  const GmlpBackendChunkSide *src = &move->src, *dst = &move->dst;
  guint64 n_chunks = (guint64) move->n_a * move->n_b, c;
  g_autofree gint64 *kept = NULL, *position = NULL, *column = NULL;
  g_autofree gint64 *src_rows = NULL, *dst_rows = NULL;
  g_autofree guint64 *packed_before = NULL, *src_offsets = NULL, *dst_offsets = NULL;
  gint64 limit = move->max_chunk_rows >= 0 ? move->max_chunk_rows : G_MAXINT64;
  gint64 dropped = 0;
  guint a, b;

  if (move->row_bytes == 0 || move->counts == NULL || n_chunks == 0 ||
      n_chunks > G_MAXUINT32 || move->src.base == move->dst.base)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: move_rows needs counts, chunks, rows and two storages");
      return FALSE;
    }
  if (!check_side (move, src, "source", error) || !check_side (move, dst, "destination", error))
    return FALSE;

  if (src->layout == GMLP_BACKEND_CHUNKS_SLOTS)
    limit = MIN (limit, src->slot_rows);
  if (dst->layout == GMLP_BACKEND_CHUNKS_SLOTS)
    limit = MIN (limit, dst->slot_rows);

  /* What each chunk keeps before the groups and storages have their say,
   * and the places that follow from it. */
  kept = g_new (gint64, n_chunks);
  position = g_new (gint64, n_chunks);
  packed_before = g_new (guint64, n_chunks);
  column = g_new0 (gint64, move->n_b);
  for (c = 0; c < n_chunks; c++)
    kept[c] = MIN (clamp_rows (move->counts[c]), limit);
  for (c = 0; c < n_chunks; c++)
    packed_before[c] = c == 0 ? 0 : saturating_add (packed_before[c - 1], kept[c - 1]);
  for (a = 0; a < move->n_a; a++)
    for (b = 0; b < move->n_b; b++)
      {
        c = (guint64) a * move->n_b + b;
        position[c] = column[b];
        column[b] = (gint64) saturating_add (column[b], kept[c]);
      }

  if (is_members (src))
    {
      src_rows = side_group_rows (move, src, FALSE, kept);
      src_offsets = side_group_offsets (src, src_rows, move->row_bytes);
    }
  if (is_members (dst))
    {
      dst_rows = side_group_rows (move, dst, move->dst_sizes != NULL, kept);
      dst_offsets = side_group_offsets (dst, dst_rows, move->row_bytes);
    }

  for (a = 0; a < move->n_a; a++)
    for (b = 0; b < move->n_b; b++)
      {
        Place from, to;
        gint64 rows, zero_end;
        guint64 i;

        c = (guint64) a * move->n_b + b;
        from = place_chunk (move, src, a, b, packed_before, position, src_rows, src_offsets);
        to = place_chunk (move, dst, a, b, packed_before, position, dst_rows, dst_offsets);
        rows = MIN (kept[c], MIN (from.room, to.room));
        rows = rows_that_fit (rows, from.offset, src->capacity, move->row_bytes);
        rows = rows_that_fit (rows, to.offset, dst->capacity, move->row_bytes);
        for (i = 0; i < (guint64) rows; i++)
          memcpy ((guint8 *) dst->base + to.offset + i * move->row_bytes,
                  (const guint8 *) src->base + from.offset + i * move->row_bytes, move->row_bytes);

        /* The rest of the chunk's rows in a group, and for the group's
         * last chunk the group's tail. */
        if (move->zero_rest && dst_rows != NULL)
          {
            zero_end = MIN (kept[c], to.room);
            if (dst->layout == GMLP_BACKEND_CHUNKS_MEMBERS || a + 1 == move->n_a)
              zero_end = to.room;
            zero_end = rows_that_fit (zero_end, to.offset, dst->capacity, move->row_bytes);
            if (zero_end > rows)
              memset ((guint8 *) dst->base + to.offset + rows * move->row_bytes, 0,
                      (zero_end - rows) * move->row_bytes);
          }
        dropped += clamp_rows (move->counts[c]) - rows;
        if (move->kept != NULL)
          move->kept[c] = rows;
      }

  if (move->dst_sizes != NULL)
    memcpy (move->dst_sizes, dst_rows, dst->n_members * sizeof (gint64));
  if (move->dropped != NULL)
    *move->dropped += dropped;
  return TRUE;
}
