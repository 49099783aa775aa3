/* gmlp-demo: train a whole Mixture-of-Experts layer with libgmlp
 *
 * A student GmlpMoELayer learns to imitate a fixed teacher MoE layer of the
 * same shape, router included. The teacher's gate is drawn so that its
 * routing is confident and uneven (the gate row of expert e is scaled by
 * 0.5 + e / (E - 1), so the later experts win more tokens): the routing the
 * student must find is known. The student starts from the teacher's experts
 * plus noise (half their spread: this fixes which student expert stands for
 * which teacher expert, so that the routing can be compared expert by
 * expert) and from a gate of its own, and learns by plain SGD on every
 * parameter: the router's gate, the experts' weights and biases, and the
 * shared expert's with --shared-ffn. The routing is Mixtral's (the softmax
 * over every expert, the top-k renormalized to sum to 1), or with --top-k 1
 * Switch's (the top-1 probability as it is).
 *
 * Every step draws fresh tokens, runs the teacher forward for the targets
 * and the student forward and backward, and prints the loss, the student's
 * load-balancing (aux) loss, the routing agreement (the fraction of the
 * teacher's k choices the student also makes; chance is k / E), tokens/s,
 * TFLOP/s and the fewest and most tokens one of the student's experts got.
 * TFLOP/s counts the experts' products from the tokens per expert: a
 * forward of a GroupedMLP over R routed rows is 2·R·hidden·(fc1_out + ffn)
 * flops, fc1_out = 2·ffn for the gated activations (SwiGLU, GeGLU), so
 * 2·R·hidden·ffn·3 (else ·2); a step is the teacher's forward plus the
 * student's forward and backward (dgrad and wgrad, twice a forward):
 * flops = F(R_teacher) + 3·F(R_student), plus the same for the shared
 * expert over every token. The router's small gate product is not counted.
 *
 * --fp8=RECIPE (delayed, current, blockwise or mxfp8) trains the student's
 * experts in FP8 (gmlp_moe_layer_set_fp8_recipe(): E4M3 forward, E5M2
 * gradients; the router's gate stays FP32) and updates its quantizers after
 * every step; the teacher stays in --dtype. With it the experts' rows are
 * padded to a multiple of 16 unless --padding says otherwise: every recipe
 * takes any padding, and 16 lets the GPU's FP8 weight gradients read every
 * expert's rows in place.
 *
 * --json FILE writes a header line and one JSON line per step; --plot FILE
 * writes a PNG of the loss, the agreement and the load of every expert over
 * the steps by running gmlp-demo-plot (a small Python script with
 * matplotlib, found next to this program or on PATH) on those lines.
 * --check makes the exit status say whether the student learned: the loss
 * of the last quarter of the steps at most 70% of the first quarter's, and
 * the agreement at least 0.1 higher.
 *
 * The device: --device, else GMLP_DEVICE, else a GPU when there is one,
 * else the CPU.
 *
 * --ep trains expert-parallel, one rank per process started by gmlp-launch
 * (gmlp-launch -n W gmlp-demo --ep), each rank on the device the launcher
 * gives it. Both layers are expert-parallel over the one communicator
 * (the teacher in exact mode, the student in --ep-mode): rank r holds
 * experts [r·E/W, (r+1)·E/W) of each, and the teacher is the same on every
 * rank (the same seeds). Each rank draws its own tokens (seed + rank: rank
 * 0's are the one-device run's). The loss minimized is the mean of the
 * ranks' losses: the replicated parameters' gradients (the router's gate,
 * the shared expert) are averaged over the ranks before the SGD step, and
 * as a local expert's gradients sum over every rank's tokens, the experts
 * step with lr / W. The numbers printed are the group's: the loss, aux loss
 * and agreement averaged over the ranks, the load counted over every rank's
 * tokens, tokens/s and TFLOP/s over all of them. Rank 0 prints and writes
 * --json and --plot; the other ranks print only errors. In graph-safe mode
 * the summary adds the rows that the slots dropped (--ep-capacity).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib/gstdio.h>
#include <gmlp.h>

#include "bench-json.h"

/* The student's experts start at the teacher's plus this much of a fresh
 * draw of the same spread. */
#define EXPERT_NOISE 0.5
/* The teacher's logits have a spread of about this much. */
#define TEACHER_GATE_SCALE 2.0

static char *device_name = NULL;
static gint experts = 8;
static gint top_k = 2;
static gint64 hidden = 256;
static gint64 ffn = 512;
static gint64 shared_ffn = 0;
static gint64 tokens = 4096;
static gint steps = 40;
static double lr = 0.5;
static double router_lr = 50.0;
static double aux_loss_coeff = 1e-2;
static gint64 seed = 1;
static char *dtype_name = NULL;
static char *activation_name = NULL;
static char *fp8_recipe = NULL;
static gint padding = G_MININT;   /* not given */
static gboolean offload = FALSE;
static gboolean recompute = FALSE;
static char *json_path = NULL;
static char *plot_path = NULL;
static gboolean check = FALSE;
static gboolean ep = FALSE;
static char *ep_mode_name = NULL;
static double ep_capacity = -G_MAXDOUBLE;   /* not given */

