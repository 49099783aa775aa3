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
#include "gmlp-enum-types.h"
#include "gmlp-error.h"
#include "gmlp-error-private.h"
#include "gmlp-grouped-mlp-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-quantizer-private.h"
#include "gmlp-routing-private.h"
#include "gmlp-row-chunks-private.h"
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
  /* exact, on the host: the rows to and from each rank, and their sums */
  gint64                 *send_rows;
  gint64                 *recv_rows;
  gint64                  total_send;
  gint64                  total_recv;
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
 * rank to the experts') or back. */
static gboolean
exchange (Trip                 *trip,
          GmlpMoEParallelStep  *step,
          GmlpGroupedTensor    *send,
          GmlpGroupedTensor    *recv,
          gboolean              back,
          GError              **error)
{
  GmlpCommunicator *comm = trip->layer->communicator;
  guint w = (guint) step->world;

  if (step->mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
    return collective (trip, gmlp_communicator_all_to_all (comm, send, recv, error));
  return collective (trip, gmlp_communicator_all_to_all_rows (comm, send,
                                                              back ? step->recv_rows : step->send_rows,
                                                              w, recv,
                                                              back ? step->send_rows : step->recv_rows,
                                                              w, error));
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

/* Rows in the permuted layout to the local experts' input layout on their
 * ranks. @first: the forward's, which writes the experts' sizes and (in
 * graph-safe mode) what each slot kept, and adds the drops to @dropped;
 * with a dispatch quantizer it sends the rows in FP8 with their scales and
 * dequantizes them into the rows' dtype on arrival. */
static GmlpGroupedTensor *
dispatch (Trip                 *trip,
          GmlpMoEParallelStep  *step,
          GmlpGroupedTensor    *rows,
          gboolean              first,
          GmlpGroupedTensor    *dropped,
          GError              **error)
{
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
      GmlpDType part_dtype = gmlp_grouped_tensor_get_dtype (part[i]);
      gint64 cols = gmlp_grouped_tensor_get_cols (part[i]);

      send[i] = packed_view (step, part[i]);
      if (send[i] == NULL)
        {
          /* The rows' move counts what the slots keep and drop. */
          gboolean count = first && i == PART_ROWS;

          send[i] = new_buffer (self, step, part_dtype, step->total_send, cols, error);
          if (send[i] == NULL ||
              !move (step->sizes, step, exact ? -1 : step->slot_rows, part[i],
                     GMLP_CHUNK_LAYOUT_MEMBERS, send[i],
                     exact ? GMLP_CHUNK_LAYOUT_PACKED : GMLP_CHUNK_LAYOUT_SLOTS,
                     GMLP_MOVE_ROWS_NONE, count && !exact ? step->kept : NULL,
                     count ? dropped : NULL, error))
            return NULL;
        }
      recv[i] = new_buffer (self, step, part_dtype, step->total_recv, cols, error);
      if (recv[i] == NULL)
        return NULL;
    }
  if (first && !exact)
    {
      /* What each slot kept, to the slots' ranks: L counts per rank. */
      g_autofree gint64 *split = g_new (gint64, step->world);
      int a;

      for (a = 0; a < step->world; a++)
        split[a] = step->n_local;
      if (!collective (trip, gmlp_communicator_all_to_all_rows (self->communicator, step->kept,
                                                                split, step->world,
                                                                step->recv_counts, split,
                                                                step->world, error)))
        return NULL;
    }
  for (i = 0; i < n_parts; i++)
    if (!exchange (trip, step, send[i], recv[i], FALSE, error))
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
    return exchange (trip, step, send, recv, TRUE, error) ? g_steal_pointer (&out) : NULL;
  recv = new_buffer (self, step, dtype, step->total_send, step->cols, error);
  if (recv == NULL || !exchange (trip, step, send, recv, TRUE, error) ||
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
  received = g_new (gint64, (gsize) w * l);
  for (a = 0; a < w; a++)
    for (b = 0; b < l; b++)
      {
        gint64 out = all[(gsize) r * e + a * l + b];            /* to rank a's expert b */
        gint64 in = all[(gsize) a * e + r * l + b];             /* from rank a to my expert b */

        step->send_rows[a] += out;
        step->recv_rows[a] += in;
        received[a * l + b] = in;
        step->total_send += out;
        step->total_recv += in;
      }
  rows[0] = (gint64) w * l;
  step->recv_counts = gmlp_grouped_tensor_new_from_ints (self->device, GMLP_DTYPE_INT64, rows, 1, 1,
                                                         received, (gsize) w * l, error);
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

GmlpGroupedTensor *
gmlp_moe_parallel_forward (GmlpMoELayer           *self,
                           GmlpRouting            *routing,
                           GmlpGroupedTensor      *permuted,
                           GmlpSavedActivations  **saved,
                           GmlpMoEParallelStep   **step_out,
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
  expert_in = dispatch (&trip, step, permuted, TRUE, dropped, error);
  if (expert_in == NULL)
    return trip_end (&trip, NULL);
  expert_out = gmlp_grouped_mlp_forward (self->experts, expert_in, saved, error);
  if (expert_out == NULL)
    return trip_end (&trip, NULL);
  out = return_trip (&trip, step, expert_out, error);
  if (out == NULL)
    return trip_end (&trip, NULL);

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
  grad_expert_out = dispatch (&trip, step, grad_output, FALSE, NULL, error);
  if (grad_expert_out == NULL)
    return trip_end (&trip, NULL);
  grad_expert_in = gmlp_grouped_mlp_backward (self->experts, saved, grad_expert_out, error);
  if (grad_expert_in == NULL)
    return trip_end (&trip, NULL);
  return trip_end (&trip, return_trip (&trip, step, grad_expert_in, error));
}
