/* test-sm90-gemm.c: the Hopper grouped GEMM (gmlp_kernel_device_gemm_sm90)
 * called directly over an enumeration of products and schedules
 *
 * Every product of the enumeration (kind × dtypes × shape × host or device
 * sizes × bias, accumulation or scattered weights) gets fresh random
 * operands, laid out as libgmlp's CUDA backend lays them out
 * (gemm-case.c), and a float64 reference; it then runs under each schedule
 * of its dtypes' list (a GmlpKernelSm90Tuning: the heuristics' choice, and
 * each choice forced on and off), the output poisoned with NaN before each
 * call, and is compared with the reference within the library tests'
 * tolerance for its dtype. Each (product, schedule) is one test case: one
 * that _check refuses as UNSUPPORTED is skipped, with its reason; one it
 * refuses as INVALID_VALUE fails (the arguments are wrong). The last case
 * fails if any schedule ran none of its cases, so that a _check that
 * refused everything cannot pass.
 *
 * Without an sm_90 device only the host-side cases run: the reference
 * against a naive product, and _check over the whole enumeration.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <string.h>

#include "gemm-case.h"

/* Which dtypes a schedule is worth running with. */
enum {
  ON_16BIT = 1 << 0,
  ON_FP8 = 1 << 1,       /* per-tensor scales */
  ON_BLOCKS = 1 << 2,    /* blockwise scales */
  ON_ALL = ON_16BIT | ON_FP8 | ON_BLOCKS,
};

#define NEVER  GMLP_KERNEL_CHOICE_NEVER
#define ALWAYS GMLP_KERNEL_CHOICE_ALWAYS

typedef struct {
  const char           *name;
  GmlpKernelSm90Tuning  tuning;
  int                   on;
} Schedule;

/* { fp8_tile_n, direct, short_tiles, pairs, even_waves, stream_k, max_ctas };
 * the first, all zeros, goes as NULL. */
static const Schedule schedules[] = {
  { "heuristics",           { 0, 0, 0, 0, 0, 0, 0 }, ON_ALL },
  { "plan",                 { 0, NEVER, 0, 0, 0, 0, 0 }, ON_ALL },
  { "grid-2",               { 0, 0, 0, 0, 0, 0, 2 }, ON_ALL },
  { "short-tiles-never",    { 0, 0, NEVER, 0, 0, 0, 0 }, ON_ALL },
  { "short-tiles-always",   { 0, 0, ALWAYS, 0, 0, 0, 0 }, ON_16BIT },
  { "plan-short-tiles-always", { 0, NEVER, ALWAYS, 0, 0, 0, 0 }, ON_16BIT },
  { "even-waves",           { 0, 0, 0, 0, ALWAYS, 0, 0 }, ON_16BIT | ON_FP8 },
  { "even-waves-never",     { 0, 0, 0, 0, NEVER, 0, 0 }, ON_16BIT | ON_FP8 },
  { "plan-even-waves",      { 0, NEVER, 0, 0, ALWAYS, 0, 0 }, ON_16BIT | ON_FP8 },
  { "stream-k-grid-6",      { 0, 0, 0, 0, 0, ALWAYS, 6 }, ON_16BIT | ON_FP8 },
  { "stream-k-never-grid-6", { 0, 0, 0, 0, 0, NEVER, 6 }, ON_16BIT | ON_FP8 },
  { "tiles-128",            { 128, 0, 0, 0, 0, 0, 0 }, ON_FP8 | ON_BLOCKS },
  { "tiles-192",            { 192, 0, 0, 0, 0, 0, 0 }, ON_FP8 | ON_BLOCKS },
  { "plan-tiles-128",       { 128, NEVER, 0, 0, 0, 0, 0 }, ON_FP8 | ON_BLOCKS },
  { "plan-tiles-192",       { 192, NEVER, 0, 0, 0, 0, 0 }, ON_FP8 | ON_BLOCKS },
  { "tiles-192-paired",     { 192, 0, 0, ALWAYS, 0, 0, 0 }, ON_FP8 },
  { "tiles-192-unpaired",   { 192, 0, 0, NEVER, 0, 0, 0 }, ON_FP8 },
  { "tiles-192-paired-even-waves", { 192, 0, 0, ALWAYS, ALWAYS, 0, 0 }, ON_FP8 },
  { "tiles-128-stream-k-grid-6", { 128, 0, 0, 0, 0, ALWAYS, 6 }, ON_FP8 },
  { "tiles-192-paired-stream-k-grid-6", { 192, 0, 0, ALWAYS, 0, ALWAYS, 6 }, ON_FP8 },
  { "tiles-192-paired-even-waves-stream-k-grid-6", { 192, 0, 0, ALWAYS, ALWAYS, ALWAYS, 6 }, ON_FP8 },
};