static const GOptionEntry entries[] = {
  { "device", 0, 0, G_OPTION_ARG_STRING, &device_name,
    "cpu, cuda or cuda:N (default: GMLP_DEVICE, else a GPU when there is one, else the CPU)", "DEV" },
  { "experts", 'e', 0, G_OPTION_ARG_INT, &experts, "Number of experts (default 8)", "E" },
  { "top-k", 0, 0, G_OPTION_ARG_INT, &top_k, "Experts per token (default 2)", "K" },
  { "hidden", 'k', 0, G_OPTION_ARG_INT64, &hidden, "Model width (default 256)", "H" },
  { "ffn", 'f', 0, G_OPTION_ARG_INT64, &ffn, "Expert FFN width (default 512)", "F" },
  { "shared-ffn", 0, 0, G_OPTION_ARG_INT64, &shared_ffn, "Width of a shared expert (default 0: none)", "F" },
  { "tokens", 't', 0, G_OPTION_ARG_INT64, &tokens, "Tokens per step (default 4096)", "T" },
  { "steps", 's', 0, G_OPTION_ARG_INT, &steps, "Training steps (default 40)", "N" },
  { "lr", 0, 0, G_OPTION_ARG_DOUBLE, &lr, "SGD learning rate of the experts' weights and biases (default 0.5)", "LR" },
  { "router-lr", 0, 0, G_OPTION_ARG_DOUBLE, &router_lr,
    "SGD learning rate of the router's gate (default 50; 0 freezes it)", "LR" },
  { "aux-loss-coeff", 0, 0, G_OPTION_ARG_DOUBLE, &aux_loss_coeff,
    "The student's load-balancing loss coefficient (default 0.01)", "C" },
  { "seed", 0, 0, G_OPTION_ARG_INT64, &seed, "Random seed (default 1)", "S" },
  { "dtype", 'd', 0, G_OPTION_ARG_STRING, &dtype_name, "float32, float16 or bfloat16 (default: bfloat16 on a GPU, float32 on the CPU)", "T" },
  { "activation", 'a', 0, G_OPTION_ARG_STRING, &activation_name, "gelu, relu, srelu, swiglu or geglu (default swiglu)", "A" },
  { "fp8", 0, 0, G_OPTION_ARG_STRING, &fp8_recipe,
    "Train the student's experts in FP8: delayed, current, blockwise or mxfp8 (default: none)", "R" },
  { "padding", 0, 0, G_OPTION_ARG_INT, &padding,
    "Pad every expert's rows to a multiple of N: 0, or a power of two up to 128 (default: 16 with --fp8, else 0)",
    "N" },
  { "offload", 'o', 0, G_OPTION_ARG_NONE, &offload, "Offload saved activations to host memory", NULL },
  { "recompute", 'r', 0, G_OPTION_ARG_NONE, &recompute, "Recompute the activation in backward", NULL },
  { "json", 0, 0, G_OPTION_ARG_FILENAME, &json_path, "Write the numbers of every step to FILE as JSON lines", "FILE" },
  { "plot", 0, 0, G_OPTION_ARG_FILENAME, &plot_path,
    "Write a PNG of the loss and of the load per expert over the steps (needs python3-matplotlib)", "FILE" },
  { "check", 0, 0, G_OPTION_ARG_NONE, &check,
    "Fail unless the loss fell and the routing agreement rose", NULL },
  { "ep", 0, 0, G_OPTION_ARG_NONE, &ep,
    "Train expert-parallel, one rank per process: run as gmlp-launch -n N gmlp-demo --ep", NULL },
  { "ep-mode", 0, 0, G_OPTION_ARG_STRING, &ep_mode_name,
    "--ep: how the student's rows travel, exact or graph-safe (default exact)", "MODE" },
  { "ep-capacity", 0, 0, G_OPTION_ARG_DOUBLE, &ep_capacity,
    "--ep-mode graph-safe: the slots' expert capacity factor (default 2; 0: never drop)", "F" },
  { NULL }
};

/* What one step measured. */
typedef struct {
  double loss, aux_loss, agreement, seconds, flops;
  gint64 fewest, most;
} Step;

static gboolean
parse_enum (GType type, const char *nick, int *value)
{
  g_autoptr(GEnumClass) klass = g_type_class_ref (type);
  GEnumValue *v = g_enum_get_value_by_nick (klass, nick);

  if (v == NULL)
    return FALSE;
  *value = v->value;
  return TRUE;
}

/* With a communicator, one rank of an expert-parallel layer (making it is
 * collective); else NULL, EXACT and 0 are the one-device layer's. */
static GmlpMoELayer *
make_layer (GmlpDevice *device, GmlpDType dtype, int activation, GmlpLinearFlags flags,
            double aux_coeff, GmlpScalingRecipe recipe, GmlpCommunicator *comm,
            GmlpExpertParallelMode mode, double capacity, GError **error)
{
  return g_initable_new (GMLP_TYPE_MOE_LAYER, NULL, error,
                         "device", device, "hidden", hidden, "ffn-hidden", ffn,
                         "communicator", comm, "expert-parallel-mode", mode,
                         "expert-capacity-factor", capacity,
                         "n-experts", (guint) experts, "top-k", (guint) top_k,
                         "activation", activation, "dtype", dtype, "flags", flags,
                         "shared-expert-ffn-hidden", shared_ffn,
                         "aux-loss-coeff", aux_coeff,
                         "padding", (guint) padding,
                         "fp8-recipe", recipe,
                         /* Top-1 renormalized would weigh every token's
                          * expert by 1, and the task's loss would teach the
                          * gate nothing: top-1 keeps its probability, as
                          * Switch Transformer's routing does. */
                         "renormalize", top_k > 1, NULL);
}

/* A standard normal draw (Box-Muller). */
static double
gaussian (GRand *rand)
{
  double u = 1.0 - g_rand_double (rand), v = g_rand_double (rand);

  return sqrt (-2.0 * log (u)) * cos (2.0 * G_PI * v);
}

/* The teacher's gate: Gaussian rows of a spread that makes confident
 * logits, row e scaled by 0.5 + e / (E - 1) so that the load is uneven. */
