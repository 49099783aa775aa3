/* gmlp-moe-expert-parallel-properties.c: GmlpMoELayer's properties of
 * expert parallelism, and the ranks' agreement on them
 *
 * The layer's expert-parallel properties (communicator, mode, capacity
 * factor, FP8 dispatch, chunks), their checks at construction (which
 * experts this rank holds), and the ranks' agreement: every rank gathers
 * every rank's construct properties once, so that all fail alike where
 * one could not construct or they differ. The experts' step is
 * gmlp-moe-expert-parallel.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gmlp-moe-layer-impl.h"
#include "gmlp-moe-expert-parallel-private.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-thread-private.h"

void
gmlp_moe_parallel_make_pspecs (GParamSpec **pspecs)
{
  const GParamFlags construct = G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY |
                                G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;

  /**
   * GmlpMoELayer:communicator:
   *
   * With a communicator the layer is one rank of an expert-parallel layer:
   * the experts are split evenly over the ranks (this rank holds
   * [method@Gmlp.MoELayer.get_n_local_experts] of them, from
   * [method@Gmlp.MoELayer.get_first_local_expert]), and each token travels
   * to its experts' ranks and back by all-to-all
   * ([property@Gmlp.MoELayer:expert-parallel-mode]). %NULL (the default):
   * one device. It must be on the layer's device, and
   * [property@Gmlp.MoELayer:n-experts] a multiple of its world size.
   *
   * Since: 0.1
   */
  pspecs[GMLP_MOE_PARALLEL_PROP_COMMUNICATOR] =
    g_param_spec_object ("communicator", NULL, NULL, GMLP_TYPE_COMMUNICATOR, construct);

  /**
   * GmlpMoELayer:expert-parallel-mode:
   *
   * How an expert-parallel layer moves the rows: exact (the counts read on
   * the host once a forward) or graph-safe (nothing read on the host,
   * fixed slots). Without a communicator it changes nothing.
   *
   * Since: 0.1
   */
  pspecs[GMLP_MOE_PARALLEL_PROP_MODE] =
    g_param_spec_enum ("expert-parallel-mode", NULL, NULL, GMLP_TYPE_EXPERT_PARALLEL_MODE,
                       GMLP_EXPERT_PARALLEL_MODE_EXACT, construct);

  /**
   * GmlpMoELayer:expert-capacity-factor:
   *
   * In graph-safe mode, the rows each rank can receive for each of its
   * experts from each rank (a slot), as a factor of an even share: `C =
   * ceil (factor × tokens × top_k / n_experts)` (at most `tokens ×
   * top_k`), rounded up to [property@Gmlp.MoELayer:padding]; rows past a
   * slot are dropped, contribute zero as the capacity drops of
   * [property@Gmlp.MoELayer:capacity-factor] do, and are counted
   * ([method@Gmlp.MoELayer.get_dropped_rows]). With a
   * [property@Gmlp.MoELayer:capacity-factor] the slots are the routing's
   * capacity per expert instead, and nothing more is dropped. 0 (the
   * default): slots of `tokens × top_k` rows, which never drop but take
   * `n_experts` times the memory of the dispatched rows. Negative or
   * infinite: an error.
   *
   * Since: 0.1
   */
  pspecs[GMLP_MOE_PARALLEL_PROP_CAPACITY_FACTOR] =
    g_param_spec_double ("expert-capacity-factor", NULL, NULL, -INFINITY, INFINITY, 0.0, construct);

  /**
   * GmlpMoELayer:dispatch-fp8-recipe:
   *
   * FP8 dispatch: with %GMLP_SCALING_RECIPE_BLOCKWISE (one FP32 scale per
   * 1 × 128 block of a row) or %GMLP_SCALING_RECIPE_MXFP8 (one E8M0 scale
   * per 1 × 32 block), the forward's dispatch quantizes the rows on the
   * sending rank, they cross the all-to-all in FP8 with their scales, and
   * the experts' rank dequantizes them into the experts' input, in
   * [property@Gmlp.MoELayer:dtype]: the experts compute on (and their
   * weight gradients see) the rows as quantized, the router and the shared
   * expert on the tokens as they are. The return trip and the whole
   * backward cross in the layer's dtype. %GMLP_SCALING_RECIPE_NONE (the
   * default): the rows cross as they are. Other recipes are refused at
   * construction; without a communicator it changes nothing.
   * docs/expert-parallel.md tells what crosses and what it saves.
   *
   * Since: 0.1
   */
  pspecs[GMLP_MOE_PARALLEL_PROP_DISPATCH_FP8_RECIPE] =
    g_param_spec_enum ("dispatch-fp8-recipe", NULL, NULL, GMLP_TYPE_SCALING_RECIPE,
                       GMLP_SCALING_RECIPE_NONE, construct);

  /**
   * GmlpMoELayer:dispatch-fp8-format:
   *
   * The FP8 type of the rows an FP8 dispatch
   * ([property@Gmlp.MoELayer:dispatch-fp8-recipe]) sends: E4M3 (the
   * default) or E5M2; the hybrid format means E4M3 here, the rows being
   * activations.
   *
   * Since: 0.1
   */
  pspecs[GMLP_MOE_PARALLEL_PROP_DISPATCH_FP8_FORMAT] =
    g_param_spec_enum ("dispatch-fp8-format", NULL, NULL, GMLP_TYPE_FP8_FORMAT,
                       GMLP_FP8_FORMAT_E4M3, construct);

  /**
   * GmlpMoELayer:expert-parallel-chunks:
   *
   * How many chunks of its local experts an expert-parallel forward and
   * backward pipeline: the rows for the first chunk's experts travel
   * first, and those experts compute while the next chunk's rows are in
   * flight, their outputs starting back while the next chunk computes
   * (the backward likewise with the gradients). Each chunk is a run of
   * whole local experts, so every expert still sees all its rows in one
   * product and the results are those of one chunk, bit for bit on the
   * CPU; the experts' weight gradients come after the last chunk, one
   * computation as the gradient contract says (wgrad-ready once, one
   * pending backward_dw). At most
   * [method@Gmlp.MoELayer.get_n_local_experts] chunks are made (more are
   * taken as that many); 1: no pipeline. Experts of an FP8 recipe train in
   * one chunk (their quantizers' scales are of all their rows); their
   * inference forward is pipelined. Without a communicator it changes
   * nothing. docs/expert-parallel.md tells what overlaps what.
   *
   * Since: 0.1
   */
  pspecs[GMLP_MOE_PARALLEL_PROP_CHUNKS] =
    g_param_spec_uint ("expert-parallel-chunks", NULL, NULL, 1, G_MAXUINT, 4, construct);
}

