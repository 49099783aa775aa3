/* gmlp-router-impl.h: what the files of GmlpRouter share
 *
 * The router is two files, one job each:
 *
 * - gmlp-router.c: the object: type, properties, signal, construction,
 *   parameters, accessors;
 * - gmlp-router-compute.c: what it computes: forward, backward (and the
 *   MoE layer's backward_fp32), backward_dw and update_expert_bias.
 *
 * No other file includes it: the MoE layer's view of the router is
 * gmlp-router-private.h.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-router.h"
#include "gmlp-router-private.h"
#include "gmlp-device-private.h"

G_BEGIN_DECLS

struct _GmlpRouter
{
  GObject             parent_instance;

  GmlpDevice         *device;
  gint64              hidden;
  guint               n_experts;
  guint               top_k;
  GmlpScoreFunction   score_function;
  gboolean            softmax_before_topk;
  gboolean            renormalize;
  double              scaling_factor;
  guint               n_groups;
  guint               topk_groups;
  gboolean            use_expert_bias;
  double              bias_update_rate;
  double              aux_loss_coeff;
  double              z_loss_coeff;
  GmlpLinearFlags     flags;
  guint64             id;

  /* The options as the backend takes them (floats narrowed). */
  GmlpBackendRouter   options;
  float               bias_rate;

  GmlpGroupedLinear  *gate;         /* one group, n_experts × hidden, FP32 */
  GmlpGroupedTensor  *expert_bias;  /* 1 × n_experts FP32, or NULL */

  /* Why constructed() failed; every method reports it. */
  GError             *construct_error;
  /* Runs backward and backward_dw one at a time, so that the router's
   * wgrad-ready follows its gate's; recursive, as the layers'. */
  GRecMutex           grad_lock;
  /* Writes of the expert bias take turns. */
  GMutex              bias_lock;
};

/* gmlp-router.c */

/* Emits wgrad-ready with an event recorded now on the device's stream. */
gboolean gmlp_router_emit_wgrad_ready      (GmlpRouter  *self,
                                            GError     **error);
/* GMLP_ERROR_INVALID_STATE when the router has no expert bias. */
gboolean gmlp_router_check_has_expert_bias (GmlpRouter  *self,
                                            GError     **error);

G_END_DECLS
