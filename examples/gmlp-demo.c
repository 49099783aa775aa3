/* gmlp-demo: train a Mixture-of-Experts expert block with libgmlp
 *
 * A student GroupedMLP learns to imitate a fixed random teacher GroupedMLP
 * of the same shape: the task has a known answer (the teacher), so the loss
 * must fall. Every step routes a batch of tokens to the experts with uneven
 * group sizes, runs the teacher forward for the targets, the student forward
 * and backward, and a plain SGD step on the student's parameters; it prints
 * the loss, tokens/s and TFLOP/s. Runs on the default device (a GPU when
 * there is one, else the CPU; GMLP_DEVICE chooses). With --fp8=RECIPE the
 * student trains in FP8 (both layers' products, the activation writing
 * FC2's input quantized), its delayed scales updated after every step; the
 * teacher stays in the working dtype.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <gmlp.h>

static gint experts = 8;
static gint64 hidden = 256;
static gint64 ffn = 512;
static gint64 tokens = 4096;
static gint steps = 40;
static double lr = 0.5;
static gint64 seed = 1;
static char *dtype_name = NULL;
static char *activation_name = NULL;
static char *fp8_recipe = NULL;
static gboolean offload = FALSE;
static gboolean recompute = FALSE;

static const GOptionEntry entries[] = {
  { "experts", 'e', 0, G_OPTION_ARG_INT, &experts, "Number of experts (default 8)", "E" },
  { "hidden", 'k', 0, G_OPTION_ARG_INT64, &hidden, "Model width (default 256)", "H" },
  { "ffn", 'f', 0, G_OPTION_ARG_INT64, &ffn, "Expert FFN width (default 512)", "F" },
  { "tokens", 't', 0, G_OPTION_ARG_INT64, &tokens, "Routed tokens per step (default 4096)", "T" },
  { "steps", 's', 0, G_OPTION_ARG_INT, &steps, "Training steps (default 40)", "N" },
  { "lr", 0, 0, G_OPTION_ARG_DOUBLE, &lr, "SGD learning rate (default 0.5)", "LR" },
  { "seed", 0, 0, G_OPTION_ARG_INT64, &seed, "Random seed (default 1)", "S" },
  { "dtype", 'd', 0, G_OPTION_ARG_STRING, &dtype_name, "float32, float16 or bfloat16 (default: bfloat16 on a GPU, float32 on the CPU)", "T" },
  { "activation", 'a', 0, G_OPTION_ARG_STRING, &activation_name, "gelu, relu, srelu, swiglu or geglu (default swiglu)", "A" },
  { "fp8", 0, 0, G_OPTION_ARG_STRING, &fp8_recipe, "Train in FP8: delayed, current, blockwise or mxfp8 (HYBRID format)", "R" },
  { "offload", 'o', 0, G_OPTION_ARG_NONE, &offload, "Offload saved activations to host memory", NULL },
  { "recompute", 'r', 0, G_OPTION_ARG_NONE, &recompute, "Recompute the activation in backward", NULL },
  { NULL }
};

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

/* Uneven routing: token t goes to expert e with probability ∝ e + 1, drawn
 * afresh every step. */
static void
route (GRand *rand, gint64 *rows)
{
  double total = experts * (experts + 1) / 2.0;
  gint64 t;
  int e;

  memset (rows, 0, sizeof (gint64) * experts);
  for (t = 0; t < tokens; t++)
    {
      double u = g_rand_double (rand) * total;
      for (e = 0; e < experts - 1 && u >= e + 1; e++)
        u -= e + 1;
      rows[e]++;
    }
}

static gboolean
sgd_step (GmlpGroupedLinear *layer, GError **error)
{
  return gmlp_grouped_tensor_add_scaled (gmlp_grouped_linear_get_weight (layer), -lr,
                                         gmlp_grouped_linear_get_wgrad (layer), error) &&
         gmlp_grouped_tensor_add_scaled (gmlp_grouped_linear_get_bias (layer), -lr,
                                         gmlp_grouped_linear_get_bgrad (layer), error);
}

