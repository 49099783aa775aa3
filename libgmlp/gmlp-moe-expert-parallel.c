/* gmlp-moe-expert-parallel.c: GmlpMoELayer's experts over the ranks of a
 * communicator
 *
 * Rank r of W holds the experts [r L, (r + 1) L), L = E / W. Its router
 * permutes its own tokens over all E experts (the one-device permute:
 * group a L + b of the permuted layout is local expert b of rank a), and
 * the experts' step moves them:
 *
 *   dispatch     permuted layout (MEMBERS of the W × L grid)
 *                  -> a send buffer -> all-to-all -> a receive buffer
 *                  -> the local experts' input (MEMBERS_BY_B: expert b's
 *                     rows from rank 0, then rank 1, ...)
 *   experts      the local GroupedMLP of L groups, device sizes
 *   return trip  the mirror image, back into the permuted layout
 *
 * The buffers are PACKED in exact mode (the counts gathered and read on
 * the host once a forward, the rows sent by all_to_all_rows with those
 * splits) and SLOTS of C rows per (rank, expert) in graph-safe mode (the
 * counts travel on the device, all_to_all of whole slots, nothing read on
 * the host). The backward moves the gradients the same way with the
 * forward's counts. gmlp_row_chunks_move() does every move on the device.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <gio/gio.h>

#include "gmlp-moe-layer-impl.h"
#include "gmlp-moe-expert-parallel-private.h"
#include "gmlp-communicator-private.h"
#include "gmlp-device-private.h"
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-grouped-mlp-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-quantizer-private.h"
#include "gmlp-routing-private.h"
#include "gmlp-saved-activations-private.h"
#include "gmlp-row-chunks-private.h"
#include "gmlp-thread-private.h"
#include "gmlp-numeric.h"

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

struct _GmlpMoEParallelStep
{
  GmlpExpertParallelMode  mode;
  int                     world;
  guint                   n_local;
  gint64                  cols;
  /* The permuted layout: rows per expert (E values, the chunks' counts on
   * the way out) and its row capacity. */
  GmlpGroupedTensor      *sizes;
  gint64                  row_capacity;
  /* W × L: what each chunk (rank a, local expert b) kept in its slot
   * (graph-safe; the counts on the way back), and what came from rank a
   * for local expert b. */
  GmlpGroupedTensor      *kept;
  GmlpGroupedTensor      *recv_counts;
  /* The local experts' input: L sizes, its row capacity. */
  GmlpGroupedTensor      *expert_sizes;
  gint64                  expert_rows;
  /* graph-safe: the rows of a slot */
  gint64                  slot_rows;
  /* exact, on the host: the rows to and from each rank, and their sums;
   * per chunk (a, b) of the W × L grid, the rows to rank a's expert b and
   * from rank a for local expert b */
  gint64                 *send_rows;
  gint64                 *recv_rows;
  gint64                 *send_grid;
  gint64                 *recv_grid;
  gint64                  total_send;
  gint64                  total_recv;
  /* The forward's chunks of local experts (expert-parallel-chunks); a
   * backward takes the same. */
  guint                   n_chunks;
};

void
gmlp_moe_parallel_step_free (gpointer data)
{
  GmlpMoEParallelStep *step = data;

  if (step == NULL)
    return;
  g_clear_object (&step->sizes);
  g_clear_object (&step->kept);
  g_clear_object (&step->recv_counts);
  g_clear_object (&step->expert_sizes);
  g_free (step->send_rows);
  g_free (step->recv_rows);
  g_free (step->send_grid);
  g_free (step->recv_grid);
  g_free (step);
}

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GmlpMoEParallelStep, gmlp_moe_parallel_step_free)

/* One step's calls: a local failure once a collective was entered fails
 * the group (gmlp_communicator_abort()), so that the other ranks, which
 * wait in the next collective, get GMLP_ERROR_ABORTED at once instead of
 * at the timeout; a collective's own failure every rank sees already. */
typedef struct {
  GmlpMoELayer  *layer;
  gboolean       entered;
  gboolean       collective_failed;
} Trip;

static gboolean
collective (Trip     *trip,
            gboolean  ok)
{
  trip->entered = TRUE;
  trip->collective_failed = !ok;
  return ok;
}

static GmlpGroupedTensor *
trip_end (Trip              *trip,
          GmlpGroupedTensor *result)
{
  if (result == NULL && trip->entered && !trip->collective_failed)
    gmlp_communicator_abort (trip->layer->communicator);
  return result;
}

static gboolean
move (GmlpGroupedTensor  *counts,
      GmlpMoEParallelStep *step,
      gint64              max_chunk_rows,
      GmlpGroupedTensor  *src,
      GmlpChunkLayout     src_layout,
      GmlpGroupedTensor  *dst,
      GmlpChunkLayout     dst_layout,
      GmlpMoveRowsFlags   flags,
      GmlpGroupedTensor  *kept,
      GmlpGroupedTensor  *dropped,
      GError            **error)
{
  GmlpChunkSide from = { src, src_layout }, to = { dst, dst_layout };

  return gmlp_row_chunks_move (counts, (guint) step->world, step->n_local, max_chunk_rows, &from,
                               &to, flags, kept, dropped, error);
}

/* A buffer of one group of @rows rows, or of W × L slots, of @cols
 * columns. */
static GmlpGroupedTensor *
new_buffer (GmlpMoELayer         *self,
            GmlpMoEParallelStep  *step,
            GmlpDType             dtype,
            gint64                rows,
            gint64                cols,
            GError              **error)
{
  g_autofree gint64 *slots = NULL;
  guint n = (guint) step->world * step->n_local, i;

  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT)
    return gmlp_grouped_tensor_new (self->device, dtype, &rows, 1, cols, error);
  slots = g_new (gint64, n);
  for (i = 0; i < n; i++)
    slots[i] = step->slot_rows;
  return gmlp_grouped_tensor_new (self->device, dtype, slots, n, cols, error);
}

/* Exact mode: where rows are whole multiples of the member alignment, the
 * groups of a tensor with device sizes lie back to back, so that its first
 * rows are the packed layout of its groups in order: a view of its storage
 * as one group of all its rows then sends or receives them in place,
 * without the copy into a packed buffer. NULL where it can't. */