static gboolean
set_teacher_gate (GmlpRouter *router, GRand *rand, GError **error)
{
  gsize n = (gsize) experts * hidden, i;
  float *w = g_new (float, n);
  g_autoptr(GBytes) bytes = NULL;

  for (i = 0; i < n; i++)
    {
      gint64 e = (gint64) (i / hidden);
      double row_scale = experts > 1 ? 0.5 + (double) e / (experts - 1) : 1.0;

      w[i] = (float) (gaussian (rand) * TEACHER_GATE_SCALE / sqrt ((double) hidden) * row_scale);
    }
  bytes = g_bytes_new_take (w, n * sizeof (float));
  return gmlp_router_set_weight_from_bytes (router, bytes, error);
}

/* student = teacher + EXPERT_NOISE · student: the student's own draw, of
 * the same spread as the teacher's, becomes the noise. */
static gboolean
perturb_copy (GmlpGroupedTensor *student, GmlpGroupedTensor *teacher, GError **error)
{
  return gmlp_grouped_tensor_scale (student, EXPERT_NOISE, error) &&
         gmlp_grouped_tensor_add_scaled (student, 1.0, teacher, error);
}

static gboolean
perturb_copy_mlp (GmlpGroupedMLP *student, GmlpGroupedMLP *teacher, GError **error)
{
  GmlpGroupedLinear *s[2] = { gmlp_grouped_mlp_get_fc1 (student), gmlp_grouped_mlp_get_fc2 (student) };
  GmlpGroupedLinear *t[2] = { gmlp_grouped_mlp_get_fc1 (teacher), gmlp_grouped_mlp_get_fc2 (teacher) };
  int i;

  for (i = 0; i < 2; i++)
    if (!perturb_copy (gmlp_grouped_linear_get_weight (s[i]), gmlp_grouped_linear_get_weight (t[i]), error) ||
        !perturb_copy (gmlp_grouped_linear_get_bias (s[i]), gmlp_grouped_linear_get_bias (t[i]), error))
      return FALSE;
  return TRUE;
}

static gboolean
sgd_linear (GmlpGroupedLinear *layer, double rate, GError **error)
{
  return gmlp_grouped_tensor_add_scaled (gmlp_grouped_linear_get_weight (layer), -rate,
                                         gmlp_grouped_linear_get_wgrad (layer), error) &&
         gmlp_grouped_tensor_add_scaled (gmlp_grouped_linear_get_bias (layer), -rate,
                                         gmlp_grouped_linear_get_bgrad (layer), error);
}

/* SGD on every parameter of the layer. The routed experts' gradients of
 * an expert-parallel layer sum over the ranks' tokens: they step with
 * lr / W, the mean's (see the top). */
static gboolean
sgd_step (GmlpMoELayer *layer, GError **error)
{
  GmlpCommunicator *comm = gmlp_moe_layer_get_communicator (layer);
  GmlpGroupedMLP *mlp[2] = { gmlp_moe_layer_get_experts (layer), gmlp_moe_layer_get_shared_expert (layer) };
  GmlpRouter *router = gmlp_moe_layer_get_router (layer);
  double rate[2] = { comm != NULL ? lr / gmlp_communicator_get_world_size (comm) : lr, lr };
  int i;

  for (i = 0; i < 2; i++)
    if (mlp[i] != NULL &&
        (!sgd_linear (gmlp_grouped_mlp_get_fc1 (mlp[i]), rate[i], error) ||
         !sgd_linear (gmlp_grouped_mlp_get_fc2 (mlp[i]), rate[i], error)))
      return FALSE;
  return router_lr == 0.0 ||
         gmlp_grouped_tensor_add_scaled (gmlp_router_get_weight (router), -router_lr,
                                         gmlp_router_get_wgrad (router), error);
}

/* --ep: the replicated parameters' gradients (the router's gate, the
 * shared expert's), each rank's over its own tokens, become their average
 * over the ranks: data-parallel, as torch's DDP does. In the device's
 * stream order, after the backward that wrote them. */
static gboolean
average_replicated_grads (GmlpMoELayer *layer, GError **error)
{
  GmlpCommunicator *comm = gmlp_moe_layer_get_communicator (layer);
  GmlpGroupedMLP *shared = gmlp_moe_layer_get_shared_expert (layer);
  GmlpGroupedLinear *fc[2];
  int i;

  if (router_lr != 0.0 &&
      !gmlp_communicator_all_reduce (comm, gmlp_router_get_wgrad (gmlp_moe_layer_get_router (layer)),
                                     GMLP_REDUCE_OP_AVERAGE, error))
    return FALSE;
  if (shared == NULL)
    return TRUE;
  fc[0] = gmlp_grouped_mlp_get_fc1 (shared);
  fc[1] = gmlp_grouped_mlp_get_fc2 (shared);
  for (i = 0; i < 2; i++)
    if (!gmlp_communicator_all_reduce (comm, gmlp_grouped_linear_get_wgrad (fc[i]), GMLP_REDUCE_OP_AVERAGE,
                                       error) ||
        !gmlp_communicator_all_reduce (comm, gmlp_grouped_linear_get_bgrad (fc[i]), GMLP_REDUCE_OP_AVERAGE,
                                       error))
      return FALSE;
  return TRUE;
}

/* A device tensor's values on the host (waits for the device). */
static gpointer
read_values (GmlpGroupedTensor *tensor, gsize size, GError **error)
{
  g_autoptr(GBytes) bytes = gmlp_grouped_tensor_to_bytes (tensor, error);

  if (bytes == NULL)
    return NULL;
  g_assert (g_bytes_get_size (bytes) == size);
  return g_memdup2 (g_bytes_get_data (bytes, NULL), size);
}