static const GemmDtypes dtypes[] = {
  { "bf16", GMLP_NUM_BFLOAT16, 0, GMLP_NUM_BFLOAT16, FALSE },
  { "bf16-f32", GMLP_NUM_BFLOAT16, 0, GMLP_NUM_FLOAT32, FALSE },
  { "f16", GMLP_NUM_FLOAT16, 0, GMLP_NUM_FLOAT16, FALSE },
  { "f16-f32", GMLP_NUM_FLOAT16, 0, GMLP_NUM_FLOAT32, FALSE },
  { "e4m3-e4m3-bf16", GMLP_NUM_FLOAT8_E4M3, GMLP_NUM_FLOAT8_E4M3, GMLP_NUM_BFLOAT16, FALSE },
  { "e4m3-e4m3-f32", GMLP_NUM_FLOAT8_E4M3, GMLP_NUM_FLOAT8_E4M3, GMLP_NUM_FLOAT32, FALSE },
  { "e5m2-e4m3-bf16", GMLP_NUM_FLOAT8_E5M2, GMLP_NUM_FLOAT8_E4M3, GMLP_NUM_BFLOAT16, FALSE },
  { "e4m3-e5m2-f16", GMLP_NUM_FLOAT8_E4M3, GMLP_NUM_FLOAT8_E5M2, GMLP_NUM_FLOAT16, FALSE },
  { "blocks-e4m3-e4m3-bf16", GMLP_NUM_FLOAT8_E4M3, GMLP_NUM_FLOAT8_E4M3, GMLP_NUM_BFLOAT16, TRUE },
  { "blocks-e4m3-e4m3-f32", GMLP_NUM_FLOAT8_E4M3, GMLP_NUM_FLOAT8_E4M3, GMLP_NUM_FLOAT32, TRUE },
  { "blocks-e5m2-e4m3-f16", GMLP_NUM_FLOAT8_E5M2, GMLP_NUM_FLOAT8_E4M3, GMLP_NUM_FLOAT16, TRUE },
};

/* Empty groups, groups of one row, rows not multiples of 64 or 128, many
 * small groups and a few large ones, negative device sizes (0 rows);
 * features the kernel takes (multiples of 16, FP8's TMA rows), some
 * multiples of 128 (rows of whole 256-byte units: the direct schedule's),
 * some not (partial tiles and depth blocks). */
static const gint64 mixed_rows[] = { 0, 1, 37, 64, 130, 200, 0, 129 };
static const gint64 direct_rows[] = { 128, 64, 200, 0, 333 };
static const gint64 odd_rows[] = { 5, 77, 0, 190 };
static const gint64 large_rows[] = { 700, 1100, 0, 900 };
static const gint64 aligned_rows[] = { 0, 16, 48, 256, 160 };
static const gint64 wide_rows[] = { 300, 45 };
static const gint64 single_rows[] = { 513 };
static const gint64 long_rows[] = { 412, 0, 650, 233 };
static const gint64 negative_rows[] = { 129, 0, 77, -3, 256 };
static const gint64 cut_rows[] = { 129, 0, 300, 77, 256 };