static GmlpGroupedTensor *
packed_view (GmlpMoEParallelStep *step,
             GmlpGroupedTensor   *members)
{
  gint64 rows = gmlp_grouped_tensor_get_row_capacity (members);

  if (step->mode != GMLP_EXPERT_PARALLEL_MODE_EXACT ||
      (gmlp_grouped_tensor_get_cols (members) *
       gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (members))) % GMLP_MEMBER_ALIGNMENT != 0)
    return NULL;
  return gmlp_grouped_tensor_new_rows_view (members, &rows, 1);
}

/* The all-to-all of a trip: out (@back FALSE: from the permuted layout's
 * rank to the experts') or back. @done (optional) as
 * gmlp_communicator_all_to_all_full()'s: the compute stream's wait left to
 * the caller (join()). */
static gboolean
exchange (Trip                 *trip,
          GmlpMoEParallelStep  *step,
          GmlpGroupedTensor    *send,
          GmlpGroupedTensor    *recv,
          gboolean              back,
          GmlpEvent           **done,
          GError              **error)
{
  GmlpCommunicator *comm = trip->layer->communicator;
  guint w = (guint) step->world;

  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
    return collective (trip, gmlp_communicator_all_to_all_full (comm, send, recv, done, error));
  return collective (trip, gmlp_communicator_all_to_all_rows_full (comm, send,
                                                                   back ? step->recv_rows : step->send_rows,
                                                                   w, recv,
                                                                   back ? step->send_rows : step->recv_rows,
                                                                   w, done, error));
}

/* The compute stream waits for every event of @events (all-to-alls left
 * to it), which it empties. After a failure (@error NULL) it still waits
 * for each, so that no buffer is let go, and no capture left, with rows in
 * flight. */
static gboolean
join (GmlpMoELayer  *self,
      GPtrArray     *events,
      GError       **error)
{
  gboolean ok = TRUE;
  guint i;

  for (i = 0; i < events->len; i++)
    {
      g_autoptr(GError) local = NULL;

      if (!gmlp_event_wait_on_device (g_ptr_array_index (events, i), self->device, &local) && ok)
        {
          ok = FALSE;
          if (error != NULL)
            g_propagate_error (error, g_steal_pointer (&local));
        }
    }
  g_ptr_array_set_size (events, 0);
  return ok;
}

/* What a dispatch sends: the rows, and with an FP8 dispatch their scales,
 * which are rows too (one per row: 1 × 128 or 1 × 32 blocks) and travel
 * with the same counts and layouts. */
enum { PART_ROWS, PART_SCALES, N_PARTS };

typedef struct {
  GmlpGroupedTensor *send[N_PARTS];
  GmlpGroupedTensor *recv[N_PARTS];
  GmlpGroupedTensor *out[N_PARTS];
} Parts;

static void
parts_clear (Parts *parts)
{
  guint i;

  for (i = 0; i < N_PARTS; i++)
    {
      g_clear_object (&parts->send[i]);
      g_clear_object (&parts->recv[i]);
      g_clear_object (&parts->out[i]);
    }
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Parts, parts_clear)

/* A dispatch's send buffer of @part (in the permuted layout): its own
 * storage where exact mode sends in place, else the rows packed (exact) or
 * in their slots (graph-safe); @count: the forward's rows, whose move
 * counts what the slots keep (step->kept) and drop (@dropped). */
static GmlpGroupedTensor *
pack (Trip                 *trip,
      GmlpMoEParallelStep  *step,
      GmlpGroupedTensor    *part,
      gboolean              count,
      GmlpGroupedTensor    *dropped,
      GError              **error)
{
  gboolean exact = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT;
  g_autoptr(GmlpGroupedTensor) send = packed_view (step, part);

  if (send != NULL)
    return g_steal_pointer (&send);
  send = new_buffer (trip->layer, step, gmlp_grouped_tensor_get_dtype (part), step->total_send,
                     gmlp_grouped_tensor_get_cols (part), error);
  if (send == NULL ||
      !move (step->sizes, step, exact ? -1 : step->slot_rows, part, GMLP_CHUNK_LAYOUT_MEMBERS, send,
             exact ? GMLP_CHUNK_LAYOUT_PACKED : GMLP_CHUNK_LAYOUT_SLOTS, GMLP_MOVE_ROWS_NONE,
             count && !exact ? step->kept : NULL, count ? dropped : NULL, error))
    return NULL;
  return g_steal_pointer (&send);
}

/* Graph-safe mode's forward: what each slot kept, to the slots' ranks (L
 * counts per rank), into step->recv_counts. */
static gboolean
exchange_kept (Trip                 *trip,
               GmlpMoEParallelStep  *step,
               GError              **error)
{
  g_autofree gint64 *split = g_new (gint64, step->world);
  int a;

  for (a = 0; a < step->world; a++)
    split[a] = step->n_local;
  return collective (trip, gmlp_communicator_all_to_all_rows (trip->layer->communicator, step->kept,
                                                              split, step->world, step->recv_counts,
                                                              split, step->world, error));
}

/* Rows in the permuted layout to the local experts' input layout on their
 * ranks. @first: the forward's, which writes the experts' sizes and (in
 * graph-safe mode) what each slot kept, and adds the drops to @dropped;
 * with a dispatch quantizer it sends the rows in FP8 with their scales and
 * dequantizes them into the rows' dtype on arrival. */