/* The fraction of the teacher's choices that the student also made. */
static double
agreement (const gint64 *teacher, const gint64 *student)
{
  gint64 same = 0, t;
  int i, j;

  for (t = 0; t < tokens; t++)
    for (i = 0; i < top_k; i++)
      for (j = 0; j < top_k; j++)
        same += student[t * top_k + i] == teacher[t * top_k + j];
  return (double) same / ((double) tokens * top_k);
}

/* One forward's flops of a GroupedMLP over rows rows (see the top). */
static double
mlp_flops (GmlpGroupedMLP *mlp, gint64 rows)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp);

  return 2.0 * rows * hidden * (gmlp_grouped_linear_get_out_features (fc1) +
                                gmlp_grouped_linear_get_in_features (fc2));
}

/* --ep: the step's numbers become the group's, on every rank: the loss,
 * aux loss and agreement averaged over the ranks; the loads (every rank's
 * tokens per expert, over all the experts) and the rows dropped summed. */
static gboolean
reduce_step (GmlpCommunicator *comm, Step *s, gint64 *student_load, gint64 *teacher_load, gint64 *dropped,
             GError **error)
{
  GmlpDevice *device = gmlp_communicator_get_device (comm);
  float means[3] = { (float) s->loss, (float) s->aux_loss, (float) s->agreement };
  gint64 one = 1, n_counts = 2 * experts + 1;
  g_autofree gint64 *counts = g_new (gint64, n_counts);
  g_autofree float *mean_values = NULL;
  g_autofree gint64 *count_values = NULL;
  g_autoptr(GmlpGroupedTensor) mean_t = NULL, count_t = NULL;

  memcpy (counts, student_load, sizeof (gint64) * experts);
  memcpy (counts + experts, teacher_load, sizeof (gint64) * experts);
  counts[2 * experts] = *dropped;
  if ((mean_t = gmlp_grouped_tensor_new_from_floats (device, GMLP_DTYPE_FLOAT32, &one, 1, G_N_ELEMENTS (means),
                                                     means, G_N_ELEMENTS (means), error)) == NULL ||
      (count_t = gmlp_grouped_tensor_new_from_ints (device, GMLP_DTYPE_INT64, &one, 1, n_counts, counts,
                                                    (gsize) n_counts, error)) == NULL ||
      !gmlp_communicator_all_reduce (comm, mean_t, GMLP_REDUCE_OP_AVERAGE, error) ||
      !gmlp_communicator_all_reduce (comm, count_t, GMLP_REDUCE_OP_SUM, error) ||
      (mean_values = read_values (mean_t, sizeof means, error)) == NULL ||
      (count_values = read_values (count_t, sizeof (gint64) * n_counts, error)) == NULL)
    return FALSE;
  s->loss = mean_values[0];
  s->aux_loss = mean_values[1];
  s->agreement = mean_values[2];
  memcpy (student_load, count_values, sizeof (gint64) * experts);
  memcpy (teacher_load, count_values + experts, sizeof (gint64) * experts);
  *dropped = count_values[2 * experts];
  return TRUE;
}

/* --ep: the ranks other than 0 print nothing but errors. */
static void
print_nothing (const char *string)
{
}

/* An array of the experts' counts in a JSON line. */
static void
json_counts (JsonBuilder *line, const char *key, const gint64 *counts)
{
  int e;

  json_builder_set_member_name (line, key);
  json_builder_begin_array (line);
  for (e = 0; e < experts; e++)
    json_builder_add_int_value (line, counts[e]);
  json_builder_end_array (line);
}

/* The plot script next to this program (the build tree, or the installed
 * bindir), else on PATH. */
static char *
find_plot_script (void)
{
  g_autofree char *self = g_file_read_link ("/proc/self/exe", NULL);

  if (self != NULL)
    {
      g_autofree char *dir = g_path_get_dirname (self);
      g_autofree char *path = g_build_filename (dir, "gmlp-demo-plot", NULL);

      if (g_file_test (path, G_FILE_TEST_IS_EXECUTABLE))
        return g_steal_pointer (&path);
    }
  return g_find_program_in_path ("gmlp-demo-plot");
}

static gboolean
run_plot_script (const char *script, const char *arg1, const char *arg2, GError **error)
{
  const char *argv[] = { script, arg1, arg2, NULL };
  int status;

  return g_spawn_sync (NULL, (char **) argv, NULL, G_SPAWN_DEFAULT, NULL, NULL, NULL, NULL, &status, error) &&
         g_spawn_check_wait_status (status, error);
}

/* Whether the file starts as a PNG does. */
static gboolean
is_png (const char *path)
{
  static const guchar signature[8] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n' };
  g_autofree char *contents = NULL;
  gsize length;

  return g_file_get_contents (path, &contents, &length, NULL) && length > sizeof signature &&
         memcmp (contents, signature, sizeof signature) == 0;
}

static double
mean_of (const Step *s, int from, int to, gsize offset)
{
  double sum = 0.0;
  int i;

  for (i = from; i < to; i++)
    sum += G_STRUCT_MEMBER (double, &s[i], offset);
  return sum / (to - from);
}

static double
mean_count_of (const Step *s, int from, int to, gboolean most)
{
  double sum = 0.0;
  int i;

  for (i = from; i < to; i++)
    sum += most ? s[i].most : s[i].fewest;
  return sum / (to - from);
}

/* The table at the end: the means of the first and the last quarter of
 * the steps (what --check compares), and the throughput. */
