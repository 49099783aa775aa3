/* gmlp-cpu-permute.c: token permutation on the CPU backend
 *
 * The reference for the CUDA kernels: the map in one pass over the choices
 * in order (which makes it stable), the rows moved in FP32 and stored in
 * the output's dtype, sums over a token's choices in their order. The
 * permuted layout's sizes are read where they are, as on the device, and
 * every member is clamped to the allocation as the other device-sizes
 * entries clamp (docs/memory-layout.md), so that sizes written by anyone
 * else than routing_map cannot make an access out of range.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "backend/cpu/gmlp-cpu-permute.h"
#include "backend/gmlp-backend-permute.h"
#include "gmlp-error.h"
#include "gmlp-numeric.h"

#define SATURATION GMLP_BACKEND_PERMUTE_SATURATION

gboolean
gmlp_cpu_routing_count (GmlpBackendDevice  *device,
                        const gint64       *indices,
                        gint64              n_choices,
                        guint               n_experts,
                        gint64             *counts,
                        GError            **error)
{
  gint64 c;

  if (n_choices < 0 || (n_choices > 0 && indices == NULL) || counts == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: routing_count needs indices and counts");
      return FALSE;
    }
  memset (counts, 0, sizeof (gint64) * n_experts);
  for (c = 0; c < n_choices; c++)
    if (indices[c] >= 0 && indices[c] < n_experts)
      counts[indices[c]]++;
  return TRUE;
}

gboolean
gmlp_cpu_routing_map (GmlpBackendDevice            *device,
                      const GmlpBackendRoutingMap  *map,
                      GError                      **error)
{
  gint64 n_choices, total = 0, c, s;
  g_autofree gint64 *count = NULL, *start = NULL, *position = NULL;
  guint e;

  if (!gmlp_backend_check_routing_map ("CPU", map, error))
    return FALSE;

  /* Each choice's place within its expert, in the order of the choices. */
  n_choices = map->n_tokens * map->top_k;
  count = g_new0 (gint64, map->n_experts);
  start = g_new0 (gint64, map->n_experts);
  position = g_new (gint64, MAX (n_choices, 1));
  for (c = 0; c < n_choices; c++)
    {
      gint64 expert = map->indices[c];

      position[c] = -1;
      if (expert < 0 || expert >= map->n_experts)
        continue;
      if (map->expert_capacity < 0 || count[expert] < map->expert_capacity)
        position[c] = count[expert];
      count[expert]++;
    }

  for (e = 0; e < map->n_experts; e++)
    {
      gint64 kept = map->expert_capacity < 0 ? count[e] : MIN (count[e], map->expert_capacity);

      count[e] = (kept + map->padding - 1) / map->padding * map->padding;
      start[e] = total;
      total += count[e];
    }
  /* The host's bound: a smaller capacity is the caller's error, said
   * before anything is written. */
  if (total > map->row_capacity)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: the routing needs %" G_GINT64_FORMAT " rows, the capacity is %" G_GINT64_FORMAT,
                   total, map->row_capacity);
      return FALSE;
    }

  memcpy (map->sizes, count, sizeof (gint64) * map->n_experts);
  for (s = 0; s < map->row_capacity; s++)
    map->choice_of[s] = -1;
  for (c = 0; c < n_choices; c++)
    {
      if (position[c] < 0)
        {
          map->row_of[c] = -1;
          continue;
        }
      map->row_of[c] = start[map->indices[c]] + position[c];
      map->choice_of[map->row_of[c]] = c;
    }
  return TRUE;
}

/* Where the members of the permuted layout lie for one element size: the
 * first slot of each expert, its byte offset and how many of its rows lie
 * inside the allocation. */
typedef struct {
  guint    n;
  guint64  row_bytes;
  gint64  *start;
  guint64 *offset;
  gint64  *fit;
} Layout;

static void
layout_init (Layout                 *l,
             const GmlpBackendShape *shape,
             int                     dtype)
{
  guint64 capacity, offset = 0;
  gint64 start = 0;
  guint e;

  l->n = shape->n_groups;
  l->row_bytes = (guint64) shape->cols * gmlp_num_dtype_size (dtype);
  l->start = g_new (gint64, MAX (l->n, 1));
  l->offset = g_new (guint64, MAX (l->n, 1));
  l->fit = g_new (gint64, MAX (l->n, 1));
  capacity = gmlp_num_device_sized_bytes (l->n, shape->row_capacity, l->row_bytes);
  for (e = 0; e < l->n; e++)
    {
      gint64 rows = MAX (shape->device_rows[e], 0);
      gint64 room = offset < capacity ? (gint64) ((capacity - offset) / l->row_bytes) : 0;

      l->start[e] = start;
      l->offset[e] = offset;
      l->fit[e] = MIN (rows, room);
      start = rows > SATURATION - start ? SATURATION : start + rows;
      offset = MIN (offset + gmlp_num_member_stride (MIN (rows, room + 1), l->row_bytes),
                    (guint64) SATURATION);
    }
}