void
gmlp_moe_parallel_get_property (GmlpMoELayer *self,
                                guint         index,
                                GValue       *value)
{
  switch (index)
    {
    case GMLP_MOE_PARALLEL_PROP_COMMUNICATOR:
      g_value_set_object (value, self->communicator);
      break;
    case GMLP_MOE_PARALLEL_PROP_MODE:
      g_value_set_enum (value, self->parallel_mode);
      break;
    case GMLP_MOE_PARALLEL_PROP_CAPACITY_FACTOR:
      g_value_set_double (value, self->expert_capacity_factor);
      break;
    case GMLP_MOE_PARALLEL_PROP_DISPATCH_FP8_RECIPE:
      g_value_set_enum (value, self->dispatch_fp8_recipe);
      break;
    case GMLP_MOE_PARALLEL_PROP_DISPATCH_FP8_FORMAT:
      g_value_set_enum (value, self->dispatch_fp8_format);
      break;
    case GMLP_MOE_PARALLEL_PROP_CHUNKS:
      g_value_set_uint (value, self->parallel_chunks);
      break;
    default:
      g_assert_not_reached ();
    }
}

void
gmlp_moe_parallel_set_property (GmlpMoELayer *self,
                                guint         index,
                                const GValue *value)
{
  switch (index)
    {
    case GMLP_MOE_PARALLEL_PROP_COMMUNICATOR:
      g_set_object (&self->communicator, g_value_get_object (value));
      break;
    case GMLP_MOE_PARALLEL_PROP_MODE:
      self->parallel_mode = g_value_get_enum (value);
      break;
    case GMLP_MOE_PARALLEL_PROP_CAPACITY_FACTOR:
      self->expert_capacity_factor = g_value_get_double (value);
      break;
    case GMLP_MOE_PARALLEL_PROP_DISPATCH_FP8_RECIPE:
      self->dispatch_fp8_recipe = g_value_get_enum (value);
      break;
    case GMLP_MOE_PARALLEL_PROP_DISPATCH_FP8_FORMAT:
      self->dispatch_fp8_format = g_value_get_enum (value);
      break;
    case GMLP_MOE_PARALLEL_PROP_CHUNKS:
      self->parallel_chunks = g_value_get_uint (value);
      break;
    default:
      g_assert_not_reached ();
    }
}

