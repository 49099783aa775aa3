/* gmlp-moe-layer-impl.h: what the files of GmlpMoELayer share
 *
 * The layer is these files, one job each:
 *
 * - gmlp-moe-layer.c: the object: type, properties, construction,
 *   parameters, FP8;
 * - gmlp-moe-layer-steps.c: the steps (router, permute, experts, combine,
 *   shared expert): forward, backward and backward_dw;
 * - gmlp-moe-layer-accessors.c: the getters;
 * - gmlp-moe-expert-parallel*.c: the experts spread over the ranks of a
 *   GmlpCommunicator (gmlp-moe-expert-parallel-private.h): its
 *   properties and the ranks' agreement at construction (-properties.c),
 *   and the experts' step (gmlp-moe-expert-parallel.c) with the dispatch
 *   and the return trip of their rows (-trips.c), pipelined by chunks of
 *   experts (-chunks.c).
 *
 * No other file includes it.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-moe-layer.h"
#include "gmlp-quantizer.h"

G_BEGIN_DECLS

/* The router's options a layer forwards to it (router_options in
 * gmlp-moe-layer.c). */
#define N_ROUTER_OPTIONS 10

/* What a saved MoE step keeps besides its children (router, experts,
 * shared expert): the routing, whose map combine and the backwards read. */
#define SAVED_ROUTING "gmlp-moe-layer-routing"
/* With a communicator, also what the experts' step keeps for its backward
 * (GmlpMoEParallelStep). */
#define SAVED_PARALLEL "gmlp-moe-layer-parallel"

struct _GmlpMoELayer
{
  GObject             parent_instance;

  GmlpDevice         *device;
  gint64              hidden;
  gint64              ffn_hidden;
  guint               n_experts;
  guint               top_k;
  GmlpActivation      activation;
  GmlpDType           dtype;
  GmlpLinearFlags     flags;
  guint               padding;
  double              capacity_factor;
  gint64              shared_ffn_hidden;
  /* What the layer gave its experts (NONE: no FP8 of its making). */
  GmlpScalingRecipe   fp8_recipe;
  GmlpFp8Format       fp8_format;
  GValue              router_values[N_ROUTER_OPTIONS];
  guint64             id;

  /* Expert parallelism: NULL communicator for one device; else this rank
   * holds the experts [first_expert, first_expert + n_local_experts). */
  GmlpCommunicator   *communicator;
  GmlpExpertParallelMode parallel_mode;
  double              expert_capacity_factor;
  /* FP8 dispatch (NONE: the rows cross in the layer's dtype); its
   * quantizer, with a communicator and a recipe. */
  GmlpScalingRecipe   dispatch_fp8_recipe;
  GmlpFp8Format       dispatch_fp8_format;
  GmlpQuantizer      *dispatch_quantizer;
  /* The chunks of local experts a forward and a backward pipeline
   * (expert-parallel-chunks). */
  guint               parallel_chunks;
  guint               first_expert;
  guint               n_local_experts;
  gboolean            agreed;       /* the ranks' agreement ran (under last_lock) */

  GmlpRouter         *router;
  GmlpGroupedMLP     *experts;      /* the local experts */
  GmlpGroupedMLP     *shared;       /* NULL without a shared expert */

  GMutex              last_lock;
  GmlpRouting        *last;         /* of the last forward to finish */
  GmlpGroupedTensor  *last_dropped; /* its dispatch's dropped rows (graph-safe) */
  GRecMutex           grad_lock;    /* backward and backward_dw take turns */

  GError             *construct_error;
};

G_END_DECLS
