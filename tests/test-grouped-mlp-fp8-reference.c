/* test-grouped-mlp-fp8-reference.c: the FP8 MLP's problems and reference
 *
 * Problems, the float64 reference of the exact MLP, the MLP run on them,
 * and the errors measured against the reference and the BF16 MLP.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "test-grouped-mlp-fp8.h"

void
problem_free (Problem *p)
{
  g_free (p->rows);
  g_free (p->x); g_free (p->dy);
  g_free (p->w1); g_free (p->b1); g_free (p->w2); g_free (p->b2);
  g_clear_object (&p->xt);
  g_clear_object (&p->dyt);
  g_free (p);
}

void
outputs_clear (Outputs *o)
{
  g_clear_pointer (&o->y, g_free);
  g_clear_pointer (&o->dx, g_free);
  g_clear_pointer (&o->dw1, g_free);
  g_clear_pointer (&o->dw2, g_free);
  g_clear_pointer (&o->db1, g_free);
  g_clear_pointer (&o->db2, g_free);
}

/* Fresh data for @mlp's shape: x and dy amplitude × N(0, 1); the
 * parameters the MLP holds (initialised by the test from a fresh seed). */
Problem *
problem_new (GmlpGroupedMLP *mlp, const gint64 *rows, double amplitude)
{
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
  GmlpDevice *device = gmlp_grouped_linear_get_device (fc1);
  GmlpDType dtype = gmlp_grouped_linear_get_dtype (fc1);
  Problem *p = g_new0 (Problem, 1);
  guint g;

  p->n = gmlp_grouped_linear_get_n_groups (fc1);
  p->hid = gmlp_grouped_linear_get_in_features (fc1);
  p->w1o = gmlp_grouped_linear_get_out_features (fc1);
  p->ffn = gmlp_grouped_linear_get_in_features (fc2);
  p->act = gmlp_grouped_mlp_get_activation (mlp);
  p->rows = g_memdup2 (rows, p->n * sizeof (gint64));
  for (g = 0; g < p->n; g++)
    p->total += rows[g];
  p->xt = gmlp_test_random_tensor (device, dtype, rows, p->n, p->hid, amplitude, &p->x);
  p->dyt = gmlp_test_random_tensor (device, dtype, rows, p->n, p->hid, 1.0, &p->dy);
  p->w1 = gmlp_test_download (gmlp_grouped_linear_get_weight (fc1), NULL);
  p->b1 = gmlp_test_download (gmlp_grouped_linear_get_bias (fc1), NULL);
  p->w2 = gmlp_test_download (gmlp_grouped_linear_get_weight (fc2), NULL);
  p->b2 = gmlp_test_download (gmlp_grouped_linear_get_bias (fc2), NULL);
  return p;
}

/* The exact MLP in float64: y = act(x W1ᵀ + b1) W2ᵀ + b2 and its
 * gradients for dL/dy = dy. */