gboolean
gmlp_moe_parallel_check (GmlpMoELayer  *self,
                         GError       **error)
{
  GmlpDevice *device;
  int world;

  self->first_expert = 0;
  self->n_local_experts = self->n_experts;
  if (!(self->expert_capacity_factor >= 0.0 && self->expert_capacity_factor <= G_MAXFLOAT))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The expert capacity factor must be finite and not negative (0: slots that "
                   "never drop), not %g", self->expert_capacity_factor);
      return FALSE;
    }
  if (self->dispatch_fp8_recipe != GMLP_SCALING_RECIPE_NONE &&
      self->dispatch_fp8_recipe != GMLP_SCALING_RECIPE_BLOCKWISE &&
      self->dispatch_fp8_recipe != GMLP_SCALING_RECIPE_MXFP8)
    {
      g_autoptr(GEnumClass) recipes = g_type_class_ref (GMLP_TYPE_SCALING_RECIPE);
      GEnumValue *v = g_enum_get_value (recipes, self->dispatch_fp8_recipe);

      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "An FP8 dispatch quantizes each row on its own: the blockwise or the MXFP8 "
                   "recipe, not %s (per-tensor scales would need the whole tensor's amax)",
                   v != NULL ? v->value_nick : "an unknown recipe");
      return FALSE;
    }
  if (self->communicator == NULL)
    return TRUE;

  device = gmlp_communicator_get_device (self->communicator);
  world = gmlp_communicator_get_world_size (self->communicator);
  if (device == NULL || world < 1)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The communicator was not constructed");
      return FALSE;
    }
  if (device != self->device)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The communicator is on %s, the MoE layer on %s: an expert-parallel layer "
                   "and its communicator share a device", gmlp_device_get_name (device),
                   gmlp_device_get_name (self->device));
      return FALSE;
    }
  if (self->n_experts % (guint) world != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "The %u experts do not divide evenly among the communicator's %d ranks",
                   self->n_experts, world);
      return FALSE;
    }
  self->n_local_experts = self->n_experts / (guint) world;
  self->first_expert = (guint) gmlp_communicator_get_rank (self->communicator) *
                       self->n_local_experts;
  g_clear_object (&self->dispatch_quantizer);
  if (self->dispatch_fp8_recipe != GMLP_SCALING_RECIPE_NONE)
    self->dispatch_quantizer = gmlp_quantizer_new (self->device, self->dispatch_fp8_recipe,
                                                   self->dispatch_fp8_format,
                                                   GMLP_QUANTIZER_ROLE_INPUT);
  return TRUE;
}

static int
compare_pspecs (gconstpointer a,
                gconstpointer b)
{
  return strcmp (g_param_spec_get_name (*(GParamSpec *const *) a),
                 g_param_spec_get_name (*(GParamSpec *const *) b));
}

/* A property's value as 64 bits (a double's bits), or FALSE for those
 * that are objects (the device, the communicator: each rank its own). */
static gboolean
encode_property (GObject    *object,
                 GParamSpec *pspec,
                 gint64     *bits)
{
  g_auto(GValue) value = G_VALUE_INIT;
  GType type = G_TYPE_FUNDAMENTAL (pspec->value_type);
  double d;

  if (type == G_TYPE_OBJECT)
    return FALSE;
  g_value_init (&value, pspec->value_type);
  g_object_get_property (object, pspec->name, &value);
  if (type == G_TYPE_BOOLEAN)
    *bits = g_value_get_boolean (&value);
  else if (type == G_TYPE_UINT)
    *bits = g_value_get_uint (&value);
  else if (type == G_TYPE_INT64)
    *bits = g_value_get_int64 (&value);
  else if (type == G_TYPE_ENUM)
    *bits = g_value_get_enum (&value);
  else if (type == G_TYPE_FLAGS)
    *bits = g_value_get_flags (&value);
  else if (type == G_TYPE_DOUBLE)
    {
      d = g_value_get_double (&value);
      memcpy (bits, &d, sizeof d);
    }
  else
    g_assert_not_reached ();
  return TRUE;
}