static GmlpGroupedTensor *
dispatch (Trip                    *trip,
          GmlpMoEParallelStep     *step,
          GmlpGroupedTensor       *rows,
          gboolean                 first,
          GmlpGroupedTensor       *dropped,
          GmlpMoEParallelOverlap   overlap,
          gpointer                 overlap_data,
          GError                 **error)
{
  g_autoptr(GPtrArray) in_flight = g_ptr_array_new_with_free_func (g_object_unref);
  GmlpMoELayer *self = trip->layer;
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (rows);
  gboolean exact = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT;
  gboolean fp8 = first && self->dispatch_quantizer != NULL;
  g_autoptr(GmlpGroupedTensor) q = NULL;
  g_auto(Parts) parts = { { NULL, }, };
  GmlpGroupedTensor **send = parts.send, **recv = parts.recv, **out = parts.out;
  GmlpGroupedTensor *part[N_PARTS] = { rows, NULL };
  guint n_parts = 1, i;

  if (fp8)
    {
      q = gmlp_quantizer_quantize_full (self->dispatch_quantizer, rows, FALSE, error);
      if (q == NULL)
        return NULL;
      part[PART_ROWS] = q;
      part[PART_SCALES] = gmlp_grouped_tensor_get_scale_inv (q);
      n_parts = N_PARTS;
    }
  for (i = 0; i < n_parts; i++)
    {
      send[i] = pack (trip, step, part[i], first && i == PART_ROWS, dropped, error);
      if (send[i] == NULL)
        return NULL;
      recv[i] = new_buffer (self, step, gmlp_grouped_tensor_get_dtype (part[i]), step->total_recv,
                            gmlp_grouped_tensor_get_cols (part[i]), error);
      if (recv[i] == NULL)
        return NULL;
    }
  if (first && !exact && !exchange_kept (trip, step, error))
    return NULL;
  /* The rows travel while the caller's work (the shared expert) runs. */
  for (i = 0; i < n_parts; i++)
    {
      GmlpEvent *done = NULL;

      if (!exchange (trip, step, send[i], recv[i], FALSE, &done, error))
        {
          join (self, in_flight, NULL);
          return NULL;
        }
      g_ptr_array_add (in_flight, done);
    }
  if (overlap != NULL && !overlap (overlap_data, error))
    {
      join (self, in_flight, NULL);
      return NULL;
    }
  if (!join (self, in_flight, error))
    return NULL;

  out[PART_ROWS] = gmlp_grouped_tensor_new_with_device_sizes (self->device,
                                                              gmlp_grouped_tensor_get_dtype (part[PART_ROWS]),
                                                              step->expert_sizes, step->expert_rows,
                                                              step->cols, error);
  if (out[PART_ROWS] == NULL)
    return NULL;
  /* The scales: a row of them per row, on the rows' sizes. */
  if (fp8)
    {
      out[PART_SCALES] = gmlp_grouped_tensor_new_blocked (out[PART_ROWS],
                                                          gmlp_grouped_tensor_get_dtype (part[PART_SCALES]),
                                                          1, gmlp_grouped_tensor_get_cols (part[PART_SCALES]),
                                                          NULL, error);
      if (out[PART_SCALES] == NULL)
        return NULL;
    }
  for (i = 0; i < n_parts; i++)
    if (!move (step->recv_counts, step, -1, recv[i],
               exact ? GMLP_CHUNK_LAYOUT_PACKED : GMLP_CHUNK_LAYOUT_SLOTS, out[i],
               GMLP_CHUNK_LAYOUT_MEMBERS_BY_B,
               first && i == PART_ROWS ? GMLP_MOVE_ROWS_SET_SIZES : GMLP_MOVE_ROWS_NONE,
               NULL, NULL, error))
      return NULL;
  if (!fp8)
    return g_steal_pointer (&out[PART_ROWS]);
  gmlp_grouped_tensor_set_quantized (out[PART_ROWS], gmlp_quantizer_get_recipe (self->dispatch_quantizer),
                                     gmlp_grouped_tensor_get_quantize_flags (q), out[PART_SCALES],
                                     NULL, FALSE);
  return gmlp_grouped_tensor_dequantize (out[PART_ROWS], dtype, error);
}

/* Rows in the local experts' layout back to their ranks' permuted layout;
 * in graph-safe mode the rows a slot dropped come back as zeros. */
static GmlpGroupedTensor *
return_trip (Trip                 *trip,
             GmlpMoEParallelStep  *step,
             GmlpGroupedTensor    *rows,
             GError              **error)
{
  GmlpMoELayer *self = trip->layer;
  GmlpDType dtype = gmlp_grouped_tensor_get_dtype (rows);
  gboolean exact = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT;
  GmlpChunkLayout buffers = exact ? GMLP_CHUNK_LAYOUT_PACKED : GMLP_CHUNK_LAYOUT_SLOTS;
  g_autoptr(GmlpGroupedTensor) send = NULL, recv = NULL, out = NULL;

  send = new_buffer (self, step, dtype, step->total_recv, step->cols, error);
  if (send == NULL ||
      !move (step->recv_counts, step, -1, rows, GMLP_CHUNK_LAYOUT_MEMBERS_BY_B, send, buffers,
             GMLP_MOVE_ROWS_NONE, NULL, NULL, error))
    return NULL;
  out = gmlp_grouped_tensor_new_with_device_sizes (self->device, dtype, step->sizes,
                                                   step->row_capacity, step->cols, error);
  if (out == NULL)
    return NULL;
  /* Received in place where the permuted layout is the packed one. */
  recv = packed_view (step, out);
  if (recv != NULL)
    return exchange (trip, step, send, recv, TRUE, NULL, error) ? g_steal_pointer (&out) : NULL;
  recv = new_buffer (self, step, dtype, step->total_send, step->cols, error);
  if (recv == NULL || !exchange (trip, step, send, recv, TRUE, NULL, error) ||
      !move (exact ? step->sizes : step->kept, step, -1, recv, buffers, out,
             GMLP_CHUNK_LAYOUT_MEMBERS, exact ? GMLP_MOVE_ROWS_NONE : GMLP_MOVE_ROWS_ZERO_REST,
             NULL, NULL, error))
    return NULL;
  return g_steal_pointer (&out);
}

/* A new INT64 tensor of one group of @n counts. */
static GmlpGroupedTensor *
new_counts (GmlpMoELayer  *self,
            gint64         n,
            GError       **error)
{
  return gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_INT64, &n, 1, 1, error);
}

/* Exact mode: every rank's rows per expert, gathered and read on the host
 * (the forward's one wait for the device), give the splits of the
 * all-to-alls and the counts this rank's experts receive. */
