/* gmlp-backend-permute.h: the argument checks of the token permutation's
 * backend entries, which every backend makes the same way before it
 * enqueues anything
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "backend/gmlp-backend.h"
#include "gmlp-error.h"
#include "gmlp-numeric.h"

G_BEGIN_DECLS

/* Slot counts and byte offsets stick here, far past any allocation. */
#define GMLP_BACKEND_PERMUTE_SATURATION (G_GINT64_CONSTANT (1) << 62)

static inline gboolean
gmlp_backend_permute_is_float (int dtype)
{
  return dtype == GMLP_NUM_FLOAT32 || dtype == GMLP_NUM_FLOAT16 || dtype == GMLP_NUM_BFLOAT16;
}

/* The error domain of gmlp-error.h, by its quark's string: the CUDA module
 * does not link libgmlp. */
#define GMLP_BACKEND_PERMUTE_ERROR (g_quark_from_static_string ("gmlp-error-quark"))

/* FALSE, with INVALID_ARGUMENT from @backend ("CPU", "CUDA"), for a routing
 * a backend cannot serve. */
static inline gboolean
gmlp_backend_check_routing (const char  *backend,
                            gint64       n_tokens,
                            guint        top_k,
                            guint        n_experts,
                            GError     **error)
{
  if (n_tokens >= 0 && n_tokens <= GMLP_BACKEND_PERMUTE_SATURATION / GMLP_BACKEND_MAX_TOP_K &&
      top_k >= 1 && top_k <= GMLP_BACKEND_MAX_TOP_K && n_experts >= 1)
    return TRUE;
  g_set_error (error, GMLP_BACKEND_PERMUTE_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
               "%s: a routing of %" G_GINT64_FORMAT " tokens, top-%u of %u experts",
               backend, n_tokens, top_k, n_experts);
  return FALSE;
}

/* The same for the arguments of routing_map. */
static inline gboolean
gmlp_backend_check_routing_map (const char                   *backend,
                                const GmlpBackendRoutingMap  *map,
                                GError                      **error)
{
  if (!gmlp_backend_check_routing (backend, map->n_tokens, map->top_k, map->n_experts, error))
    return FALSE;
  if (map->padding < 1 || map->padding > GMLP_BACKEND_PERMUTE_SATURATION || map->row_capacity < 0 ||
      map->expert_capacity < -1 || map->sizes == NULL || map->row_of == NULL ||
      map->choice_of == NULL || (map->n_tokens > 0 && map->indices == NULL))
    {
      g_set_error (error, GMLP_BACKEND_PERMUTE_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%s: routing_map needs its arrays, a padding and capacities", backend);
      return FALSE;
    }
  return TRUE;
}

/* The same for the arguments of permute. */
static inline gboolean
gmlp_backend_check_permute (const char                *backend,
                            const GmlpBackendPermute  *p,
                            GError                   **error)
{
  gboolean to_permuted = p->kind == GMLP_PERMUTE_FORWARD || p->kind == GMLP_PERMUTE_COMBINE_BACKWARD;
  gboolean weighted = p->kind == GMLP_PERMUTE_COMBINE || p->kind == GMLP_PERMUTE_COMBINE_BACKWARD;
  const char *why = NULL;

  if (!gmlp_backend_check_routing (backend, p->n_tokens, p->top_k, p->shape.n_groups, error))
    return FALSE;
  if ((int) p->kind < (int) GMLP_PERMUTE_FORWARD || (int) p->kind > (int) GMLP_PERMUTE_COMBINE_BACKWARD)
    why = "unknown kind";
  else if (p->shape.cols < 1 || p->shape.cols > G_MAXINT32 || p->shape.row_capacity < 0 ||
           p->shape.n_groups < 1 || p->shape.device_rows == NULL)
    why = "the permuted layout needs sizes, columns and a capacity";
  else if (!gmlp_backend_permute_is_float (p->out_dtype) ||
           (p->kind != GMLP_PERMUTE_FORWARD && !gmlp_backend_permute_is_float (p->permuted_dtype)) ||
           (p->kind != GMLP_PERMUTE_COMBINE && p->kind != GMLP_PERMUTE_BACKWARD &&
            !gmlp_backend_permute_is_float (p->tokens_dtype)))
    why = "the rows must be float32, float16 or bfloat16";
  else if (p->n_tokens > 0 &&
           (p->row_of == NULL || p->out == NULL || (weighted && p->probs == NULL) ||
            (p->kind != GMLP_PERMUTE_FORWARD && p->permuted == NULL) ||
            (to_permuted && p->tokens == NULL)))
    why = "missing operands";
  else if (p->shape.row_capacity > 0 && p->choice_of == NULL)
    why = "missing the map";
  else if (p->addend != NULL && p->kind != GMLP_PERMUTE_BACKWARD)
    why = "only BACKWARD takes an addend";
  if (why != NULL)
    {
      g_set_error (error, GMLP_BACKEND_PERMUTE_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "%s: permute: %s", backend, why);
      return FALSE;
    }
  return TRUE;
}

G_END_DECLS
