/* test-split-parts.c: the backend's split_bfloat16 and sum_parts entries
 *
 * FP32 values as sums of BF16 parts, which the router's gate multiplies on
 * BF16 tensor cores (libgmlp/gmlp-grouped-linear-split.c). Every part of
 * every value is checked byte for byte against the rule of
 * gmlp_num_split_bfloat16() computed here in float64 with the tests' own
 * model of BF16 rounding, over random values of many scales and the
 * special ones (zeros, FP32 and BF16 subnormals, ties, values near
 * FLT_MAX, ±Inf, NaN), in every layout the gate uses (blocks, side by
 * side, transposed, a part to several outputs) and with bytes that no
 * output names left as they were. Sums of parts are checked byte for byte
 * against the order the entry states. Bad descriptors are refused before
 * anything is written. The suite's device runs them: the CPU, or CUDA.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <float.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-device-private.h"
#include "gmlp-grouped-tensor-private.h"

#define BF16_MAX 3.38953138925153547590e38   /* (2 − 2^-7) 2^127 */
#define UNTOUCHED 0xabcdu                    /* a NaN of BF16 */

static guint32
float_bits (float f)
{
  guint32 u;

  memcpy (&u, &f, sizeof u);
  return u;
}

/* The BF16 bits of a value that BF16 holds exactly. */
static guint16
bf16_bits (double exact)
{
  float f = (float) exact;

  g_assert_true (isnan (exact) || (double) f == exact);
  return (guint16) (float_bits (f) >> 16);
}

/* gmlp_num_split_bfloat16()'s rule, in float64: each part the remainder
 * rounded to BF16 (nearest even; a finite remainder that would round past
 * the range gives ±BF16_MAX), the remainder then less the part (exact, and
 * held by FP32: checked), and +0 after a part that is ±Inf or NaN (a NaN
 * quieted, its sign and top payload bits kept). */
static void
ref_split (float     v,
           guint     n_parts,
           guint16  *parts)
{
  double rest = v;
  gboolean finite = TRUE;
  guint p;

  for (p = 0; p < n_parts; p++)
    {
      double h;

      if (!finite)
        {
          parts[p] = 0;
          continue;
        }
      if (isnan (rest))
        {
          parts[p] = (guint16) ((float_bits (v) >> 16) | 0x0040u);
          finite = FALSE;
          continue;
        }
      h = gmlp_test_round (rest, GMLP_DTYPE_BFLOAT16);
      if (isinf (h) && isfinite (rest))
        h = copysign (BF16_MAX, rest);
      parts[p] = bf16_bits (h);
      if (!isfinite (h))
        {
          finite = FALSE;
          continue;
        }
      rest -= h;
      g_assert_true ((double) (float) rest == rest);
    }
}

static double
bf16_value (guint16 bits)
{
  return gmlp_test_decode (&bits, GMLP_DTYPE_BFLOAT16, 0);
}

/* FP32 values: random ones of scales from 2^-120 to 2^120, and the
 * special ones. */
static float *
test_values (gsize n)
{
  static const float specials[] = {
    0.0f, -0.0f, 1.0f, -1.0f,
    1e-40f, -3e-39f, 1.4e-45f, FLT_MIN, -FLT_MIN,
    0x1p-133f, 0x1p-134f, 0x3p-134f, 0x1.8p-130f,     /* BF16 subnormals, ties */
    1.0f + 0x1p-8f, 1.0f + 0x3p-8f, 1.0f + 0x1p-8f + 0x1p-23f, -(1.0f + 0x1p-8f),
    0x1.fffffep0f, 0x1.ff8p0f, 0x1.0101p0f,
    FLT_MAX, -FLT_MAX, 3.3895e38f, 3.3962e38f, 0x1.ff8p127f, 0x1.ff7ffep127f,
    INFINITY, -INFINITY, NAN, -NAN,
  };
  float *v = g_new (float, n);
  gsize i;

  for (i = 0; i < n; i++)
    {
      if (i < G_N_ELEMENTS (specials))
        v[i] = specials[i];
      else
        v[i] = (float) ldexp (gmlp_test_normal (1.0, GMLP_DTYPE_FLOAT32),
                              g_test_rand_int_range (-120, 121));
    }
  /* A few at random places too, for the tiles of the GPU's kernel. */
  for (i = 0; i < n / 16; i++)
    v[g_test_rand_int_range (0, (int) n)] = specials[g_test_rand_int_range (0, G_N_ELEMENTS (specials))];
  return v;
}