static gboolean
exact_counts (Trip                 *trip,
              GmlpMoEParallelStep  *step,
              GError              **error)
{
  GmlpMoELayer *self = trip->layer;
  int w = step->world, r = gmlp_communicator_get_rank (self->communicator), a;
  guint l = step->n_local, e = self->n_experts, b;
  g_autofree gint64 *rows = g_new (gint64, w), *all = NULL, *received = NULL;
  g_autoptr(GmlpGroupedTensor) gathered = NULL;

  for (a = 0; a < w; a++)
    rows[a] = e;
  gathered = gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_INT64, rows, w, 1, error);
  if (gathered == NULL ||
      !collective (trip, gmlp_communicator_all_gather (self->communicator, step->sizes, gathered,
                                                       error)))
    return FALSE;
  all = gmlp_grouped_tensor_to_ints (gathered, NULL, error);
  if (all == NULL)
    return FALSE;

  step->send_rows = g_new0 (gint64, w);
  step->recv_rows = g_new0 (gint64, w);
  step->send_grid = g_new (gint64, (gsize) w * l);
  received = g_new (gint64, (gsize) w * l);
  for (a = 0; a < w; a++)
    for (b = 0; b < l; b++)
      {
        gint64 out = all[(gsize) r * e + a * l + b];            /* to rank a's expert b */
        gint64 in = all[(gsize) a * e + r * l + b];             /* from rank a to my expert b */

        step->send_rows[a] += out;
        step->recv_rows[a] += in;
        step->send_grid[a * l + b] = out;
        received[a * l + b] = in;
        step->total_send += out;
        step->total_recv += in;
      }
  rows[0] = (gint64) w * l;
  step->recv_counts = gmlp_grouped_tensor_new_from_ints (self->device, GMLP_DTYPE_INT64, rows, 1, 1,
                                                         received, (gsize) w * l, error);
  step->recv_grid = g_steal_pointer (&received);
  step->expert_rows = step->total_recv;
  return step->recv_counts != NULL;
}

/* Graph-safe mode: the rows of a slot, from the host's values alone. */
static gint64
slot_rows (GmlpMoELayer *self,
           GmlpRouting  *routing)
{
  guint64 n_choices = (guint64) gmlp_routing_get_n_tokens (routing) * self->top_k;
  guint64 padding = MAX (self->padding, 1), cap = n_choices;

  if (self->capacity_factor > 0.0)
    return routing->expert_capacity;
  if (self->expert_capacity_factor > 0.0)
    {
      double per = ceil (self->expert_capacity_factor * (double) n_choices / self->n_experts);

      cap = per >= (double) n_choices ? n_choices : (guint64) per;
    }
  return (gint64) ((cap + padding - 1) / padding * padding);
}

static gboolean
graph_safe_counts (GmlpMoEParallelStep  *step,
                   GmlpMoELayer         *self,
                   GmlpRouting          *routing,
                   GError              **error)
{
  gint64 n = (gint64) step->world * step->n_local;
  guint64 rows;

  step->slot_rows = slot_rows (self, routing);
  if (!gmlp_checked_mul ((guint64) n, (guint64) step->slot_rows, &rows) || rows > G_MAXINT64)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Slots of %" G_GINT64_FORMAT " rows for %" G_GINT64_FORMAT " experts are too "
                   "many rows", step->slot_rows, n);
      return FALSE;
    }
  step->expert_rows = step->total_send = step->total_recv = (gint64) rows;
  step->kept = new_counts (self, n, error);
  if (step->kept == NULL)
    return FALSE;
  step->recv_counts = new_counts (self, n, error);
  return step->recv_counts != NULL;
}

/* The pipeline of a forward and a backward (expert-parallel-chunks):
 * chunk c is the run of local experts [b0, b1),
 * every rank's rows for them. Chunking by whole experts keeps each
 * expert's rows in one product (the experts' calls see the chunk's groups,
 * the rest empty), as large as unchunked and with the same bits, and each
 * chunk a contiguous span of every peer's block in the trips' buffers, so
 * that the rows are packed once and sent by spans:
 *
 *   pack (one move) -> start every chunk's dispatch (communication stream)
 *   -> the caller's overlap -> per chunk: wait for its rows, unpack, the
 *   experts, pack its outputs, start its return -> wait for the returns,
 *   unpack (one move).
 *
 * Training: each chunk's experts save their own activations (their input
 * has rows in the chunk's groups only), and the backward runs the same
 * pipeline on the gradients through gmlp_grouped_mlp_backward_chunks():
 * the input gradients chunk by chunk, then one weight-gradient computation
 * per layer whose chunk c products have rows in chunk c's groups only and
 * leave the other groups' gradients as they are (accumulate, no rows), so
 * that every expert's gradient is its one product and the contract's
 * events and counts are those of one backward: the same products as
 * unchunked, from the same rows in the same order, the same bits.
 *
 * Exact mode receives each chunk into a buffer of its own (the packed
 * layout of its rows alone) and sends it back from another; graph-safe
 * mode's slots sit where they are whatever the counts, so its chunks share
 * the trips' full slot buffers. The moves of a chunk take the step's
 * counts with every other chunk's zeroed. */

/* Chunk c of @n_chunks of the @n_local experts. */
static void
chunk_experts (guint  n_local,
               guint  n_chunks,
               guint  c,
               guint *b0,
               guint *b1)
{
  *b0 = (guint) ((guint64) c * n_local / n_chunks);
  *b1 = (guint) ((guint64) (c + 1) * n_local / n_chunks);
}

/* Exact mode: the rows of chunk [b0, b1) in a W × L grid of counts. */
static gint64
chunk_rows (GmlpMoEParallelStep *step,
            const gint64        *grid,
            guint                b0,
            guint                b1)
{
  gint64 n = 0;
  guint b;
  int a;

  for (a = 0; a < step->world; a++)
    for (b = b0; b < b1; b++)
      n += grid[(gsize) a * step->n_local + b];
  return n;
}

/* Where chunk [b0, b1) lies in a trip's buffer, peer by peer (a: the
 * rank the block goes to or comes from), in bytes: graph-safe, the slots
 * a L + b0 ... a L + b1 - 1; exact, its rows in a buffer packed in (a, b)
 * order by @grid, all of them (@dense FALSE) or the chunk's alone. */
