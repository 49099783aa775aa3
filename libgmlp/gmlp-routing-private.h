/* gmlp-routing-private.h: what the router and the permutation share
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-routing.h"

G_BEGIN_DECLS

struct _GmlpRouting
{
  GObject             parent_instance;

  GmlpDevice         *device;
  gint64              n_tokens;
  guint               top_k;
  guint               n_experts;
  GmlpGroupedTensor  *indices;            /* T × k INT64, one group */
  GmlpGroupedTensor  *probs;              /* T × k FP32, one group */
  GmlpGroupedTensor  *tokens_per_expert;  /* one member of n_experts INT64 values */
  GmlpGroupedTensor  *aux_loss;           /* 1 × 1 FP32 */
  GmlpGroupedTensor  *z_loss;             /* 1 × 1 FP32 */

  /* The token permutation's state (gmlp-routing-permute.c), guarded by
   * permute_lock. versions: indices and probs as the routing was made
   * with them, and the permuted layout's sizes once written; every use
   * checks them. The layout is made by the first permute and kept: one per
   * routing (sizes == NULL until then). */
  GMutex              permute_lock;
  GArray             *versions;           /* GmlpVersionRecord */
  gint64              padding;            /* rows per expert rounded up to it, >= 1 */
  double              capacity_factor;    /* 0: dropless */
  gint64              expert_capacity;    /* -1: dropless */
  gint64              row_capacity;       /* rows of the permuted layout */
  GmlpGroupedTensor  *sizes;              /* n_experts × 1 INT64: padded rows per expert */
  GmlpGroupedTensor  *row_of;             /* T × k INT64: the row (slot) of each choice, or -1 */
  GmlpGroupedTensor  *choice_of;          /* row_capacity × 1 INT64: the choice of each row, or -1 */
};

/* A routing from a router's forward: every tensor made by the router's
 * backend entry and referenced here (T = the rows of indices). The
 * versions of indices and probs are recorded now: a write through the API
 * after this call makes the routing refuse to permute. */
GmlpRouting *gmlp_routing_new_for_router (GmlpDevice        *device,
                                          guint              n_experts,
                                          GmlpGroupedTensor *indices,
                                          GmlpGroupedTensor *probs,
                                          GmlpGroupedTensor *tokens_per_expert,
                                          GmlpGroupedTensor *aux_loss,
                                          GmlpGroupedTensor *z_loss);

/* gmlp_routing_permute_backward() with @addend (FP32, T × the gradient's
 * columns, one group) added to each token's FP32 sum before its one
 * rounding into the gradient's dtype: the MoE layer adds its router's
 * input gradient so, in the same pass. */
GmlpGroupedTensor *gmlp_routing_permute_backward_add (GmlpRouting        *self,
                                                      GmlpGroupedTensor  *grad_permuted,
                                                      GmlpGroupedTensor  *addend,
                                                      GError            **error);

/* FALSE with GMLP_ERROR_INVALID_STATE for a routing with no tokens (made by
 * g_object_new()). */
gboolean     gmlp_routing_check_usable   (GmlpRouting       *self,
                                          GError           **error);
/* FALSE with GMLP_ERROR_UNSUPPORTED where @device's backend has no token
 * permutation yet; nothing is enqueued. */
gboolean     gmlp_routing_check_backend  (GmlpDevice        *device,
                                          GError           **error);
/* Checks a tensor an argument gives: usable, on @device, of @dtype (a
 * GmlpDType, or -1 for any of FP32, FP16 and BF16), of @cols columns (-1:
 * any); @what names it in the error ("The indices"). */
gboolean     gmlp_routing_check_tensor   (GmlpDevice        *device,
                                          GmlpGroupedTensor *tensor,
                                          const char        *what,
                                          int                dtype,
                                          gint64             cols,
                                          GError           **error);
/* The same for a token-major tensor, which is also one group with its size
 * on the host, of @rows rows (-1: any). */
gboolean     gmlp_routing_check_tokens   (GmlpDevice        *device,
                                          GmlpGroupedTensor *tensor,
                                          const char        *what,
                                          int                dtype,
                                          gint64             rows,
                                          gint64             cols,
                                          GError           **error);

G_END_DECLS