void
reference (const Problem *p, Outputs *out)
{
  gint64 hid = p->hid, ffn = p->ffn, w1o = p->w1o, r0 = 0;
  g_autofree double *h = g_new (double, MAX (w1o, 1));
  g_autofree double *a = g_new (double, MAX (ffn, 1));
  g_autofree double *da = g_new (double, MAX (ffn, 1));
  g_autofree double *dh = g_new (double, MAX (w1o, 1));
  guint g;

  out->y = g_new0 (double, MAX (p->total * hid, 1));
  out->dx = g_new0 (double, MAX (p->total * hid, 1));
  out->dw1 = g_new0 (double, p->n * w1o * hid);
  out->dw2 = g_new0 (double, p->n * hid * ffn);
  out->db1 = g_new0 (double, p->n * w1o);
  out->db2 = g_new0 (double, p->n * hid);

  for (g = 0; g < p->n; g++)
    {
      const double *w1 = p->w1 + g * w1o * hid, *w2 = p->w2 + g * hid * ffn;
      gint64 r, j, c;

      for (r = r0; r < r0 + p->rows[g]; r++)
        {
          const double *x = p->x + r * hid, *dy = p->dy + r * hid;

          for (j = 0; j < w1o; j++)
            {
              double acc = p->b1[g * w1o + j];
              for (c = 0; c < hid; c++)
                acc += x[c] * w1[j * hid + c];
              h[j] = acc;
            }
          for (c = 0; c < ffn; c++)
            a[c] = gmlp_test_act (p->act, h[c]) * (gated (p->act) ? h[ffn + c] : 1.0);
          for (j = 0; j < hid; j++)
            {
              double acc = p->b2[g * hid + j];
              for (c = 0; c < ffn; c++)
                acc += a[c] * w2[j * ffn + c];
              out->y[r * hid + j] = acc;
            }

          for (c = 0; c < ffn; c++)
            {
              double acc = 0.0;
              for (j = 0; j < hid; j++)
                acc += dy[j] * w2[j * ffn + c];
              da[c] = acc;
            }
          for (c = 0; c < ffn; c++)
            {
              if (gated (p->act))
                {
                  dh[c] = da[c] * h[ffn + c] * act_df (p->act, h[c]);
                  dh[ffn + c] = da[c] * gmlp_test_act (p->act, h[c]);
                }
              else
                dh[c] = da[c] * act_df (p->act, h[c]);
            }
          for (c = 0; c < hid; c++)
            {
              double acc = 0.0;
              for (j = 0; j < w1o; j++)
                acc += dh[j] * w1[j * hid + c];
              out->dx[r * hid + c] = acc;
            }
          for (j = 0; j < hid; j++)
            {
              out->db2[g * hid + j] += dy[j];
              for (c = 0; c < ffn; c++)
                out->dw2[(g * hid + j) * ffn + c] += dy[j] * a[c];
            }
          for (j = 0; j < w1o; j++)
            {
              out->db1[g * w1o + j] += dh[j];
              for (c = 0; c < hid; c++)
                out->dw1[(g * w1o + j) * hid + c] += dh[j] * x[c];
            }
        }
      r0 += p->rows[g];
    }
}

/* forward and backward of @mlp on @p. */
void
run_mlp (GmlpGroupedMLP *mlp, const Problem *p, Outputs *out)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL, dx = NULL;
  GmlpGroupedLinear *fc1 = gmlp_grouped_mlp_get_fc1 (mlp), *fc2 = gmlp_grouped_mlp_get_fc2 (mlp);
  gsize n;

  y = gmlp_grouped_mlp_forward (mlp, p->xt, &saved, &error);
  g_assert_no_error (error);
  dx = gmlp_grouped_mlp_backward (mlp, saved, p->dyt, &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_saved_activations_is_consumed (saved));
  out->y = gmlp_test_download (y, &n);
  g_assert_cmpuint (n, ==, p->total * p->hid);
  out->dx = gmlp_test_download (dx, &n);
  g_assert_cmpuint (n, ==, p->total * p->hid);
  out->dw1 = gmlp_test_download (gmlp_grouped_linear_get_wgrad (fc1), &n);
  g_assert_cmpuint (n, ==, p->n * p->w1o * p->hid);
  out->dw2 = gmlp_test_download (gmlp_grouped_linear_get_wgrad (fc2), &n);
  g_assert_cmpuint (n, ==, p->n * p->hid * p->ffn);
  out->db1 = gmlp_test_download (gmlp_grouped_linear_get_bgrad (fc1), &n);
  out->db2 = gmlp_test_download (gmlp_grouped_linear_get_bgrad (fc2), &n);
}