static void
print_summary (const Step *s, int n, const char *where, gint64 step_tokens)
{
  int q = MAX (n / 4, 1), last = n - q, i;
  double seconds = 0.0, flops = 0.0;

  g_print ("\nsummary: %d steps on %s, means over the first and the last %d step%s\n", n,
           where, q, q > 1 ? "s" : "");
  g_print ("  %-26s %12s %12s\n", "", "first", "last");
  g_print ("  %-26s %12.6f %12.6f  (%.1f%% of the first)\n", "loss",
           mean_of (s, 0, q, G_STRUCT_OFFSET (Step, loss)), mean_of (s, last, n, G_STRUCT_OFFSET (Step, loss)),
           100.0 * mean_of (s, last, n, G_STRUCT_OFFSET (Step, loss)) / mean_of (s, 0, q, G_STRUCT_OFFSET (Step, loss)));
  g_print ("  %-26s %12.6f %12.6f\n", "aux loss",
           mean_of (s, 0, q, G_STRUCT_OFFSET (Step, aux_loss)), mean_of (s, last, n, G_STRUCT_OFFSET (Step, aux_loss)));
  g_print ("  %-26s %12.3f %12.3f  (chance %.3f)\n", "routing agreement",
           mean_of (s, 0, q, G_STRUCT_OFFSET (Step, agreement)),
           mean_of (s, last, n, G_STRUCT_OFFSET (Step, agreement)), (double) top_k / experts);
  g_print ("  %-26s %12.1f %12.1f  (even: %.1f)\n", "fewest tokens per expert",
           mean_count_of (s, 0, q, FALSE), mean_count_of (s, last, n, FALSE),
           (double) step_tokens * top_k / experts);
  g_print ("  %-26s %12.1f %12.1f\n", "most tokens per expert",
           mean_count_of (s, 0, q, TRUE), mean_count_of (s, last, n, TRUE));
  /* The first step warms up. */
  for (i = 1; i < n; i++)
    {
      seconds += s[i].seconds;
      flops += s[i].flops;
    }
  if (n > 1)
    g_print ("  throughput over steps 2-%d: %.0f tokens/s, %.3f TFLOP/s\n", n,
             step_tokens * (n - 1) / seconds, flops / seconds / 1e12);
}

/* --check: whether the student learned (see the top). */
static gboolean
check_learned (const Step *s, int n)
{
  int q = MAX (n / 4, 1), last = n - q;
  double loss0 = mean_of (s, 0, q, G_STRUCT_OFFSET (Step, loss));
  double loss1 = mean_of (s, last, n, G_STRUCT_OFFSET (Step, loss));
  double agree0 = mean_of (s, 0, q, G_STRUCT_OFFSET (Step, agreement));
  double agree1 = mean_of (s, last, n, G_STRUCT_OFFSET (Step, agreement));
  gboolean loss_ok = loss1 <= 0.7 * loss0, agree_ok = agree1 >= agree0 + 0.1;

  g_print ("check: the loss fell to %.1f%% of its start (at most 70%%): %s\n", 100.0 * loss1 / loss0,
           loss_ok ? "ok" : "FAILED");
  g_print ("check: the routing agreement rose by %+.3f (at least +0.100): %s\n", agree1 - agree0,
           agree_ok ? "ok" : "FAILED");
  return loss_ok && agree_ok;
}