static const GemmShape shapes[] = {
  { "mixed", G_N_ELEMENTS (mixed_rows), mixed_rows, 0, 256, 128 },
  { "direct", G_N_ELEMENTS (direct_rows), direct_rows, 0, 384, 256 },
  { "odd", G_N_ELEMENTS (odd_rows), odd_rows, 0, 208, 144 },
  { "many-small", 40, NULL, 20, 128, 256 },
  { "large", G_N_ELEMENTS (large_rows), large_rows, 0, 256, 512 },
  { "aligned", G_N_ELEMENTS (aligned_rows), aligned_rows, 0, 256, 384 },
  { "wide", G_N_ELEMENTS (wide_rows), wide_rows, 0, 576, 256 },
  { "single", G_N_ELEMENTS (single_rows), single_rows, 0, 192, 256 },
  /* Reductions 16 stages deep (FP8: 8), many tiles: stream-K's split tail. */
  { "long", G_N_ELEMENTS (long_rows), long_rows, 0, 384, 1024 },
  { "negative", G_N_ELEMENTS (negative_rows), negative_rows, 0, 256, 256, TRUE },
  /* A capacity of 469 rows: the fourth group keeps 40 of its 77, the last
   * none (16-bit and per-tensor FP8 FPROP and DGRAD, whose rows are whole
   * multiples of 256 bytes and every operand keeps the same rows). */
  { "cut", G_N_ELEMENTS (cut_rows), cut_rows, 0, 256, 256, TRUE, 293 },
  /* Host tables past the plan's small (and large) inline parameters. */
  { "groups-300", 300, NULL, 12, 128, 256 },
  { "groups-1300", 1300, NULL, 4, 128, 128 },
};

/* The shapes that also run with the kinds' other variants. */
static gboolean
has_variants (const GemmShape *shape)
{
  return g_str_equal (shape->name, "mixed") || g_str_equal (shape->name, "direct");
}

static int
dtypes_class (const GemmDtypes *d)
{
  if (!gmlp_num_dtype_is_fp8 (d->ab_dtype))
    return ON_16BIT;
  return d->blockwise ? ON_BLOCKS : ON_FP8;
}

static GArray *problems;   /* GemmProblem */
static int device_major, device_minor, device_sms;
static gboolean have_sm90;
static guint attempted[G_N_ELEMENTS (schedules)];
static guint ran[G_N_ELEMENTS (schedules)];

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
        for (int device_rows = 0; device_rows <= 1; device_rows++)
          for (int v = 0; v < GEMM_N_VARIANTS; v++)
            {
              GemmProblem p = { kinds[ki], &dtypes[di], &shapes[si], device_rows, v };

              if ((v != GEMM_VARIANT_PLAIN && !has_variants (&shapes[si])) ||
                  (shapes[si].device_only && !device_rows) ||
                  (shapes[si].cut > 0 && gmlp_num_dtype_is_fp8 (dtypes[di].ab_dtype) &&
                   (dtypes[di].blockwise || kinds[ki] == GMLP_KERNEL_GEMM_WGRAD)))
                continue;
              if ((v == GEMM_VARIANT_BIAS && p.kind != GMLP_KERNEL_GEMM_FPROP) ||
                  (v == GEMM_VARIANT_SCATTERED && p.kind == GMLP_KERNEL_GEMM_WGRAD) ||
                  (v == GEMM_VARIANT_ACCUMULATE && p.kind != GMLP_KERNEL_GEMM_WGRAD))
                continue;
              g_array_append_val (problems, p);
            }
}

/* The product whose cases run now, built once for all its schedules. */
static GemmCase *current;
static guint current_index = G_MAXUINT;
static void *workspace;
static size_t workspace_bytes;
static cudaStream_t stream;

static GemmCase *
case_for (guint problem)
{
  g_autoptr(GError) error = NULL;

  if (current_index == problem)
    return current;
  g_clear_pointer (&current, gemm_case_free);
  current_index = G_MAXUINT;
  current = gemm_case_new (&g_array_index (problems, GemmProblem, problem), g_test_rand_int (), TRUE);
  gemm_case_reference (current);
  if (!gemm_case_upload (current, &error))
    {
      g_test_fail_printf ("upload: %s", error->message);
      g_clear_pointer (&current, gemm_case_free);
      return NULL;
    }
  current_index = problem;
  return current;
}