/* Gives @to the parameters of @from. */
void
copy_parameters (GmlpGroupedMLP *from, GmlpGroupedMLP *to)
{
  g_autoptr(GError) error = NULL;
  guint l;

  for (l = 0; l < 2; l++)
    {
      GmlpGroupedLinear *a = l == 0 ? gmlp_grouped_mlp_get_fc1 (from) : gmlp_grouped_mlp_get_fc2 (from);
      GmlpGroupedLinear *b = l == 0 ? gmlp_grouped_mlp_get_fc1 (to) : gmlp_grouped_mlp_get_fc2 (to);
      g_autoptr(GBytes) w = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_weight (a), &error);
      g_autoptr(GBytes) bias = gmlp_grouped_tensor_to_bytes (gmlp_grouped_linear_get_bias (a), &error);

      g_assert_no_error (error);
      g_assert_true (gmlp_grouped_linear_set_weight_from_bytes (b, w, &error));
      g_assert_true (gmlp_grouped_linear_set_bias_from_bytes (b, bias, &error));
      g_assert_no_error (error);
    }
}

GmlpGroupedMLP *
new_mlp (GmlpDevice *device, guint n, gint64 hid, gint64 ffn, GmlpActivation act,
         GmlpScalingRecipe recipe, GmlpLinearFlags extra)
{
  g_autoptr(GError) error = NULL;
  GmlpGroupedMLP *mlp = g_initable_new (GMLP_TYPE_GROUPED_MLP, NULL, &error,
                                        "device", device, "n-groups", n, "hidden", hid,
                                        "ffn-hidden", ffn, "activation", act,
                                        "dtype", GMLP_DTYPE_BFLOAT16,
                                        "flags", (GMLP_LINEAR_BIAS | GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | extra) &
                                                 ~GMLP_LINEAR_RECOMPUTE_ACTIVATION,
                                        "recompute-activation", (extra & GMLP_LINEAR_RECOMPUTE_ACTIVATION) != 0,
                                        "fp8-recipe", recipe, NULL);

  g_assert_no_error (error);
  g_assert_nonnull (mlp);
  return mlp;
}

/* The errors of one FP8 step against the BF16 MLP (err[0..3]: y, dx, fc1
 * dW, fc2 dW) and, checked here against @bound, against the exact MLP in
 * float64 (exact[0..3]); the BF16 MLP itself must be close to float64. */
void
measure (const Problem *p, const Outputs *fp8, const Outputs *bf16, const double *bound,
         double err[4], double exact_err[4], const char *what)
{
  Outputs exact = { 0, };
  gsize n_y = p->total * p->hid, n_w1 = p->n * p->w1o * p->hid, n_w2 = p->n * p->hid * p->ffn;
  const double *got[4] = { fp8->y, fp8->dx, fp8->dw1, fp8->dw2 };
  const double *base[4] = { bf16->y, bf16->dx, bf16->dw1, bf16->dw2 };
  const double *want[4];
  gsize len[4] = { n_y, n_y, n_w1, n_w2 };
  guint i;

  reference (p, &exact);
  want[0] = exact.y; want[1] = exact.dx; want[2] = exact.dw1; want[3] = exact.dw2;
  for (i = 0; i < 4; i++)
    {
      g_autofree char *name = g_strdup_printf ("%s: %s", what, output_names[i]);
      double e_bf16 = gmlp_test_relative_error (base[i], want[i], len[i], name);

      err[i] = gmlp_test_relative_error (got[i], base[i], len[i], name);
      exact_err[i] = gmlp_test_relative_error (got[i], want[i], len[i], name);
      /* The BF16 MLP itself: a few roundings to BF16 (for ReLU, the gates
       * that BF16 flips, a tenth of what FP8 flips). */
      if (!(e_bf16 <= (p->act == GMLP_ACTIVATION_RELU ? 0.10 : 0.01)))
        g_error ("%s: the BF16 MLP is %.4f away from float64", name, e_bf16);
      if (!(exact_err[i] <= bound[i]))
        g_error ("%s: relative error %.4f from float64, beyond %.4f", name, exact_err[i], bound[i]);
    }
  /* The bias gradients come from the unquantized output gradients: FC2's
   * is dy's sum, FC1's that of the activation's gradient. */
  gmlp_test_assert_close (fp8->db2, exact.db2, p->n * p->hid, 1e-2, "fc2 dbias");
  outputs_clear (&exact);
}