static GmlpGroupedTensor *
upload (GmlpDevice    *device,
        GmlpDType      dtype,
        gconstpointer  data,
        gint64         n)
{
  g_autoptr(GBytes) bytes = g_bytes_new (data, (gsize) n * gmlp_dtype_get_size (dtype));
  g_autoptr(GError) error = NULL;
  gint64 rows = 1;
  GmlpGroupedTensor *t = gmlp_grouped_tensor_new_from_bytes (device, dtype, &rows, 1, n, bytes, &error);

  g_assert_no_error (error);
  return t;
}

static gpointer
download (GmlpGroupedTensor *t,
          gsize              size)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) bytes = gmlp_grouped_tensor_to_bytes (t, &error);

  g_assert_no_error (error);
  g_assert_cmpuint (g_bytes_get_size (bytes), ==, size);
  return g_memdup2 (g_bytes_get_data (bytes, NULL), size);
}

/* One layout of split_bfloat16's outputs. */
typedef struct {
  const char *name;
  gint64      rows, cols;
  gint64      src_pad;         /* src_stride − cols */
  guint       n_parts;
  gboolean    transposed;      /* output j: cols × rows, row stride 1 */
  gboolean    side_by_side;    /* outputs j at column j cols of rows of n cols */
  guint       n_outputs;
  guint       part[GMLP_BACKEND_MAX_SPLIT_OUTPUTS];
} Layout;

static const Layout layouts[] = {
  { "blocks", 5, 7, 0, 3, FALSE, FALSE, 3, { 0, 1, 2 } },
  { "side-by-side", 70, 45, 3, 3, FALSE, TRUE, 3, { 0, 1, 2 } },
  { "transposed-six", 70, 45, 0, 3, TRUE, FALSE, 6, { 0, 0, 0, 1, 2, 1 } },
  { "transposed-tall", 131, 8, 5, 3, TRUE, FALSE, 3, { 2, 1, 0 } },
  { "six-blocks", 24, 200, 0, 3, FALSE, FALSE, 6, { 0, 1, 2, 0, 0, 1 } },
  { "two-parts", 33, 33, 1, 2, FALSE, TRUE, 2, { 0, 1 } },
  { "one-part", 40, 64, 0, 1, TRUE, FALSE, 2, { 0, 0 } },
};

/* Every part of every value of each layout, byte for byte; bytes no output
 * names keep their value. */