static void
test_case (gconstpointer data)
{
  guint problem = GPOINTER_TO_UINT (data) / G_N_ELEMENTS (schedules);
  guint s = GPOINTER_TO_UINT (data) % G_N_ELEMENTS (schedules);
  /* The heuristics' schedule as the backend passes it without a tuning. */
  const GmlpKernelSm90Tuning *tuning = s == 0 ? NULL : &schedules[s].tuning;
  g_autoptr(GError) error = NULL;
  g_autofree char *message = NULL;
  const char *reason = NULL;
  GmlpKernelStatus status;
  GemmCase *c;
  size_t bytes;
  cudaError_t err;

  attempted[s]++;
  c = case_for (problem);
  if (c == NULL)
    return;
  status = gmlp_kernel_device_gemm_sm90_check (&c->gemm, tuning, device_major, device_minor, &reason);
  if (status == GMLP_KERNEL_UNSUPPORTED)
    {
      g_test_skip (reason);
      return;
    }
  if (status != GMLP_KERNEL_SUCCESS)
    {
      g_test_fail_printf ("_check: %s: %s", gmlp_kernel_status_to_string (status), reason);
      return;
    }

  bytes = MAX (gmlp_kernel_device_gemm_sm90_workspace_bytes (&c->gemm, tuning), 256);
  if (bytes > workspace_bytes)
    {
      if (workspace != NULL)
        cudaFree (workspace);
      workspace = NULL;
      g_assert_cmpint (cudaMalloc (&workspace, bytes), ==, cudaSuccess);
      workspace_bytes = bytes;
    }
  if (!gemm_case_reset (c, stream, &error))
    {
      g_test_fail_printf ("%s", error->message);
      return;
    }
  status = gmlp_kernel_device_gemm_sm90 (&c->gemm, tuning, workspace, device_sms, stream);
  if (status != GMLP_KERNEL_SUCCESS)
    {
      g_test_fail_printf ("gmlp_kernel_device_gemm_sm90: %s (%s)", gmlp_kernel_status_to_string (status),
                          cudaGetErrorString (gmlp_kernel_get_last_cuda_error ()));
      return;
    }
  err = cudaStreamSynchronize (stream);
  if (err != cudaSuccess)
    {
      /* The context is lost: nothing after this can run. */
      g_error ("the kernel failed: %s", cudaGetErrorString (err));
    }
  ran[s]++;
  if (!gemm_case_check (c, gemm_case_tolerance (c), &message))
    g_test_fail_printf ("%s", message);
}

/* Every schedule ran some of its cases: a _check that refused all of them,
 * or an enumeration that gave it none, fails here. */
static void
test_schedules_ran (void)
{
  guint total = 0;

  for (gsize s = 0; s < G_N_ELEMENTS (schedules); s++)
    total += attempted[s];
  if (total == 0)
    {
      g_test_skip ("no case of the enumeration was selected");
      return;
    }
  for (gsize s = 0; s < G_N_ELEMENTS (schedules); s++)
    {
      g_test_message ("%s: %u of %u cases ran", schedules[s].name, ran[s], attempted[s]);
      if (attempted[s] > 0 && ran[s] == 0)
        g_test_fail_printf ("schedule %s: none of its %u cases ran", schedules[s].name, attempted[s]);
    }
}

/* On the host: _check over the whole enumeration, with the images' host
 * pointers standing for the device's (it reads no data), as on an sm_90
 * device. Every schedule must take some of its cases, and no case may be
 * refused as invalid. */
static void
test_enumeration (void)
{
  guint accepted[G_N_ELEMENTS (schedules)] = { 0, };
  guint cases[G_N_ELEMENTS (schedules)] = { 0, };

  for (guint i = 0; i < problems->len; i++)
    {
      const GemmProblem *p = &g_array_index (problems, GemmProblem, i);
      GemmCase *c = gemm_case_new (p, g_test_rand_int (), FALSE);

      gemm_case_describe (c, FALSE);
      if (!gemm_case_images_fit (c))
        {
          g_autofree char *name = gemm_problem_name (p);

          g_test_fail_printf ("%s: laid out past an allocation", name);
        }
      for (gsize s = 0; s < G_N_ELEMENTS (schedules); s++)
        {
          const char *reason = NULL;
          GmlpKernelStatus status;

          if (!(schedules[s].on & dtypes_class (p->dtypes)))
            continue;
          cases[s]++;
          status = gmlp_kernel_device_gemm_sm90_check (&c->gemm, &schedules[s].tuning, 9, 0, &reason);
          if (status == GMLP_KERNEL_SUCCESS)
            accepted[s]++;
          else if (status != GMLP_KERNEL_UNSUPPORTED)
            {
              g_autofree char *name = gemm_problem_name (p);

              g_test_fail_printf ("%s/%s: %s: %s", name, schedules[s].name,
                                  gmlp_kernel_status_to_string (status), reason);
            }
        }
      gemm_case_free (c);
    }
  for (gsize s = 0; s < G_N_ELEMENTS (schedules); s++)
    {
      g_test_message ("%s: _check takes %u of %u cases", schedules[s].name, accepted[s], cases[s]);
      if (accepted[s] == 0)
        g_test_fail_printf ("schedule %s: _check takes none of its %u cases", schedules[s].name, cases[s]);
    }
}