int
main (int argc, char *argv[])
{
  g_autoptr(GOptionContext) context = g_option_context_new ("- train a MoE expert block on a teacher");
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpGroupedMLP) teacher = NULL, student = NULL;
  g_autoptr(GmlpOffloadContext) offload_ctx = NULL;
  g_autofree gint64 *rows = NULL;
  GmlpDevice *device;
  GmlpDType dtype;
  int activation = GMLP_ACTIVATION_SWIGLU;
  int recipe = GMLP_SCALING_RECIPE_NONE;
  GmlpLinearFlags flags = GMLP_LINEAR_BIAS | GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
  double first_loss = NAN, last_loss = NAN, flops_per_step, total_s = 0.0;
  gint64 fc1_out;
  GRand *rand;
  int step;

  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, &argc, &argv, &error))
    goto fail;
  if (experts < 1 || hidden < 1 || ffn < 1 || tokens < 1 || steps < 1 || !(lr > 0))
    {
      g_printerr ("gmlp-demo: experts, sizes, steps and lr must be positive\n");
      return EXIT_FAILURE;
    }
  if (fp8_recipe != NULL &&
      (!parse_enum (GMLP_TYPE_SCALING_RECIPE, fp8_recipe, &recipe) || recipe == GMLP_SCALING_RECIPE_NONE))
    {
      g_printerr ("gmlp-demo: unknown FP8 recipe %s (delayed, current, blockwise or mxfp8)\n", fp8_recipe);
      return EXIT_FAILURE;
    }

  device = gmlp_device_get_default ();
  dtype = gmlp_device_get_kind (device) == GMLP_DEVICE_KIND_CUDA ? GMLP_DTYPE_BFLOAT16 : GMLP_DTYPE_FLOAT32;
  if (dtype_name != NULL && !parse_enum (GMLP_TYPE_DTYPE, dtype_name, (int *) &dtype))
    {
      g_printerr ("gmlp-demo: unknown dtype %s\n", dtype_name);
      return EXIT_FAILURE;
    }
  if (activation_name != NULL && !parse_enum (GMLP_TYPE_ACTIVATION, activation_name, &activation))
    {
      g_printerr ("gmlp-demo: unknown activation %s\n", activation_name);
      return EXIT_FAILURE;
    }
  if (recompute)
    flags |= GMLP_LINEAR_RECOMPUTE_ACTIVATION;

  teacher = gmlp_grouped_mlp_new_full (device, experts, hidden, ffn, activation, dtype, flags, &error);
  student = teacher ? gmlp_grouped_mlp_new_full (device, experts, hidden, ffn, activation, dtype, flags, &error) : NULL;
  if (student == NULL ||
      !gmlp_grouped_mlp_init_parameters (teacher, (guint64) seed, &error) ||
      !gmlp_grouped_mlp_init_parameters (student, (guint64) seed + 1000, &error))
    goto fail;
  /* FP8: six quantizers for the student's two layers (per-tensor recipes
   * need sizes that are multiples of 16; the error says so). */
  if (recipe != GMLP_SCALING_RECIPE_NONE &&
      !gmlp_grouped_mlp_set_fp8_recipe (student, recipe, GMLP_FP8_FORMAT_HYBRID, &error))
    goto fail;
  if (offload && (offload_ctx = gmlp_offload_context_new (device, &error)) == NULL)
    goto fail;

  fc1_out = gmlp_grouped_linear_get_out_features (gmlp_grouped_mlp_get_fc1 (student));
  /* Teacher forward, student forward and backward (dgrad and wgrad). */
  flops_per_step = 2.0 * tokens * (hidden * fc1_out + ffn * hidden) * 4;
  g_print ("gmlp-demo: libgmlp %s on %s, %s, %d experts, %" G_GINT64_FORMAT " -> %" G_GINT64_FORMAT
           " -> %" G_GINT64_FORMAT ", %s, %" G_GINT64_FORMAT " tokens/step%s%s%s%s\n",
           GMLP_VERSION_S, gmlp_device_get_name (device), gmlp_dtype_get_name (dtype), experts,
           hidden, fc1_out, hidden, activation_name ? activation_name : "swiglu", tokens,
           recipe != GMLP_SCALING_RECIPE_NONE ? ", fp8 " : "",
           recipe != GMLP_SCALING_RECIPE_NONE ? fp8_recipe : "",
           offload ? ", offload" : "", recompute ? ", recompute" : "");

  rand = g_rand_new_with_seed ((guint32) seed);
  rows = g_new (gint64, experts);
  for (step = 1; step <= steps; step++)
    {
      g_autoptr(GmlpGroupedTensor) x = NULL, target = NULL, y = NULL, dx = NULL;
      g_autoptr(GmlpSavedActivations) saved = NULL;
      gint64 start = g_get_monotonic_time ();
      double sum_sq, loss, seconds;

      route (rand, rows);
      x = gmlp_grouped_tensor_new (device, dtype, rows, experts, hidden, &error);
      if (x == NULL || !gmlp_grouped_tensor_fill_random (x, (guint64) seed * 100003 + step, 1.0, &error))
        goto fail;
      target = gmlp_grouped_mlp_forward (teacher, x, NULL, &error);
      if (target == NULL)
        goto fail;

      if (offload_ctx != NULL)
        gmlp_offload_context_push_thread_default (offload_ctx, TRUE);
      y = gmlp_grouped_mlp_forward (student, x, &saved, &error);
      if (offload_ctx != NULL)
        gmlp_offload_context_pop_thread_default (offload_ctx, NULL);
      if (y == NULL)
        goto fail;

      /* loss = Σ (y - t)² / 2T, so dy = (y - t) / T, computed in place in y. */
      if (!gmlp_grouped_tensor_add_scaled (y, -1.0, target, &error) ||
          (sum_sq = gmlp_grouped_tensor_sum_squares (y, &error)) < 0 ||
          !gmlp_grouped_tensor_scale (y, 1.0 / tokens, &error))
        goto fail;
      loss = sum_sq / (2.0 * tokens);

      dx = gmlp_grouped_mlp_backward (student, saved, y, &error);
      if (dx == NULL ||
          !sgd_step (gmlp_grouped_mlp_get_fc1 (student), &error) ||
          !sgd_step (gmlp_grouped_mlp_get_fc2 (student), &error) ||
          /* Delayed scaling: this step's amaxes make the next step's
           * scales (nothing to do for the other recipes). */
          !gmlp_grouped_mlp_update_quantizers (student, &error) ||
          !gmlp_device_synchronize (device, &error))
        goto fail;

      seconds = (g_get_monotonic_time () - start) / 1e6;
      if (step > 1)
        total_s += seconds;   /* the first step warms up */
      if (step == 1)
        first_loss = loss;
      last_loss = loss;
      g_print ("step %4d  loss %.6f  %10.0f tokens/s  %8.3f TFLOP/s\n", step, loss,
               tokens / seconds, flops_per_step / seconds / 1e12);
      if (!isfinite (loss))
        {
          g_printerr ("gmlp-demo: the loss diverged; try a smaller --lr\n");
          g_rand_free (rand);
          return EXIT_FAILURE;
        }
    }
  g_rand_free (rand);

  g_print ("summary: loss %.6f -> %.6f (%.1f%% of the first), %.0f tokens/s, %.3f TFLOP/s over steps 2-%d\n",
           first_loss, last_loss, 100.0 * last_loss / first_loss,
           steps > 1 ? tokens * (steps - 1) / total_s : 0.0,
           steps > 1 ? flops_per_step * (steps - 1) / total_s / 1e12 : 0.0, steps);
  return last_loss < first_loss ? EXIT_SUCCESS : EXIT_FAILURE;

fail:
  g_printerr ("gmlp-demo: %s\n", error != NULL ? error->message : "failed");
  return EXIT_FAILURE;
}