static void
test_split (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint l;

  if (device == NULL)
    return;
  for (l = 0; l < G_N_ELEMENTS (layouts); l++)
    {
      const Layout *L = &layouts[l];
      gint64 stride = L->cols + L->src_pad;
      gint64 n_src = L->rows * stride, block = L->rows * L->cols;
      /* One spare element between outputs, and after the last. */
      gint64 n_dst = L->side_by_side ? L->rows * (L->n_outputs * L->cols + 1)
                                     : L->n_outputs * (block + 1);
      g_autofree float *src = test_values ((gsize) n_src);
      g_autofree guint16 *init = g_new (guint16, n_dst);
      g_autofree guint16 *got = NULL;
      g_autoptr(GmlpGroupedTensor) src_t = NULL, dst_t = NULL;
      g_autofree gboolean *named = g_new0 (gboolean, n_dst);
      g_autoptr(GError) error = NULL;
      GmlpBackendSplit s = {
        .rows = L->rows,
        .cols = L->cols,
        .src_stride = stride,
        .n_parts = L->n_parts,
        .dst_row_stride = L->transposed ? 1 : L->side_by_side ? L->n_outputs * L->cols + 1 : L->cols,
        .dst_col_stride = L->transposed ? L->rows : 1,
        .n_outputs = L->n_outputs,
      };
      gint64 r, c, i;
      guint j;

      for (i = 0; i < n_dst; i++)
        init[i] = UNTOUCHED;
      /* The padding columns of src are read by nobody. */
      for (r = 0; r < L->rows; r++)
        for (c = L->cols; c < stride; c++)
          src[r * stride + c] = NAN;
      for (j = 0; j < L->n_outputs; j++)
        {
          s.part[j] = L->part[j];
          s.offset[j] = L->side_by_side ? (gint64) j * L->cols : (gint64) j * (block + 1);
        }
      src_t = upload (device, GMLP_DTYPE_FLOAT32, src, n_src);
      dst_t = upload (device, GMLP_DTYPE_BFLOAT16, init, n_dst);
      s.src = gmlp_grouped_tensor_get_data (src_t);
      s.dst = gmlp_grouped_tensor_get_data (dst_t);
      g_assert_true (GMLP_DEVICE_CALL (device, split_bfloat16, &s, &error));
      g_assert_no_error (error);
      got = download (dst_t, (gsize) n_dst * 2);

      for (r = 0; r < L->rows; r++)
        for (c = 0; c < L->cols; c++)
          {
            float v = src[r * stride + c];
            guint16 want[GMLP_BACKEND_MAX_SPLIT_PARTS];

            ref_split (v, L->n_parts, want);
            for (j = 0; j < L->n_outputs; j++)
              {
                gint64 at = s.offset[j] + r * s.dst_row_stride + c * s.dst_col_stride;

                named[at] = TRUE;
                if (got[at] != want[L->part[j]])
                  g_error ("%s: value %g (%08x) at (%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                           "), output %u (part %u): %04x, expected %04x", L->name, v, float_bits (v),
                           r, c, j, L->part[j], got[at], want[L->part[j]]);
              }
            /* Three parts hold every FP32 value whose last bit is not
             * below BF16's subnormals (|v| ≥ 2^-110), exactly. */
            if (L->n_parts == 3 && isfinite (v) && fabs (v) >= 0x1p-110)
              g_assert_cmpfloat (bf16_value (want[0]) + bf16_value (want[1]) + bf16_value (want[2]),
                                 ==, (double) v);
          }
      for (i = 0; i < n_dst; i++)
        if (!named[i] && got[i] != UNTOUCHED)
          g_error ("%s: element %" G_GINT64_FORMAT " of no output was written", L->name, i);
    }
}

/* sum_parts, column blocks and row blocks, stored or added, byte for byte
 * against the stated order: the last part first, then into dst. */
static void
test_sum_parts (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  guint pass;

  if (device == NULL)
    return;
  for (pass = 0; pass < 6; pass++)
    {
      gboolean columns = pass % 2 == 0, accumulate = pass / 2 == 1;
      guint n_parts = pass / 2 == 2 ? 6 : 3;
      gint64 rows = columns ? 67 : 9, cols = columns ? 24 : 130, dst_stride = cols + 3;
      gint64 src_stride = columns ? n_parts * cols : cols;
      gint64 n_src = columns ? rows * src_stride : n_parts * rows * cols, n_dst = rows * dst_stride;
      g_autofree float *src = g_new (float, n_src);
      g_autofree float *dst = g_new (float, n_dst);
      g_autofree float *got = NULL;
      g_autoptr(GmlpGroupedTensor) src_t = NULL, dst_t = NULL;
      g_autoptr(GError) error = NULL;
      GmlpBackendSumParts s = {
        .rows = rows,
        .cols = cols,
        .src_stride = src_stride,
        .n_parts = n_parts,
        .dst_stride = dst_stride,
        .accumulate = accumulate,
      };
      gint64 r, c, i;
      guint p;

      /* Parts of falling size, as a split's products are. */
      for (i = 0; i < n_src; i++)
        src[i] = (float) ldexp (gmlp_test_normal (1.0, GMLP_DTYPE_FLOAT32), -8 * (int) (i % n_parts));
      for (i = 0; i < n_dst; i++)
        dst[i] = (float) gmlp_test_normal (1.0, GMLP_DTYPE_FLOAT32);
      src[5] = INFINITY;
      for (p = 0; p < n_parts; p++)
        s.offset[p] = columns ? (gint64) p * cols : (gint64) p * rows * cols;
      src_t = upload (device, GMLP_DTYPE_FLOAT32, src, n_src);
      dst_t = upload (device, GMLP_DTYPE_FLOAT32, dst, n_dst);
      s.src = gmlp_grouped_tensor_get_data (src_t);
      s.dst = gmlp_grouped_tensor_get_data (dst_t);
      g_assert_true (GMLP_DEVICE_CALL (device, sum_parts, &s, &error));
      g_assert_no_error (error);
      got = download (dst_t, (gsize) n_dst * 4);

      for (r = 0; r < rows; r++)
        for (c = 0; c < dst_stride; c++)
          {
            volatile float want = dst[r * dst_stride + c];

            if (c < cols)
              {
                volatile float sum = src[s.offset[n_parts - 1] + r * src_stride + c];

                for (p = n_parts - 1; p > 0; p--)
                  sum = sum + src[s.offset[p - 1] + r * src_stride + c];
                want = accumulate ? want + sum : sum;
              }
            if (float_bits (got[r * dst_stride + c]) != float_bits (want))
              g_error ("sum_parts (%s, %s, %u parts) (%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                       "): %.9g, expected %.9g", columns ? "columns" : "rows",
                       accumulate ? "added" : "stored", n_parts, r, c, got[r * dst_stride + c], want);
          }
    }
}