static char *
format_property (GParamSpec *pspec,
                 gint64      bits)
{
  double d;

  if (G_TYPE_FUNDAMENTAL (pspec->value_type) != G_TYPE_DOUBLE)
    return g_strdup_printf ("%" G_GINT64_FORMAT, bits);
  memcpy (&d, &bits, sizeof d);
  return g_strdup_printf ("%g", d);
}

static gboolean
agree (GmlpMoELayer  *self,
       gboolean       local_ok,
       GError       **error)
{
  g_autofree GParamSpec **pspecs = NULL;
  g_autofree GParamSpec **used = NULL;
  g_autofree gint64 *mine = NULL, *all = NULL;
  g_autoptr(GmlpGroupedTensor) send = NULL, recv = NULL;
  g_autofree gint64 *rows = NULL;
  GmlpDevice *device = gmlp_communicator_get_device (self->communicator);
  int world = gmlp_communicator_get_world_size (self->communicator);
  int rank = gmlp_communicator_get_rank (self->communicator);
  guint n_pspecs, n = 1, i;
  gint64 n_values;
  int a;

  if (device == NULL || world < 1)
    return local_ok;   /* no group to tell: its error is this rank's */

  pspecs = g_object_class_list_properties (G_OBJECT_GET_CLASS (self), &n_pspecs);
  qsort (pspecs, n_pspecs, sizeof *pspecs, compare_pspecs);
  used = g_new (GParamSpec *, n_pspecs + 1);
  mine = g_new (gint64, n_pspecs + 1);
  mine[0] = local_ok;
  for (i = 0; i < n_pspecs; i++)
    if (encode_property (G_OBJECT (self), pspecs[i], &mine[n]))
      used[n++] = pspecs[i];

  n_values = n;
  rows = g_new (gint64, world);
  for (a = 0; a < world; a++)
    rows[a] = n_values;
  send = gmlp_grouped_tensor_new_from_ints (device, GMLP_DTYPE_INT64, &n_values, 1, 1, mine, n,
                                            error);
  if (send == NULL)
    return FALSE;
  recv = gmlp_grouped_tensor_new (device, GMLP_DTYPE_INT64, rows, world, 1, error);
  if (recv == NULL ||
      !gmlp_communicator_all_gather (self->communicator, send, recv, error))
    return FALSE;
  all = gmlp_grouped_tensor_to_ints (recv, NULL, error);
  if (all == NULL || !local_ok)
    return FALSE;

  for (a = 0; a < world; a++)
    if (all[a * n] == 0)
      {
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                     "Rank %d of the expert-parallel MoE layer could not construct its layer", a);
        return FALSE;
      }
  for (i = 1; i < n; i++)
    for (a = 0; a < world; a++)
      if (all[a * n + i] != mine[i])
        {
          g_autofree char *theirs = format_property (used[i], all[a * n + i]);
          g_autofree char *ours = format_property (used[i], mine[i]);

          g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                       "The ranks of the expert-parallel MoE layer differ: %s is %s on rank %d, "
                       "%s on rank %d", used[i]->name, theirs, a, ours, rank);
          return FALSE;
        }
  return TRUE;
}

gboolean
gmlp_moe_parallel_ensure_agreed (GmlpMoELayer  *self,
                                 GError       **error)
{
  if (self->communicator != NULL)
    {
      g_autoptr(GmlpMutexLocker) locker = gmlp_mutex_locker_new (&self->last_lock);

      if (!self->agreed)
        {
          g_autoptr(GError) local = NULL;

          self->agreed = TRUE;
          /* A rank that failed on its own takes part, and keeps its error. */
          if (!agree (self, self->construct_error == NULL, &local) && self->construct_error == NULL)
            self->construct_error = g_steal_pointer (&local);
        }
    }
  return gmlp_check_constructed (self, self->construct_error, error);
}