static void
chunk_spans (GmlpMoEParallelStep *step,
             const gint64        *grid,
             gboolean             dense,
             guint                b0,
             guint                b1,
             gsize                row_bytes,
             gsize               *offsets,
             gsize               *bytes)
{
  guint l = step->n_local, b;
  gint64 at = 0;
  int a;

  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
    {
      gsize stride = gmlp_num_member_stride (step->slot_rows, row_bytes);

      for (a = 0; a < step->world; a++)
        {
          offsets[a] = ((gsize) a * l + b0) * stride;
          bytes[a] = (gsize) (b1 - b0) * stride;
        }
      return;
    }
  for (a = 0; a < step->world; a++)
    {
      gint64 n = 0;

      for (b = 0; b < l; b++)
        {
          gboolean in = b >= b0 && b < b1;

          if (b == b0)
            offsets[a] = (gsize) at * row_bytes;
          if (in)
            n += grid[(gsize) a * l + b];
          if (in || !dense)
            at += grid[(gsize) a * l + b];
        }
      bytes[a] = (gsize) n * row_bytes;
    }
}

/* @counts (W × L values on the device) with the chunks (a, b) outside
 * [b0, b1) zero: what chunk [b0, b1)'s moves take. */
static GmlpGroupedTensor *
chunk_counts (GmlpMoELayer         *self,
              GmlpMoEParallelStep  *step,
              GmlpGroupedTensor    *counts,
              guint                 b0,
              guint                 b1,
              GError              **error)
{
  g_autoptr(GmlpGroupedTensor) masked = NULL;
  guint l = step->n_local;
  int a;

  masked = new_counts (self, (gint64) step->world * l, error);
  if (masked == NULL || !gmlp_grouped_tensor_fill_zero (masked, error))
    return NULL;
  for (a = 0; a < step->world; a++)
    {
      gsize at = ((gsize) a * l + b0) * sizeof (gint64);

      if (!GMLP_DEVICE_CALL (self->device, copy, (guint8 *) gmlp_grouped_tensor_get_data (masked) + at,
                             (const guint8 *) gmlp_grouped_tensor_get_data (counts) + at,
                             (gsize) (b1 - b0) * sizeof (gint64), error))
        return NULL;
    }
  return g_steal_pointer (&masked);
}

/* What the pipeline's communication stream may still touch, and the events
 * of its all-to-alls: both outlive the pipeline's work until joined. */
typedef struct {
  GPtrArray *keep;
  GPtrArray *events;
} InFlight;

/* One chunk's all-to-all, by spans; the event kept. */
static gboolean
send_chunk (Trip                 *trip,
            InFlight             *flight,
            GmlpGroupedTensor    *send,
            const gsize          *send_spans,
            GmlpGroupedTensor    *recv,
            const gsize          *recv_spans,
            GError              **error)
{
  int w = gmlp_communicator_get_world_size (trip->layer->communicator);
  GmlpEvent *done = NULL;

  g_ptr_array_add (flight->keep, g_object_ref (send));
  g_ptr_array_add (flight->keep, g_object_ref (recv));
  if (!collective (trip, gmlp_communicator_all_to_all_spans_full (trip->layer->communicator,
                                                                  send, send_spans, send_spans + w,
                                                                  recv, recv_spans, recv_spans + w,
                                                                  &done, error)))
    return FALSE;
  g_ptr_array_add (flight->events, done);
  return TRUE;
}

/* The compute stream waits for event @i and those before it (one stream's
 * events complete in order). */
static gboolean
wait_sent (GmlpMoELayer  *self,
           InFlight      *flight,
           guint          i,
           GError       **error)
{
  return gmlp_event_wait_on_device (g_ptr_array_index (flight->events, i), self->device, error);
}

/* A pipeline's state: the trip out (its parts, their receive buffers and
 * the events of their chunks), the trip back (its buffers). */
typedef struct {
  Trip                 *trip;
  GmlpMoEParallelStep  *step;
  InFlight              flight;
  guint                 n_chunks;
  /* The forward's dispatch: it counts, sends FP8 with a dispatch
   * quantizer, and (graph-safe) sends what each slot kept. */
  gboolean              first;
  GmlpDType             dtype;
  GmlpGroupedTensor    *q;
  GmlpGroupedTensor    *part[N_PARTS];
  guint                 n_parts;
  GmlpGroupedTensor   **recv;           /* n_chunks × N_PARTS, held by flight.keep */
  guint                *arrived;
  gsize                *spans;
  GmlpGroupedTensor    *back_send;      /* graph-safe: the return's slots */
  GmlpGroupedTensor    *back_recv;
  GmlpGroupedTensor    *out;
  gboolean              in_place;
} Pipe;

static void
pipe_init (Pipe                 *pipe,
           Trip                 *trip,
           GmlpMoEParallelStep  *step,
           guint                 n_chunks,
           gboolean              first)
{
  *pipe = (Pipe) { trip, step, { g_ptr_array_new_with_free_func (g_object_unref),
                                 g_ptr_array_new_with_free_func (g_object_unref) },
                   n_chunks, first, };
  pipe->recv = g_new0 (GmlpGroupedTensor *, (gsize) n_chunks * N_PARTS);
  pipe->arrived = g_new0 (guint, n_chunks);
  pipe->spans = g_new (gsize, 4 * step->world);
}

/* Whatever happened, nothing is let go with rows in flight. */
static void
pipe_clear (Pipe *pipe)
{
  join (pipe->trip->layer, pipe->flight.events, NULL);
  g_ptr_array_unref (pipe->flight.events);
  g_ptr_array_unref (pipe->flight.keep);
  g_clear_object (&pipe->q);
  g_clear_object (&pipe->back_send);
  g_clear_object (&pipe->back_recv);
  g_clear_object (&pipe->out);
  g_free (pipe->recv);
  g_free (pipe->arrived);
  g_free (pipe->spans);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Pipe, pipe_clear)

/* Packs @rows (the permuted layout) and starts every chunk's trip out: the
 * communication stream sends them one after the other while the experts
 * work through the chunks. Then the trip back's buffers. */