/* Malformed descriptors: INVALID_ARGUMENT, and nothing written. */
static void
test_bad (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  float src[16] = { 1.0f };
  guint16 init[48];
  float init_f[16];
  g_autoptr(GmlpGroupedTensor) src_t = NULL, dst_t = NULL, dst_f = NULL;
  g_autofree guint16 *got = NULL;
  g_autofree float *got_f = NULL;
  guint i;

  if (device == NULL)
    return;
  for (i = 0; i < G_N_ELEMENTS (init); i++)
    init[i] = UNTOUCHED;
  for (i = 0; i < G_N_ELEMENTS (init_f); i++)
    init_f[i] = 7.0f;
  src_t = upload (device, GMLP_DTYPE_FLOAT32, src, 16);
  dst_t = upload (device, GMLP_DTYPE_BFLOAT16, init, 48);
  dst_f = upload (device, GMLP_DTYPE_FLOAT32, init_f, 16);

  for (i = 0; i < 7; i++)
    {
      g_autoptr(GError) error = NULL;
      GmlpBackendSplit s = {
        .rows = 4, .cols = 4,
        .src = gmlp_grouped_tensor_get_data (src_t), .src_stride = 4,
        .n_parts = 3,
        .dst = gmlp_grouped_tensor_get_data (dst_t), .dst_row_stride = 4, .dst_col_stride = 1,
        .n_outputs = 3, .part = { 0, 1, 2 }, .offset = { 0, 16, 32 },
      };

      switch (i)
        {
        case 0: s.n_parts = 0; break;
        case 1: s.n_parts = 4; break;
        case 2: s.n_outputs = 0; break;
        case 3: s.n_outputs = GMLP_BACKEND_MAX_SPLIT_OUTPUTS + 1; break;
        case 4: s.part[1] = 3; break;
        case 5: s.rows = -1; break;
        default: s.src_stride = 3; break;
        }
      g_assert_false (GMLP_DEVICE_CALL (device, split_bfloat16, &s, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
    }
  for (i = 0; i < 4; i++)
    {
      g_autoptr(GError) error = NULL;
      GmlpBackendSumParts s = {
        .rows = 2, .cols = 4,
        .src = gmlp_grouped_tensor_get_data (src_t), .src_stride = 4,
        .n_parts = 2, .offset = { 0, 8 },
        .dst = gmlp_grouped_tensor_get_data (dst_f), .dst_stride = 4,
      };

      switch (i)
        {
        case 0: s.n_parts = 0; break;
        case 1: s.n_parts = GMLP_BACKEND_MAX_SPLIT_OUTPUTS + 1; break;
        case 2: s.cols = -4; break;
        default: s.dst_stride = 2; break;
        }
      g_assert_false (GMLP_DEVICE_CALL (device, sum_parts, &s, &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
    }

  got = download (dst_t, sizeof init);
  g_assert_cmpmem (got, sizeof init, init, sizeof init);
  got_f = download (dst_f, sizeof init_f);
  g_assert_cmpmem (got_f, sizeof init_f, init_f, sizeof init_f);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/SplitParts/split", test_split);
  g_test_add_func ("/Gmlp/SplitParts/sum", test_sum_parts);
  g_test_add_func ("/Gmlp/SplitParts/bad", test_bad);

  return g_test_run ();
}
