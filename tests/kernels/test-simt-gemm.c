/* test-simt-gemm.c: the portable grouped GEMM (gmlp_kernel_device_gemm_simt)
 * called directly over an enumeration of products
 *
 * Every product (kind × dtypes × shape × variant, group sizes on the
 * device, which is all the portable kernel takes) gets fresh random
 * operands, laid out as libgmlp's CUDA backend lays them out
 * (gemm-case.c), its output poisoned with NaN, and is compared with a
 * float64 reference within the library tests' tolerance for its dtype.
 * Any CUDA device runs it; without one only the reference's own check
 * runs.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>

#include "gemm-case.h"

static const GemmDtypes dtypes[] = {
  { "f32", GMLP_NUM_FLOAT32, 0, GMLP_NUM_FLOAT32, FALSE },
  { "bf16", GMLP_NUM_BFLOAT16, 0, GMLP_NUM_BFLOAT16, FALSE },
  { "bf16-f32", GMLP_NUM_BFLOAT16, 0, GMLP_NUM_FLOAT32, FALSE },
  { "f16", GMLP_NUM_FLOAT16, 0, GMLP_NUM_FLOAT16, FALSE },
  { "f16-f32", GMLP_NUM_FLOAT16, 0, GMLP_NUM_FLOAT32, FALSE },
};

/* Empty groups, groups of one row, rows not multiples of the tiles, many
 * small groups and a few large ones, negative sizes (0 rows); features of
 * any count (the portable kernel needs no TMA rows). */
static const gint64 mixed_rows[] = { 0, 1, 37, 64, 130, 200, 0, 129 };
static const gint64 odd_rows[] = { 5, 77, 0, 190 };
static const gint64 large_rows[] = { 700, 1100, 0, 900 };
static const gint64 narrow_rows[] = { 3, 0, 1, 65 };
static const gint64 single_rows[] = { 513 };
static const gint64 negative_rows[] = { 129, 0, 77, -3, 256 };
static const gint64 cut_rows[] = { 129, 0, 300, 77, 256 };

static const GemmShape shapes[] = {
  { "mixed", G_N_ELEMENTS (mixed_rows), mixed_rows, 0, 256, 128 },
  { "odd", G_N_ELEMENTS (odd_rows), odd_rows, 0, 13, 100 },
  { "odd-wide", G_N_ELEMENTS (odd_rows), odd_rows, 0, 200, 72 },
  { "narrow", G_N_ELEMENTS (narrow_rows), narrow_rows, 0, 1, 3 },
  { "many-small", 40, NULL, 20, 128, 256 },
  { "large", G_N_ELEMENTS (large_rows), large_rows, 0, 256, 512 },
  { "single", G_N_ELEMENTS (single_rows), single_rows, 0, 192, 264 },
  { "negative", G_N_ELEMENTS (negative_rows), negative_rows, 0, 72, 40, TRUE },
  { "groups-300", 300, NULL, 12, 24, 40 },
  /* A capacity of 469 rows, rows of whole multiples of 256 bytes: the
   * fourth group keeps 40 of its 77, the last none. */
  { "cut", G_N_ELEMENTS (cut_rows), cut_rows, 0, 128, 256, TRUE, 293 },
};

static GArray *problems;   /* GemmProblem */
static cudaStream_t stream;

static void
enumerate (void)
{
  static const GmlpKernelGemmKind kinds[] = {
    GMLP_KERNEL_GEMM_FPROP, GMLP_KERNEL_GEMM_DGRAD, GMLP_KERNEL_GEMM_WGRAD,
  };

  problems = g_array_new (FALSE, TRUE, sizeof (GemmProblem));
  for (gsize ki = 0; ki < G_N_ELEMENTS (kinds); ki++)
    for (gsize di = 0; di < G_N_ELEMENTS (dtypes); di++)
      for (gsize si = 0; si < G_N_ELEMENTS (shapes); si++)
        for (int v = 0; v < GEMM_N_VARIANTS; v++)
          {
            GemmProblem p = { kinds[ki], &dtypes[di], &shapes[si], TRUE, v };

            if (v != GEMM_VARIANT_PLAIN && si > 1)
              continue;
            if ((v == GEMM_VARIANT_BIAS && p.kind != GMLP_KERNEL_GEMM_FPROP) ||
                (v == GEMM_VARIANT_SCATTERED && p.kind == GMLP_KERNEL_GEMM_WGRAD) ||
                (v == GEMM_VARIANT_ACCUMULATE && p.kind != GMLP_KERNEL_GEMM_WGRAD))
              continue;
            g_array_append_val (problems, p);
          }
}

