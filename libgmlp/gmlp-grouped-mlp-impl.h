/* gmlp-grouped-mlp-impl.h: what the files of GmlpGroupedMLP share
 *
 * The MLP is two files, one job each:
 *
 * - gmlp-grouped-mlp.c: the object: type, properties, signal,
 *   construction, the FP8 recipe, accessors;
 * - gmlp-grouped-mlp-steps.c: the steps: the activation passes (plain,
 *   gradient, fused with FC2's input quantization), forward, backward and
 *   backward_dw across both layers.
 *
 * No other file includes it: the tests' view of the MLP is
 * gmlp-grouped-mlp-private.h.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-grouped-mlp.h"
#include "gmlp-grouped-mlp-private.h"
#include "gmlp-device-private.h"

G_BEGIN_DECLS

struct _GmlpGroupedMLP
{
  GObject             parent_instance;

  GmlpDevice         *device;
  guint               n_groups;
  gint64              hidden;
  gint64              ffn_hidden;
  GmlpActivation      activation;
  GmlpDType           dtype;
  GmlpLinearFlags     flags;
  guint64             id;
  /* What the MLP made its quantizers with (NONE: no FP8 of its making). */
  GmlpScalingRecipe   fp8_recipe;
  GmlpFp8Format       fp8_format;
  /* Given to both layers, also to layers not made yet (at construction). */
  gboolean            cache_fp8_weights;

  GmlpGroupedLinear  *fc1;
  GmlpGroupedLinear  *fc2;

  /* Why constructed() failed; every method reports it. */
  GError             *construct_error;
  /* Runs backward and backward_dw one at a time, so that both layers'
   * weight gradients come from the same backward (the layers' own locks
   * order each layer only). Recursive, as the layers'. */
  GRecMutex           grad_lock;
};

/* gmlp-grouped-mlp.c */

/* Emits wgrad-ready with an event recorded now on the device's stream. */
gboolean gmlp_grouped_mlp_emit_wgrad_ready (GmlpGroupedMLP  *self,
                                            GError         **error);

G_END_DECLS