/* On the host: the reference (from the values as generated) against the
 * naive product read back through the layouts, on small shapes of every
 * kind, dtype, size placement and variant. */
static void
test_reference (void)
{
  static const gint64 rows[] = { 0, 1, 130, 17 };
  static const GemmShape tiny = { "tiny", G_N_ELEMENTS (rows), rows, 0, 144, 160 };

  for (guint i = 0; i < problems->len; i++)
    {
      GemmProblem p = g_array_index (problems, GemmProblem, i);
      g_autofree double *naive = NULL;
      g_autofree char *message = NULL;
      GemmCase *c;
      gsize n;

      if (p.shape != &shapes[0])
        continue;
      p.shape = &tiny;
      c = gemm_case_new (&p, g_test_rand_int (), TRUE);
      gemm_case_reference (c);
      naive = gemm_case_naive (c);
      if (!gemm_case_images_fit (c))
        {
          g_autofree char *name = gemm_problem_name (&p);

          g_test_fail_printf ("%s: laid out past an allocation", name);
        }
      n = p.kind == GMLP_KERNEL_GEMM_WGRAD ? (gsize) c->n_groups * c->n * c->k :
                                             (gsize) c->total_rows * gemm_case_out_cols (c);
      if (!gemm_close (c->want, naive, n, 1e-12, &message))
        {
          g_autofree char *name = gemm_problem_name (&p);

          g_test_fail_printf ("%s: %s", name, message);
        }
      gemm_case_free (c);
    }
}

/* The rows a capacity cut keeps (docs/memory-layout.md). */
static void
test_cut (void)
{
  static const gint64 kept[] = { 129, 0, 300, 40, 0 };
  GemmProblem p = { GMLP_KERNEL_GEMM_FPROP, &dtypes[0], NULL, TRUE, GEMM_VARIANT_PLAIN };
  GemmCase *c;

  for (gsize i = 0; i < G_N_ELEMENTS (shapes); i++)
    if (shapes[i].cut > 0)
      p.shape = &shapes[i];
  g_assert_nonnull (p.shape);
  c = gemm_case_new (&p, g_test_rand_int (), FALSE);
  g_assert_cmpint (c->capacity, ==, 469);
  g_assert_cmpmem (c->kept, c->n_groups * sizeof (gint64), kept, sizeof kept);
  gemm_case_free (c);
}

static void
test_no_device (void)
{
  g_test_skip ("no CUDA device of compute capability 9.0");
}

int
main (int    argc,
      char **argv)
{
  int rc;

  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);
  enumerate ();

  g_test_add_func ("/Kernels/Sm90Gemm/reference", test_reference);
  g_test_add_func ("/Kernels/Sm90Gemm/cut", test_cut);
  g_test_add_func ("/Kernels/Sm90Gemm/enumeration", test_enumeration);
  have_sm90 = gemm_cuda_device (&device_major, &device_minor, &device_sms) &&
              device_major == 9 && device_minor == 0;
  if (!have_sm90)
    g_test_add_func ("/Kernels/Sm90Gemm/device", test_no_device);
  else
    {
      g_assert_cmpint (cudaStreamCreateWithFlags (&stream, cudaStreamNonBlocking), ==, cudaSuccess);
      for (guint i = 0; i < problems->len; i++)
        {
          const GemmProblem *p = &g_array_index (problems, GemmProblem, i);
          g_autofree char *name = gemm_problem_name (p);

          for (gsize s = 0; s < G_N_ELEMENTS (schedules); s++)
            {
              g_autofree char *path = NULL;

              if (!(schedules[s].on & dtypes_class (p->dtypes)))
                continue;
              path = g_strdup_printf ("/Kernels/Sm90Gemm/run/%s/%s", name, schedules[s].name);
              g_test_add_data_func (path, GUINT_TO_POINTER (i * G_N_ELEMENTS (schedules) + s), test_case);
            }
        }
      g_test_add_func ("/Kernels/Sm90Gemm/summary/schedules-ran", test_schedules_ran);
    }

  rc = g_test_run ();
  g_clear_pointer (&current, gemm_case_free);
  if (workspace != NULL)
    cudaFree (workspace);
  if (stream != NULL)
    cudaStreamDestroy (stream);
  g_array_unref (problems);
  return rc;
}