static gboolean
pipe_start (Pipe               *pipe,
            GmlpGroupedTensor  *rows,
            GmlpGroupedTensor  *dropped,
            GError            **error)
{
  GmlpMoEParallelStep *step = pipe->step;
  GmlpMoELayer *self = pipe->trip->layer;
  gboolean exact = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT;
  int w = step->world;
  guint i, c, b0, b1;

  pipe->dtype = gmlp_grouped_tensor_get_dtype (rows);
  pipe->part[PART_ROWS] = rows;
  pipe->n_parts = 1;
  if (pipe->first && self->dispatch_quantizer != NULL)
    {
      pipe->q = gmlp_quantizer_quantize_full (self->dispatch_quantizer, rows, FALSE, error);
      if (pipe->q == NULL)
        return FALSE;
      pipe->part[PART_ROWS] = pipe->q;
      pipe->part[PART_SCALES] = gmlp_grouped_tensor_get_scale_inv (pipe->q);
      pipe->n_parts = N_PARTS;
    }
  for (i = 0; i < pipe->n_parts; i++)
    {
      GmlpGroupedTensor *send = pack (pipe->trip, step, pipe->part[i], pipe->first && i == PART_ROWS,
                                      dropped, error);

      if (send == NULL)
        return FALSE;
      g_ptr_array_add (pipe->flight.keep, send);
    }
  if (pipe->first && !exact && !exchange_kept (pipe->trip, step, error))
    return FALSE;

  for (c = 0; c < pipe->n_chunks; c++)
    {
      chunk_experts (step->n_local, pipe->n_chunks, c, &b0, &b1);
      for (i = 0; i < pipe->n_parts; i++)
        {
          GmlpGroupedTensor *part = pipe->part[i];
          gsize row_bytes = (gsize) gmlp_grouped_tensor_get_cols (part) *
                            gmlp_dtype_get_size (gmlp_grouped_tensor_get_dtype (part));
          GmlpGroupedTensor **r = &pipe->recv[c * N_PARTS + i];

          if (exact || c == 0)
            {
              *r = new_buffer (self, step, gmlp_grouped_tensor_get_dtype (part),
                               exact ? chunk_rows (step, step->recv_grid, b0, b1) : step->total_recv,
                               gmlp_grouped_tensor_get_cols (part), error);
              if (*r == NULL)
                return FALSE;
              g_ptr_array_add (pipe->flight.keep, *r);
            }
          else
            *r = pipe->recv[i];
          chunk_spans (step, step->send_grid, FALSE, b0, b1, row_bytes, pipe->spans, pipe->spans + w);
          chunk_spans (step, step->recv_grid, TRUE, b0, b1, row_bytes, pipe->spans + 2 * w,
                       pipe->spans + 3 * w);
          /* The send buffers are the first n_parts of flight.keep. */
          if (!send_chunk (pipe->trip, &pipe->flight, g_ptr_array_index (pipe->flight.keep, i),
                           pipe->spans, *r, pipe->spans + 2 * w, error))
            return FALSE;
        }
      pipe->arrived[c] = pipe->flight.events->len - 1;
    }
  return TRUE;
}

/* The trip back's buffers (in place where the permuted layout is the
 * packed one). */
static gboolean
pipe_back (Pipe    *pipe,
           GError **error)
{
  GmlpMoEParallelStep *step = pipe->step;
  GmlpMoELayer *self = pipe->trip->layer;

  pipe->out = gmlp_grouped_tensor_new_with_device_sizes (self->device, pipe->dtype, step->sizes,
                                                         step->row_capacity, step->cols, error);
  if (pipe->out == NULL)
    return FALSE;
  pipe->back_recv = packed_view (step, pipe->out);
  pipe->in_place = pipe->back_recv != NULL;
  if (!pipe->in_place)
    pipe->back_recv = new_buffer (self, step, pipe->dtype, step->total_send, step->cols, error);
  if (pipe->back_recv == NULL)
    return FALSE;
  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
    {
      pipe->back_send = new_buffer (self, step, pipe->dtype, step->total_recv, step->cols, error);
      if (pipe->back_send == NULL)
        return FALSE;
    }
  return TRUE;
}

static gint64
pipe_in_rows (Pipe  *pipe,
              guint  b0,
              guint  b1)
{
  GmlpMoEParallelStep *step = pipe->step;

  return step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT ? chunk_rows (step, step->recv_grid, b0, b1)
                                                       : (gint64) step->world * (b1 - b0) * step->slot_rows;
}

/* Chunk c's rows, once arrived, in its experts' input layout: its groups,
 * the others empty (sizes of its own, written by the move: a backward's
 * are its forward's). FP8: dequantized. */
static GmlpGroupedTensor *
pipe_in (Pipe    *pipe,
         guint    c,
         GError **error)
{
  GmlpMoEParallelStep *step = pipe->step;
  GmlpMoELayer *self = pipe->trip->layer;
  GmlpChunkLayout buffers = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT ? GMLP_CHUNK_LAYOUT_PACKED
                                                                          : GMLP_CHUNK_LAYOUT_SLOTS;
  g_autoptr(GmlpGroupedTensor) counts = NULL, sizes = NULL, rows = NULL, scales = NULL;
  guint i, b0, b1;

  chunk_experts (step->n_local, pipe->n_chunks, c, &b0, &b1);
  counts = chunk_counts (self, step, step->recv_counts, b0, b1, error);
  sizes = new_counts (self, step->n_local, error);
  if (counts == NULL || sizes == NULL || !wait_sent (self, &pipe->flight, pipe->arrived[c], error))
    return NULL;

  rows = gmlp_grouped_tensor_new_with_device_sizes (self->device,
                                                    gmlp_grouped_tensor_get_dtype (pipe->part[PART_ROWS]),
                                                    sizes, pipe_in_rows (pipe, b0, b1), step->cols, error);
  if (rows == NULL)
    return NULL;
  if (pipe->n_parts > 1)
    {
      scales = gmlp_grouped_tensor_new_blocked (rows, gmlp_grouped_tensor_get_dtype (pipe->part[PART_SCALES]),
                                                1, gmlp_grouped_tensor_get_cols (pipe->part[PART_SCALES]),
                                                NULL, error);
      if (scales == NULL)
        return NULL;
    }
  for (i = 0; i < pipe->n_parts; i++)
    if (!move (counts, step, -1, pipe->recv[c * N_PARTS + i], buffers, i == PART_ROWS ? rows : scales,
               GMLP_CHUNK_LAYOUT_MEMBERS_BY_B,
               i == PART_ROWS ? GMLP_MOVE_ROWS_SET_SIZES : GMLP_MOVE_ROWS_NONE, NULL, NULL, error))
      return NULL;
  if (pipe->n_parts == 1)
    return g_steal_pointer (&rows);
  gmlp_grouped_tensor_set_quantized (rows, gmlp_quantizer_get_recipe (self->dispatch_quantizer),
                                     gmlp_grouped_tensor_get_quantize_flags (pipe->q), scales, NULL, FALSE);
  return gmlp_grouped_tensor_dequantize (rows, pipe->dtype, error);
}