static void
layout_clear (Layout *l)
{
  g_free (l->start);
  g_free (l->offset);
  g_free (l->fit);
}

/* The byte offset of slot s, or FALSE when no member holds it (past the
 * groups, or clamped away). */
static gboolean
layout_find (const Layout *l,
             gint64        s,
             guint64      *offset)
{
  guint lo = 0, hi = l->n;

  if (s < 0 || l->n == 0)
    return FALSE;
  /* The last expert whose first slot is at or before s: of experts that
   * start at one slot, the empty ones come first. */
  while (hi - lo > 1)
    {
      guint mid = lo + (hi - lo) / 2;

      if (l->start[mid] <= s)
        lo = mid;
      else
        hi = mid;
    }
  if (s < l->start[lo] || s - l->start[lo] >= l->fit[lo])
    return FALSE;
  *offset = l->offset[lo] + (guint64) (s - l->start[lo]) * l->row_bytes;
  return TRUE;
}

/* FORWARD and COMBINE_BACKWARD: every row of the permuted output. */
static void
permute_to_slots (const GmlpBackendPermute *p)
{
  gint64 n_choices = p->n_tokens * p->top_k, cols = p->shape.cols;
  guint64 token_bytes = (guint64) cols * gmlp_num_dtype_size (p->tokens_dtype);
  gboolean combine = p->kind == GMLP_PERMUTE_COMBINE_BACKWARD;
  Layout out, in = { 0 };
  guint e;

  layout_init (&out, &p->shape, p->out_dtype);
  if (combine)
    layout_init (&in, &p->shape, p->permuted_dtype);
  if (p->grad_probs != NULL)
    memset (p->grad_probs, 0, sizeof (float) * n_choices);

  for (e = 0; e < out.n; e++)
    {
      gint64 r;

      for (r = 0; r < out.fit[e]; r++)
        {
          gint64 s = out.start[e] + r;
          gint64 c = s < p->shape.row_capacity ? p->choice_of[s] : -1;
          guint8 *dst = (guint8 *) p->out + out.offset[e] + r * out.row_bytes;
          const guint8 *src, *y = NULL;
          float scale = 1.0f, dot = 0.0f;
          gint64 h;

          if (c < 0 || c >= n_choices)
            {
              memset (dst, 0, out.row_bytes);
              continue;
            }
          src = (const guint8 *) p->tokens + (guint64) (c / p->top_k) * token_bytes;
          if (combine)
            {
              scale = p->probs[c];
              if (r < in.fit[e])
                y = (const guint8 *) p->permuted + in.offset[e] + r * in.row_bytes;
            }
          for (h = 0; h < cols; h++)
            {
              float v = gmlp_num_load_float (src, p->tokens_dtype, h);

              gmlp_num_store_float (dst, p->out_dtype, h, scale * v);
              if (y != NULL)
                dot += v * gmlp_num_load_float (y, p->permuted_dtype, h);
            }
          if (p->grad_probs != NULL)
            p->grad_probs[c] = dot;
        }
    }

  layout_clear (&out);
  if (combine)
    layout_clear (&in);
}

/* COMBINE and BACKWARD: every token, its choices summed in order, then
 * BACKWARD's addend. */
static void
permute_to_tokens (const GmlpBackendPermute *p)
{
  gint64 cols = p->shape.cols, t, h;
  guint64 out_bytes = (guint64) cols * gmlp_num_dtype_size (p->out_dtype);
  g_autofree float *acc = g_new (float, cols);
  Layout in;

  layout_init (&in, &p->shape, p->permuted_dtype);
  for (t = 0; t < p->n_tokens; t++)
    {
      guint8 *dst = (guint8 *) p->out + (guint64) t * out_bytes;
      guint j;

      for (h = 0; h < cols; h++)
        acc[h] = 0.0f;
      for (j = 0; j < p->top_k; j++)
        {
          gint64 c = t * p->top_k + j;
          float w = p->kind == GMLP_PERMUTE_COMBINE ? p->probs[c] : 1.0f;
          const guint8 *src;
          guint64 offset;

          if (!layout_find (&in, p->row_of[c], &offset))
            continue;
          src = (const guint8 *) p->permuted + offset;
          for (h = 0; h < cols; h++)
            acc[h] += w * gmlp_num_load_float (src, p->permuted_dtype, h);
        }
      if (p->addend != NULL)
        for (h = 0; h < cols; h++)
          acc[h] += p->addend[t * cols + h];
      for (h = 0; h < cols; h++)
        gmlp_num_store_float (dst, p->out_dtype, h, acc[h]);
    }
  layout_clear (&in);
}

gboolean
gmlp_cpu_permute (GmlpBackendDevice         *device,
                  const GmlpBackendPermute  *permute,
                  GError                   **error)
{
  if (!gmlp_backend_check_permute ("CPU", permute, error))
    return FALSE;

  if (permute->kind == GMLP_PERMUTE_FORWARD || permute->kind == GMLP_PERMUTE_COMBINE_BACKWARD)
    permute_to_slots (permute);
  else
    permute_to_tokens (permute);
  return TRUE;
}
