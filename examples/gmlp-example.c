/* gmlp-example: a first look at libgmlp
 *
 * Routes a batch of tokens to experts with uneven group sizes, keeps their
 * activations in a grouped tensor on the default device (a GPU if there is
 * one), converts them to BF16 and FP8 and reports what the conversion cost in
 * accuracy. Run with GMLP_DEVICE=cpu to force the CPU.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <math.h>
#include <stdlib.h>

#include <gmlp.h>

static gint64 n_experts = 8;
static gint64 n_tokens = 4096;
static gint64 hidden = 1024;
static gint64 seed = 1;

static const GOptionEntry entries[] = {
  { "experts", 'e', 0, G_OPTION_ARG_INT64, &n_experts, "Number of experts (groups)", "N" },
  { "tokens", 't', 0, G_OPTION_ARG_INT64, &n_tokens, "Number of routed tokens (rows)", "M" },
  { "hidden", 'k', 0, G_OPTION_ARG_INT64, &hidden, "Hidden size (columns)", "K" },
  { "seed", 's', 0, G_OPTION_ARG_INT64, &seed, "Random seed", "S" },
  { NULL }
};

/* Relative error ‖q − x‖ / ‖x‖ of a converted tensor, on the host. */
static double
relative_error (GBytes *reference, GmlpGroupedTensor *converted, GError **error)
{
  g_autoptr(GmlpGroupedTensor) back = gmlp_grouped_tensor_convert (converted, GMLP_DTYPE_FLOAT32, error);
  g_autoptr(GBytes) bytes = NULL;
  const float *x, *q;
  double num = 0.0, den = 0.0;
  gsize n, i;

  if (back == NULL || (bytes = gmlp_grouped_tensor_to_bytes (back, error)) == NULL)
    return NAN;

  x = g_bytes_get_data (reference, &n);
  q = g_bytes_get_data (bytes, NULL);
  for (i = 0; i < n / sizeof (float); i++)
    {
      num += ((double) q[i] - x[i]) * ((double) q[i] - x[i]);
      den += (double) x[i] * x[i];
    }
  return sqrt (num / den);
}

int
main (int argc, char *argv[])
{
  g_autoptr(GOptionContext) context = g_option_context_new ("- grouped tensors on the default device");
  g_autoptr(GError) error = NULL;
  g_autofree gint64 *rows = NULL;
  g_autoptr(GmlpGroupedTensor) x = NULL;
  g_autoptr(GmlpGroupedTensor) x_bf16 = NULL;
  g_autoptr(GmlpGroupedTensor) x_fp8 = NULL;
  g_autoptr(GBytes) x_host = NULL;
  GmlpDevice *device;
  GRand *rand;
  gint64 assigned = 0;
  gint64 e;

  setlocale (LC_ALL, "");
  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, &argc, &argv, &error))
    {
      g_printerr ("%s\n", error->message);
      return EXIT_FAILURE;
    }
  if (n_experts < 1 || n_experts > 65535 || n_tokens < 0 || hidden < 1)
    {
      g_printerr ("Need 1 to 65535 experts, tokens >= 0 and hidden >= 1\n");
      return EXIT_FAILURE;
    }

  device = gmlp_device_get_default ();
  g_print ("libgmlp %s on %s\n", GMLP_VERSION_S, gmlp_device_get_name (device));

  /* Skewed routing: each token picks an expert with probability ∝ (e + 1). */
  rand = g_rand_new_with_seed ((guint32) seed);
  rows = g_new0 (gint64, n_experts);
  for (assigned = 0; assigned < n_tokens; assigned++)
    {
      double u = g_rand_double (rand) * (double) (n_experts * (n_experts + 1) / 2);
      for (e = 0; e < n_experts - 1 && u >= (double) (e + 1); e++)
        u -= (double) (e + 1);
      rows[e]++;
    }
  g_rand_free (rand);

  x = gmlp_grouped_tensor_new (device, GMLP_DTYPE_FLOAT32, rows, (guint) n_experts, hidden, &error);
  if (x == NULL || !gmlp_grouped_tensor_fill_random (x, (guint64) seed, 2.0, &error))
    goto fail;

  g_print ("%" G_GINT64_FORMAT " tokens x %" G_GINT64_FORMAT " routed to %" G_GINT64_FORMAT " experts:",
           n_tokens, hidden, n_experts);
  for (e = 0; e < MIN (n_experts, 16); e++)
    g_print (" %" G_GINT64_FORMAT, gmlp_grouped_tensor_get_rows (x, (guint) e));
  g_print ("%s\n", n_experts > 16 ? " ..." : "");

  if ((x_host = gmlp_grouped_tensor_to_bytes (x, &error)) == NULL ||
      (x_bf16 = gmlp_grouped_tensor_convert (x, GMLP_DTYPE_BFLOAT16, &error)) == NULL ||
      (x_fp8 = gmlp_grouped_tensor_convert (x, GMLP_DTYPE_FLOAT8_E4M3, &error)) == NULL)
    goto fail;

  g_print ("float32 -> bfloat16: relative error %.2e\n", relative_error (x_host, x_bf16, &error));
  g_print ("float32 -> float8_e4m3: relative error %.2e\n", relative_error (x_host, x_fp8, &error));
  if (error != NULL)
    goto fail;
  g_print ("device memory held by libgmlp: %.1f MiB\n",
           gmlp_device_get_bytes_in_use (device) / 1048576.0);
  return EXIT_SUCCESS;

fail:
  g_printerr ("gmlp-example: %s\n", error->message);
  return EXIT_FAILURE;
}