/* Chunk c's outputs start back while the next chunk computes. */
static gboolean
pipe_out (Pipe               *pipe,
          guint               c,
          GmlpGroupedTensor  *expert_out,
          GError            **error)
{
  GmlpMoEParallelStep *step = pipe->step;
  GmlpMoELayer *self = pipe->trip->layer;
  gboolean exact = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT;
  gsize row_bytes = (gsize) step->cols * gmlp_dtype_get_size (pipe->dtype);
  g_autoptr(GmlpGroupedTensor) counts = NULL, send = NULL;
  int w = step->world;
  guint b0, b1;

  chunk_experts (step->n_local, pipe->n_chunks, c, &b0, &b1);
  counts = chunk_counts (self, step, step->recv_counts, b0, b1, error);
  send = exact ? new_buffer (self, step, pipe->dtype, pipe_in_rows (pipe, b0, b1), step->cols, error)
               : g_object_ref (pipe->back_send);
  if (counts == NULL || send == NULL ||
      !move (counts, step, -1, expert_out, GMLP_CHUNK_LAYOUT_MEMBERS_BY_B, send,
             exact ? GMLP_CHUNK_LAYOUT_PACKED : GMLP_CHUNK_LAYOUT_SLOTS, GMLP_MOVE_ROWS_NONE,
             NULL, NULL, error))
    return FALSE;
  chunk_spans (step, step->recv_grid, TRUE, b0, b1, row_bytes, pipe->spans, pipe->spans + w);
  chunk_spans (step, step->send_grid, FALSE, b0, b1, row_bytes, pipe->spans + 2 * w, pipe->spans + 3 * w);
  return send_chunk (pipe->trip, &pipe->flight, send, pipe->spans, pipe->back_recv, pipe->spans + 2 * w,
                     error);
}

/* Every chunk back: into the permuted layout (in graph-safe mode the rows
 * a slot dropped as zeros). */
static GmlpGroupedTensor *
pipe_end (Pipe    *pipe,
          GError **error)
{
  GmlpMoEParallelStep *step = pipe->step;
  gboolean exact = step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT;

  if (!wait_sent (pipe->trip->layer, &pipe->flight, pipe->flight.events->len - 1, error))
    return NULL;
  if (!pipe->in_place &&
      !move (exact ? step->sizes : step->kept, step, -1, pipe->back_recv,
             exact ? GMLP_CHUNK_LAYOUT_PACKED : GMLP_CHUNK_LAYOUT_SLOTS, pipe->out,
             GMLP_CHUNK_LAYOUT_MEMBERS, exact ? GMLP_MOVE_ROWS_NONE : GMLP_MOVE_ROWS_ZERO_REST,
             NULL, NULL, error))
    return NULL;
  return g_steal_pointer (&pipe->out);
}

/* The forward by chunks; saving (@saved given), each chunk's experts save
 * their own activations, children of one set in chunk order, which the
 * backward takes chunk by chunk (backward_chunked()). */
static GmlpGroupedTensor *
forward_chunked (Trip                    *trip,
                 GmlpMoEParallelStep     *step,
                 GmlpGroupedTensor       *permuted,
                 guint                    n_chunks,
                 GmlpSavedActivations   **saved,
                 GmlpGroupedTensor       *dropped,
                 GmlpMoEParallelOverlap   overlap,
                 gpointer                 overlap_data,
                 GError                 **error)
{
  g_auto(Pipe) pipe;
  g_autoptr(GmlpSavedActivations) all = saved != NULL ? gmlp_saved_activations_new (0) : NULL;
  GmlpGroupedTensor *out;
  guint c;

  pipe_init (&pipe, trip, step, n_chunks, TRUE);
  if (!pipe_start (&pipe, permuted, dropped, error) ||
      (overlap != NULL && !overlap (overlap_data, error)) ||
      !pipe_back (&pipe, error))
    return NULL;
  for (c = 0; c < n_chunks; c++)
    {
      g_autoptr(GmlpGroupedTensor) expert_in = pipe_in (&pipe, c, error), expert_out = NULL;
      g_autoptr(GmlpSavedActivations) chunk_saved = NULL;

      if (expert_in == NULL)
        return NULL;
      expert_out = gmlp_grouped_mlp_forward (trip->layer->experts, expert_in,
                                             saved != NULL ? &chunk_saved : NULL, error);
      if (expert_out == NULL || !pipe_out (&pipe, c, expert_out, error))
        return NULL;
      if (all != NULL)
        gmlp_saved_activations_add_child (all, chunk_saved);
    }
  out = pipe_end (&pipe, error);
  if (out != NULL && saved != NULL)
    *saved = g_steal_pointer (&all);
  return out;
}

static GmlpGroupedTensor *
hook_grad_output (gpointer   data,
                  guint      c,
                  GError   **error)
{
  return pipe_in (data, c, error);
}

static gboolean
hook_grad_input (gpointer            data,
                 guint               c,
                 GmlpGroupedTensor  *grad_input,
                 GError            **error)
{
  return pipe_out (data, c, grad_input, error);
}

/* The backward of forward_chunked(): the output gradients travel by the
 * same chunks and the experts' input gradients of chunk c start back while
 * chunk c + 1 computes. The experts' weight gradients come last, one
 * computation per layer over every chunk's rows (each chunk's products
 * write its own experts' gradients only): the gradient contract's, as
 * unchunked. */