int
main (int argc, char *argv[])
{
  g_autoptr(GOptionContext) context = g_option_context_new ("- train a Mixture-of-Experts layer on a teacher");
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpMoELayer) teacher = NULL, student = NULL;
  g_autoptr(GmlpOffloadContext) offload_ctx = NULL;
  g_autoptr(GmlpDevice) device = NULL;
  g_autoptr(GmlpCommunicator) comm = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autofree Step *record = NULL;
  g_autofree char *plot_script = NULL, *json_tmp = NULL, *where = NULL, *ep_desc = NULL;
  g_autoptr(GRand) rand = NULL;
  FILE *json = NULL;
  gboolean dtype_given;
  GmlpDType dtype = GMLP_DTYPE_FLOAT32;
  int activation = GMLP_ACTIVATION_SWIGLU;
  GmlpLinearFlags flags = GMLP_LINEAR_BIAS | GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
  int recipe = GMLP_SCALING_RECIPE_NONE;
  int ep_mode = GMLP_EXPERT_PARALLEL_MODE_EXACT;
  int rank = 0, world = 1;
  gint64 step_tokens, dropped_total = 0;
  int step, status = EXIT_SUCCESS;

  setlocale (LC_ALL, "");
  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, &argc, &argv, &error))
    goto fail;
  if (experts < 1 || top_k < 1 || hidden < 1 || ffn < 1 || shared_ffn < 0 || tokens < 1 || steps < 1 ||
      !(lr > 0) || !(router_lr >= 0) || !(aux_loss_coeff >= 0))
    {
      g_printerr ("gmlp-demo: experts, top-k, sizes, steps and lr must be positive, shared-ffn, "
                  "router-lr and aux-loss-coeff not negative\n");
      return EXIT_FAILURE;
    }
  if (check && steps < 4)
    {
      g_printerr ("gmlp-demo: --check compares the first and the last quarter of the steps: "
                  "it needs 4 steps at least\n");
      return EXIT_FAILURE;
    }
  if (fp8_recipe != NULL && !parse_enum (GMLP_TYPE_SCALING_RECIPE, fp8_recipe, &recipe))
    {
      g_printerr ("gmlp-demo: unknown FP8 recipe %s (delayed, current, blockwise or mxfp8)\n", fp8_recipe);
      return EXIT_FAILURE;
    }
  /* The layer checks the rest of the padding's rule itself. */
  if (padding == G_MININT)
    padding = recipe != GMLP_SCALING_RECIPE_NONE ? 16 : 0;
  else if (padding < 0)
    {
      g_printerr ("gmlp-demo: --padding must not be negative\n");
      return EXIT_FAILURE;
    }
  if (activation_name != NULL && !parse_enum (GMLP_TYPE_ACTIVATION, activation_name, &activation))
    {
      g_printerr ("gmlp-demo: unknown activation %s\n", activation_name);
      return EXIT_FAILURE;
    }
  dtype_given = dtype_name != NULL;
  if (dtype_given && !parse_enum (GMLP_TYPE_DTYPE, dtype_name, (int *) &dtype))
    {
      g_printerr ("gmlp-demo: unknown dtype %s\n", dtype_name);
      return EXIT_FAILURE;
    }
  if (recompute)
    flags |= GMLP_LINEAR_RECOMPUTE_ACTIVATION;
  if (!ep && (ep_mode_name != NULL || ep_capacity != -G_MAXDOUBLE))
    {
      g_printerr ("gmlp-demo: --ep-mode and --ep-capacity go with --ep\n");
      return EXIT_FAILURE;
    }
  if (ep_mode_name != NULL && !parse_enum (GMLP_TYPE_EXPERT_PARALLEL_MODE, ep_mode_name, &ep_mode))
    {
      g_printerr ("gmlp-demo: --ep-mode takes exact or graph-safe, not %s\n", ep_mode_name);
      return EXIT_FAILURE;
    }
  if (ep_capacity == -G_MAXDOUBLE)
    ep_capacity = 2.0;
  else if (ep_mode != GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE || !(ep_capacity >= 0))
    {
      g_printerr ("gmlp-demo: --ep-capacity sizes the slots of --ep-mode graph-safe: a factor of 0 or more\n");
      return EXIT_FAILURE;
    }
  if (ep && device_name != NULL)
    {
      g_printerr ("gmlp-demo: --ep takes each rank's device from gmlp-launch (its --devices), not --device\n");
      return EXIT_FAILURE;
    }
  /* Join the group first: the other ranks print nothing, and only rank 0
   * writes --json and --plot. */
  if (ep)
    {
      comm = gmlp_communicator_new_from_launcher (&error);
      if (comm == NULL)
        {
          g_printerr ("gmlp-demo: --ep: %s; run it as gmlp-launch -n N gmlp-demo --ep\n", error->message);
          return EXIT_FAILURE;
        }
      rank = gmlp_communicator_get_rank (comm);
      world = gmlp_communicator_get_world_size (comm);
      if (rank != 0)
        {
          g_set_print_handler (print_nothing);
          g_clear_pointer (&json_path, g_free);
          g_clear_pointer (&plot_path, g_free);
        }
    }
  step_tokens = tokens * world;
  /* Before training, so that a missing matplotlib costs no steps. */
  if (plot_path != NULL)
    {
      plot_script = find_plot_script ();
      if (plot_script == NULL)
        {
          g_printerr ("gmlp-demo: --plot: gmlp-demo-plot is neither next to gmlp-demo nor on PATH\n");
          return EXIT_FAILURE;
        }
      if (!run_plot_script (plot_script, "--check", NULL, &error))
        {
          g_printerr ("gmlp-demo: --plot: %s cannot plot: %s\n", plot_script, error->message);
          return EXIT_FAILURE;
        }
    }

  if (comm != NULL)
    device = g_object_ref (gmlp_communicator_get_device (comm));
  else if (device_name != NULL)
    device = gmlp_device_new_from_string (device_name, &error);
  else
    device = g_object_ref (gmlp_device_get_default ());
  if (device == NULL)
    goto fail;
  if (!dtype_given)
    dtype = gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CUDA ? GMLP_DTYPE_BFLOAT16 : GMLP_DTYPE_FLOAT32;
  /* With --ep both are expert-parallel, the teacher in exact mode, which
   * never drops a row: each rank's teacher is the one-device teacher over
   * its tokens. */
  teacher = make_layer (device, dtype, activation, flags, 0.0, GMLP_SCALING_RECIPE_NONE, comm,
                        GMLP_EXPERT_PARALLEL_MODE_EXACT, 0.0, &error);
  if (teacher == NULL)
    goto fail;
  student = make_layer (device, dtype, activation, flags, aux_loss_coeff, recipe, comm, ep_mode,
                        ep_mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE ? ep_capacity : 0.0, &error);
  rand = g_rand_new_with_seed ((guint32) seed);
  if (student == NULL ||
      !gmlp_moe_layer_init_parameters (teacher, (guint64) seed, &error) ||
      !gmlp_moe_layer_init_parameters (student, (guint64) seed + 1000, &error) ||
      !set_teacher_gate (gmlp_moe_layer_get_router (teacher), rand, &error) ||
      !perturb_copy_mlp (gmlp_moe_layer_get_experts (student), gmlp_moe_layer_get_experts (teacher), &error) ||
      (shared_ffn > 0 &&
       !perturb_copy_mlp (gmlp_moe_layer_get_shared_expert (student),
                          gmlp_moe_layer_get_shared_expert (teacher), &error)))
    goto fail;
  if (offload && (offload_ctx = gmlp_offload_context_new (device, &error)) == NULL)
    goto fail;
  x = gmlp_grouped_tensor_new (device, dtype, &tokens, 1, hidden, &error);
  if (x == NULL)
    goto fail;

  if (plot_path != NULL && json_path == NULL)
    {
      int fd = g_file_open_tmp ("gmlp-demo-XXXXXX.jsonl", &json_tmp, &error);

      if (fd < 0)
        goto fail;
      json = fdopen (fd, "w");
    }
  else if (json_path != NULL)
    json = fopen (json_path, "w");
  if ((json_path != NULL || plot_path != NULL) && json == NULL)
    {
      g_printerr ("gmlp-demo: cannot write %s: %s\n", json_path ? json_path : json_tmp, g_strerror (errno));
      status = EXIT_FAILURE;
      goto out;
    }

  if (comm != NULL)
    {
      g_autofree char *graph_safe = g_strdup_printf (" (slots of capacity factor %g)", ep_capacity);

      where = g_strdup_printf ("%d ranks (rank 0 on %s)", world, gmlp_device_get_name (device));
      ep_desc = g_strdup_printf (", expert-parallel %s%s: %u experts a rank, %" G_GINT64_FORMAT " tokens each",
                                 ep_mode_name != NULL ? ep_mode_name : "exact",
                                 ep_mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE ? graph_safe : "",
                                 gmlp_moe_layer_get_n_local_experts (student), tokens);
    }
  else
    where = g_strdup (gmlp_device_get_name (device));
  g_print ("gmlp-demo: libgmlp %s on %s, %s%s%s, MoE layer of %d experts, top-%d, %" G_GINT64_FORMAT " -> %"
           G_GINT64_FORMAT " -> %" G_GINT64_FORMAT ", %s%s, padding %d, %" G_GINT64_FORMAT " tokens/step%s%s%s\n",
           GMLP_VERSION_S, where, gmlp_dtype_get_name (dtype),
           recipe != GMLP_SCALING_RECIPE_NONE ? ", FP8 " : "", recipe != GMLP_SCALING_RECIPE_NONE ? fp8_recipe : "",
           experts, top_k,
           hidden, gmlp_grouped_linear_get_out_features (gmlp_grouped_mlp_get_fc1 (gmlp_moe_layer_get_experts (student))),
           hidden, activation_name ? activation_name : "swiglu", shared_ffn > 0 ? ", shared expert" : "",
           padding, step_tokens, comm != NULL ? ep_desc : "", offload ? ", offload" : "",
           recompute ? ", recompute" : "");
  g_print ("  agree: the share of the teacher's expert choices the student makes too (chance %.3f)\n"
           "  load: the fewest and the most tokens that one of the student's experts got\n"
           "  TFLOP/s: the experts' products, 2 x rows x hidden x (fc1 width + ffn) a forward, rows from\n"
           "    the tokens per expert; a step is the teacher's forward, the student's forward and its\n"
           "    backward (two forwards' worth)\n", (double) top_k / experts);
  if (json != NULL)
    {
      JsonBuilder *line = bench_record_new (NULL, NULL);

      bench_record_string (line, "demo", "gmlp-demo");
      bench_record_string (line, "device", gmlp_device_get_name (device));
      bench_record_string (line, "dtype", gmlp_dtype_get_name (dtype));
      bench_record_int (line, "experts", experts);
      bench_record_int (line, "top_k", top_k);
      bench_record_int (line, "tokens", step_tokens);
      bench_record_int (line, "hidden", hidden);
      bench_record_int (line, "ffn", ffn);
      bench_record_int (line, "shared_ffn", shared_ffn);
      bench_record_int (line, "padding", padding);
      bench_record_string (line, "fp8", recipe != GMLP_SCALING_RECIPE_NONE ? fp8_recipe : "none");
      if (comm != NULL)
        {
          bench_record_int (line, "ep_ranks", world);
          bench_record_string (line, "ep_mode", ep_mode_name != NULL ? ep_mode_name : "exact");
        }
      bench_record_write (line, json);
    }

  record = g_new0 (Step, steps);
  for (step = 1; step <= steps; step++)
    {
      g_autoptr(GmlpGroupedTensor) target = NULL, y = NULL, dx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      g_autoptr(GmlpRouting) teacher_routing = NULL, student_routing = NULL;
      g_autofree gint64 *teacher_idx = NULL, *student_idx = NULL, *teacher_load = NULL, *student_load = NULL;
      g_autofree gint64 *dropped = NULL;
      g_autoptr(GmlpGroupedTensor) dropped_t = NULL;
      g_autofree float *aux = NULL;
      gint64 start = g_get_monotonic_time (), rows_teacher = 0, rows_student = 0, step_dropped = 0;
      Step *s = &record[step - 1];
      double sum_sq;
      int e;

      /* Each rank its own tokens (rank 0's are the one-device run's). */
      if (!gmlp_grouped_tensor_fill_random (x, (guint64) (seed + rank) * 100003 + step, 1.0, &error))
        goto fail;
      target = gmlp_moe_layer_forward (teacher, x, NULL, &error);
      if (target == NULL)
        goto fail;
      teacher_routing = gmlp_moe_layer_get_routing (teacher);

      if (offload_ctx != NULL)
        gmlp_offload_context_push_thread_default (offload_ctx, TRUE);
      y = gmlp_moe_layer_forward (student, x, &saved, &error);
      if (offload_ctx != NULL)
        gmlp_offload_context_pop_thread_default (offload_ctx, NULL);
      if (y == NULL)
        goto fail;
      student_routing = gmlp_moe_layer_get_routing (student);

      /* loss = Σ (y - t)² / 2T, so dy = (y - t) / T, computed in place in
       * y; the router's aux loss adds its own gradient in the backward. */
      if (!gmlp_grouped_tensor_add_scaled (y, -1.0, target, &error) ||
          (sum_sq = gmlp_grouped_tensor_sum_squares (y, &error)) < 0 ||
          !gmlp_grouped_tensor_scale (y, 1.0 / tokens, &error))
        goto fail;
      s->loss = sum_sq / (2.0 * tokens);

      dx = gmlp_moe_layer_backward (student, saved, y, &error);
      /* The end of a training step: delayed scaling takes the amaxes of
       * this one for the next (the other recipes have nothing to do). */
      if (dx == NULL || (comm != NULL && !average_replicated_grads (student, &error)) ||
          !sgd_step (student, &error) || !gmlp_moe_layer_update_quantizers (student, &error) ||
          !gmlp_device_synchronize (device, &error))
        goto fail;
      s->seconds = (g_get_monotonic_time () - start) / 1e6;

      /* The statistics, read after the timed step: the routings of both. */
      if ((teacher_idx = read_values (gmlp_routing_get_indices (teacher_routing),
                                      sizeof (gint64) * tokens * top_k, &error)) == NULL ||
          (student_idx = read_values (gmlp_routing_get_indices (student_routing),
                                      sizeof (gint64) * tokens * top_k, &error)) == NULL ||
          (teacher_load = read_values (gmlp_routing_get_tokens_per_expert (teacher_routing),
                                       sizeof (gint64) * experts, &error)) == NULL ||
          (student_load = read_values (gmlp_routing_get_tokens_per_expert (student_routing),
                                       sizeof (gint64) * experts, &error)) == NULL ||
          (aux = read_values (gmlp_routing_get_aux_loss (student_routing), sizeof (float), &error)) == NULL)
        goto fail;
      s->aux_loss = aux[0];
      s->agreement = agreement (teacher_idx, student_idx);
      if (comm != NULL)
        {
          dropped_t = gmlp_moe_layer_get_dropped_rows (student);
          if (dropped_t != NULL &&
              (dropped = read_values (dropped_t, sizeof (gint64), &error)) == NULL)
            goto fail;
          step_dropped = dropped != NULL ? dropped[0] : 0;
          if (!reduce_step (comm, s, student_load, teacher_load, &step_dropped, &error))
            goto fail;
          dropped_total += step_dropped;
        }
      s->fewest = s->most = student_load[0];
      for (e = 0; e < experts; e++)
        {
          rows_teacher += teacher_load[e];
          rows_student += student_load[e];
          s->fewest = MIN (s->fewest, student_load[e]);
          s->most = MAX (s->most, student_load[e]);
        }
      s->flops = mlp_flops (gmlp_moe_layer_get_experts (student), rows_teacher) +
                 3.0 * mlp_flops (gmlp_moe_layer_get_experts (student), rows_student);
      if (shared_ffn > 0)
        s->flops += 4.0 * mlp_flops (gmlp_moe_layer_get_shared_expert (student), step_tokens);

      g_print ("step %4d  loss %.6f  aux %.6f  agree %.3f  %10.0f tokens/s  %8.3f TFLOP/s"
               "  load %" G_GINT64_FORMAT "-%" G_GINT64_FORMAT "\n", step, s->loss, s->aux_loss,
               s->agreement, step_tokens / s->seconds, s->flops / s->seconds / 1e12, s->fewest, s->most);
      if (json != NULL)
        {
          JsonBuilder *line = bench_record_new (NULL, NULL);

          bench_record_int (line, "step", step);
          bench_record_double (line, "loss", s->loss, "%.6g");
          bench_record_double (line, "aux_loss", s->aux_loss, "%.6g");
          bench_record_double (line, "agreement", s->agreement, "%.6g");
          bench_record_double (line, "seconds", s->seconds, "%.6g");
          bench_record_double (line, "tokens_per_s", step_tokens / s->seconds, "%.6g");
          bench_record_double (line, "tflops", s->flops / s->seconds / 1e12, "%.6g");
          json_counts (line, "load", student_load);
          json_counts (line, "teacher_load", teacher_load);
          if (ep_mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
            bench_record_int (line, "dropped", step_dropped);
          bench_record_write (line, json);
        }
      if (!isfinite (s->loss))
        {
          g_printerr ("gmlp-demo: the loss diverged; try a smaller --lr or --router-lr\n");
          status = EXIT_FAILURE;
          goto out;
        }
    }

  print_summary (record, steps, where, step_tokens);
  if (ep_mode == GMLP_EXPERT_PARALLEL_MODE_GRAPH_SAFE)
    g_print ("  rows dropped past the slots: %" G_GINT64_FORMAT " of %" G_GINT64_FORMAT "\n", dropped_total,
             step_tokens * top_k * steps);
  if (json != NULL && fclose (json) != 0)
    {
      json = NULL;
      g_printerr ("gmlp-demo: cannot write %s: %s\n", json_path ? json_path : json_tmp, g_strerror (errno));
      status = EXIT_FAILURE;
      goto out;
    }
  json = NULL;
  if (plot_path != NULL)
    {
      if (!run_plot_script (plot_script, json_path ? json_path : json_tmp, plot_path, &error) ||
          !is_png (plot_path))
        {
          g_printerr ("gmlp-demo: --plot: %s did not write a PNG to %s%s%s\n", plot_script, plot_path,
                      error ? ": " : "", error ? error->message : "");
          status = EXIT_FAILURE;
          goto out;
        }
      g_print ("plot: %s\n", plot_path);
    }
  if (check && !check_learned (record, steps))
    status = EXIT_FAILURE;

out:
  if (json != NULL)
    fclose (json);
  if (json_tmp != NULL)
    g_unlink (json_tmp);
  return status;

fail:
  if (comm != NULL)
    {
      /* The others get GMLP_ERROR_ABORTED at once, not at the timeout. */
      g_printerr ("gmlp-demo: rank %d: %s\n", rank, error != NULL ? error->message : "failed");
      gmlp_communicator_abort (comm);
    }
  else
    g_printerr ("gmlp-demo: %s\n", error != NULL ? error->message : "failed");
  status = EXIT_FAILURE;
  goto out;
}