static void
test_case (gconstpointer data)
{
  const GemmProblem *p = data;
  g_autoptr(GError) error = NULL;
  g_autofree char *message = NULL;
  GmlpKernelStatus status;
  void *workspace = NULL;
  GemmCase *c;
  cudaError_t err;

  c = gemm_case_new (p, g_test_rand_int (), TRUE);
  gemm_case_reference (c);
  if (!gemm_case_upload (c, &error) || !gemm_case_reset (c, stream, &error))
    {
      g_test_fail_printf ("%s", error->message);
      gemm_case_free (c);
      return;
    }
  g_assert_cmpint (cudaMalloc (&workspace, MAX (gmlp_kernel_device_gemm_simt_workspace_bytes (&c->gemm), 256)),
                   ==, cudaSuccess);
  status = gmlp_kernel_device_gemm_simt (&c->gemm, workspace, stream);
  if (status != GMLP_KERNEL_SUCCESS)
    g_test_fail_printf ("gmlp_kernel_device_gemm_simt: %s (%s)", gmlp_kernel_status_to_string (status),
                        cudaGetErrorString (gmlp_kernel_get_last_cuda_error ()));
  else if ((err = cudaStreamSynchronize (stream)) != cudaSuccess)
    g_error ("the kernel failed: %s", cudaGetErrorString (err));
  else if (!gemm_case_check (c, gemm_case_tolerance (c), &message))
    g_test_fail_printf ("%s", message);
  cudaFree (workspace);
  gemm_case_free (c);
}

/* On the host: the reference against the naive product read back through
 * the layouts, on the small shapes. */
static void
test_reference (void)
{
  for (guint i = 0; i < problems->len; i++)
    {
      const GemmProblem *p = &g_array_index (problems, GemmProblem, i);
      g_autofree double *naive = NULL;
      g_autofree char *message = NULL;
      g_autofree char *name = gemm_problem_name (p);
      GemmCase *c;
      gsize n;

      if (p->shape != &shapes[1] && p->shape != &shapes[3])
        continue;
      c = gemm_case_new (p, g_test_rand_int (), TRUE);
      gemm_case_reference (c);
      naive = gemm_case_naive (c);
      n = p->kind == GMLP_KERNEL_GEMM_WGRAD ? (gsize) c->n_groups * c->n * c->k :
                                              (gsize) c->total_rows * gemm_case_out_cols (c);
      if (!gemm_case_images_fit (c))
        g_test_fail_printf ("%s: laid out past an allocation", name);
      if (!gemm_close (c->want, naive, n, 1e-12, &message))
        g_test_fail_printf ("%s: %s", name, message);
      gemm_case_free (c);
    }
}

/* Without a device: the kernel's argument checks, which come before it
 * asks the device anything, take every product of the enumeration (it then
 * fails at the device, LAUNCH_FAILED, having written nothing). */
static void
test_arguments (void)
{
  for (guint i = 0; i < problems->len; i++)
    {
      const GemmProblem *p = &g_array_index (problems, GemmProblem, i);
      GemmCase *c = gemm_case_new (p, g_test_rand_int (), FALSE);
      g_autofree void *workspace = NULL;
      GmlpKernelStatus status;

      gemm_case_describe (c, FALSE);
      workspace = g_malloc (MAX (gmlp_kernel_device_gemm_simt_workspace_bytes (&c->gemm), 8));
      status = gmlp_kernel_device_gemm_simt (&c->gemm, workspace, NULL);
      if (status == GMLP_KERNEL_INVALID_VALUE || status == GMLP_KERNEL_UNSUPPORTED)
        {
          g_autofree char *name = gemm_problem_name (p);

          g_test_fail_printf ("%s: %s", name, gmlp_kernel_status_to_string (status));
        }
      gemm_case_free (c);
    }
}

static void
test_no_device (void)
{
  g_test_skip ("no CUDA device");
}

int
main (int    argc,
      char **argv)
{
  int major, minor, n_sms, rc;

  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);
  enumerate ();

  g_test_add_func ("/Kernels/SimtGemm/reference", test_reference);
  if (!gemm_cuda_device (&major, &minor, &n_sms))
    {
      g_test_add_func ("/Kernels/SimtGemm/arguments", test_arguments);
      g_test_add_func ("/Kernels/SimtGemm/device", test_no_device);
    }
  else
    {
      g_assert_cmpint (cudaStreamCreateWithFlags (&stream, cudaStreamNonBlocking), ==, cudaSuccess);
      for (guint i = 0; i < problems->len; i++)
        {
          const GemmProblem *p = &g_array_index (problems, GemmProblem, i);
          g_autofree char *name = gemm_problem_name (p);
          g_autofree char *path = g_strdup_printf ("/Kernels/SimtGemm/run/%s", name);

          g_test_add_data_func (path, p, test_case);
        }
    }

  rc = g_test_run ();
  if (stream != NULL)
    cudaStreamDestroy (stream);
  g_array_unref (problems);
  return rc;
}