static GmlpGroupedTensor *
backward_chunked (Trip                    *trip,
                  GmlpMoEParallelStep     *step,
                  GmlpSavedActivations    *saved,
                  GmlpGroupedTensor       *grad_output,
                  GmlpMoEParallelOverlap   overlap,
                  gpointer                 overlap_data,
                  GError                 **error)
{
  g_auto(Pipe) pipe;
  g_autofree GmlpSavedActivations **chunks = g_new (GmlpSavedActivations *, step->n_chunks);
  g_autofree guint *bounds = g_new (guint, step->n_chunks + 1);
  GmlpMLPChunkHooks hooks = { hook_grad_output, hook_grad_input, &pipe };
  guint c, b0, b1;

  for (c = 0; c < step->n_chunks; c++)
    {
      chunks[c] = gmlp_saved_activations_get_child (saved, c);
      chunk_experts (step->n_local, step->n_chunks, c, &b0, &b1);
      bounds[c] = b0;
      bounds[c + 1] = b1;
    }
  pipe_init (&pipe, trip, step, step->n_chunks, FALSE);
  if (!pipe_start (&pipe, grad_output, NULL, error) ||
      (overlap != NULL && !overlap (overlap_data, error)) ||
      !pipe_back (&pipe, error) ||
      !gmlp_grouped_mlp_backward_chunks (trip->layer->experts, chunks, bounds, step->n_chunks, &hooks,
                                         error))
    return NULL;
  return pipe_end (&pipe, error);
}

/* How many chunks a forward pipelines. A training forward's experts save
 * by chunk and their backward computes the weight gradients of every
 * chunk in one computation; not FP8 experts, whose quantizers would see
 * each chunk alone (amax, delayed scaling): those train in one chunk. */
static guint
n_chunks_for (GmlpMoELayer  *self,
              gboolean       saving)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (self->experts);

  if (saving && gmlp_grouped_linear_get_quantizer (fc1, GMLP_QUANTIZER_ROLE_INPUT) != NULL)
    return 1;
  return MIN (self->parallel_chunks, self->n_local_experts);
}

GmlpGroupedTensor *
gmlp_moe_parallel_forward (GmlpMoELayer           *self,
                           GmlpRouting            *routing,
                           GmlpGroupedTensor      *permuted,
                           GmlpSavedActivations  **saved,
                           GmlpMoEParallelStep   **step_out,
                           GmlpMoEParallelOverlap  overlap,
                           gpointer                overlap_data,
                           GError                **error)
{
  g_autoptr(GmlpMoEParallelStep) step = g_new0 (GmlpMoEParallelStep, 1);
  g_autoptr(GmlpGroupedTensor) dropped = NULL, expert_in = NULL, expert_out = NULL, out = NULL;
  Trip trip = { self, FALSE, FALSE };
  GmlpGroupedTensor *sizes;

  step->mode = self->parallel_mode;
  step->world = gmlp_communicator_get_world_size (self->communicator);
  step->n_local = self->n_local_experts;
  step->cols = gmlp_grouped_tensor_get_cols (permuted);
  sizes = gmlp_grouped_tensor_get_sizes (permuted, error);
  if (sizes == NULL)
    return NULL;
  step->sizes = g_object_ref (sizes);
  step->row_capacity = gmlp_grouped_tensor_get_row_capacity (permuted);

  /* What can fail on this rank alone comes first. */
  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
    {
      gint64 one = 1;

      if (!graph_safe_counts (step, self, routing, error))
        return NULL;
      dropped = gmlp_grouped_tensor_new (self->device, GMLP_DTYPE_INT64, &one, 1, 1, error);
      if (dropped == NULL || !gmlp_grouped_tensor_fill_zero (dropped, error))
        return NULL;
    }
  step->expert_sizes = new_counts (self, step->n_local, error);
  if (step->expert_sizes == NULL)
    return NULL;

  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_EXACT && !exact_counts (&trip, step, error))
    return trip_end (&trip, NULL);
  /* The experts run chunk by chunk (see the pipeline above), saving or
   * not; the backward takes the chunks as the forward made them. */
  step->n_chunks = n_chunks_for (self, saved != NULL);
  if (step->n_chunks > 1)
    {
      out = forward_chunked (&trip, step, permuted, step->n_chunks, saved, dropped, overlap,
                             overlap_data, error);
      if (out == NULL)
        return trip_end (&trip, NULL);
    }
  else
    {
      expert_in = dispatch (&trip, step, permuted, TRUE, dropped, overlap, overlap_data, error);
      if (expert_in == NULL)
        return trip_end (&trip, NULL);
      expert_out = gmlp_grouped_mlp_forward (self->experts, expert_in, saved, error);
      if (expert_out == NULL)
        return trip_end (&trip, NULL);
      out = return_trip (&trip, step, expert_out, error);
      if (out == NULL)
        return trip_end (&trip, NULL);
    }

  gmlp_mutex_lock (&self->last_lock);
  g_set_object (&self->last_dropped, dropped);
  gmlp_mutex_unlock (&self->last_lock);
  if (step_out != NULL)
    *step_out = g_steal_pointer (&step);
  return g_steal_pointer (&out);
}

GmlpGroupedTensor *
gmlp_moe_parallel_backward (GmlpMoELayer           *self,
                            GmlpSavedActivations   *saved,
                            GmlpMoEParallelStep    *step,
                            GmlpGroupedTensor      *grad_output,
                            GmlpMoEParallelOverlap  overlap,
                            gpointer                overlap_data,
                            GError                **error)
{
  g_autoptr(GmlpGroupedTensor) grad_expert_out = NULL, grad_expert_in = NULL;
  Trip trip = { self, FALSE, FALSE };

  if (step == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                   "These saved activations are not of an expert-parallel forward");
      return NULL;
    }
  if (step->n_chunks > 1)
    return trip_end (&trip, backward_chunked (&trip, step, saved, grad_output, overlap, overlap_data,
                                              error));
  grad_expert_out = dispatch (&trip, step, grad_output, FALSE, NULL, overlap, overlap_data, error);
  if (grad_expert_out == NULL)
    return trip_end (&trip, NULL);
  grad_expert_in = gmlp_grouped_mlp_backward (self->experts, saved, grad_expert_out, error);
  if (grad_expert_in == NULL)
    return trip_end (&trip, NULL);
  return trip_end (&trip, return_trip (&trip, step, grad_expert_in, error));
}
