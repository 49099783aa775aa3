/* gemm-case.c: one grouped product of gmlp-kernels.h and its float64 reference
 *
 * The layouts are those of gmlp-kernels.h above GmlpKernelDeviceGemm, as
 * libgmlp/backend/cuda/gmlp-cuda-gemm-device.c and the FP8 routes of
 * gmlp-grouped-linear-fp8.c fill it in:
 *
 *   row-grouped operands  member i at Σ_{j<i} gmlp_num_member_stride (m_j,
 *                         row bytes) from the base, allocated for the row
 *                         capacity (gmlp_num_device_sized_bytes());
 *   FP8 WGRAD's A and B   the columnwise copies of dy and x: member i
 *                         n × m_i (k × m_i) bytes at the rowwise offsets;
 *   FP8 DGRAD's weight    Wᵀ_i, k × n;
 *   per-group matrices    weights, wgrads, biases one after the other,
 *                         gmlp_num_member_stride() apart (the scattered
 *                         variant spaces the weights unevenly);
 *   per-tensor scales     one FP32 per group, 256 bytes apart;
 *   blockwise scales      FPROP, DGRAD: A's 1 × 128 blocks as a grouped
 *                         tensor of m_i × ceil (depth / 128) (row_block 1,
 *                         row_stride ceil (depth / 128), depth_stride 1),
 *                         B's 128 × 128 tiles of W_i, ceil (n / 128) ×
 *                         ceil (k / 128) a group (FPROP: 128, ceil (k /
 *                         128), 1; DGRAD, the tiles seen from Wᵀ: 128, 1,
 *                         ceil (k / 128)); WGRAD, the copies' scales,
 *                         ceil (m_i / 128) × n (× k for B) a group, grouped
 *                         by 128-row blocks (1, 1, n; 1, 1, k). With device
 *                         sizes the grouped ones go as a_scale_rows and
 *                         b_scale_rows, and their tables are NULL.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include "gemm-case.h"
#include "gmlp-quantize-numeric.h"

enum { kDepthBlock = 128, kPoison = 0xff };

static gboolean
is_fp8 (const GemmCase *c)
{
  return gmlp_num_dtype_is_fp8 (c->p.dtypes->ab_dtype);
}

static int
b_dtype_of (const GemmCase *c)
{
  return is_fp8 (c) ? c->p.dtypes->b_dtype : c->p.dtypes->ab_dtype;
}

gint64
gemm_case_out_cols (const GemmCase *c)
{
  return c->p.kind == GMLP_KERNEL_GEMM_FPROP ? c->n : c->k;
}

gint64
gemm_case_depth (const GemmCase *c)
{
  switch (c->p.kind)
    {
    case GMLP_KERNEL_GEMM_FPROP: return c->k;
    case GMLP_KERNEL_GEMM_DGRAD: return c->n;
    case GMLP_KERNEL_GEMM_WGRAD:
    default:                     return c->total_rows;
    }
}

/* Group i's size as it places the members (a negative one counts as 0). */
static gint64
rows_of (const GemmCase *c,
         guint           i)
{
  return MAX (c->rows[i], 0);
}

/* The rows of group i that the product computes: those that fit in the
 * capacity (docs/memory-layout.md: with rows of whole multiples of 256
 * bytes, min (m_i, max (0, capacity - Σ_{j<i} m_j))). */
static gint64
kept_of (const GemmCase *c,
         guint           i)
{
  return c->kept[i];
}

/* Group i's member offset in a grouped tensor of rows of row_bytes bytes,
 * whose rows are blocks of block of the product's rows. */
static guint64
member_offset (const GemmCase *c,
               guint           i,
               guint64         row_bytes,
               gint64          block)
{
  /* Worked out once a layout (the images' values are laid out one by one). */
  GemmCase *cache = (GemmCase *) c;
  gsize e;

  for (e = 0; e < G_N_ELEMENTS (cache->prefixes) && cache->prefixes[e].offsets != NULL; e++)
    if (cache->prefixes[e].row_bytes == row_bytes && cache->prefixes[e].block == block)
      return cache->prefixes[e].offsets[i];
  g_assert (e < G_N_ELEMENTS (cache->prefixes));
  cache->prefixes[e].row_bytes = row_bytes;
  cache->prefixes[e].block = block;
  cache->prefixes[e].offsets = g_new (guint64, c->n_groups + 1);
  cache->prefixes[e].offsets[0] = 0;
  for (guint j = 0; j < c->n_groups; j++)
    cache->prefixes[e].offsets[j + 1] = cache->prefixes[e].offsets[j] +
      gmlp_num_member_stride (gmlp_quant_blocks_along (rows_of (c, j), block), row_bytes);
  return cache->prefixes[e].offsets[i];
}

static void
buffer_alloc (GemmBuffer *b,
              gsize       bytes)
{
  b->bytes = MAX (bytes, 256);
  b->host = g_aligned_alloc (1, b->bytes + GEMM_GUARD_BYTES, 256);
  memset (b->host, kPoison, b->bytes + GEMM_GUARD_BYTES);
}

static void
buffer_clear (GemmBuffer *b)
{
  if (b->device != NULL)
    cudaFree (b->device);
  g_aligned_free (b->host);
  memset (b, 0, sizeof *b);
}

/* The bytes of a grouped tensor of row_bytes rows, allocated for the
 * product's capacity in blocks of block rows. */
static gsize
grouped_bytes (const GemmCase *c,
               guint64         row_bytes,
               gint64          block)
{
  return gmlp_num_device_sized_bytes (c->n_groups,
                                      gmlp_quant_blocked_capacity (c->capacity, c->n_groups, block),
                                      row_bytes);
}

/* Where the product reads A's value (group i, row r, depth d) and B's
 * (group i, row j of B seen K-major, depth d), as byte offsets into the
 * images, and their scales (the tables' members, read through the layout
 * of GmlpKernelFp8Scales). */
static guint64
a_at (const GemmCase *c,
      guint           i,
      gint64          r,
      gint64          d)
{
  guint64 size = gmlp_num_dtype_size (c->p.dtypes->ab_dtype);

  switch (c->p.kind)
    {
    case GMLP_KERNEL_GEMM_FPROP:
      return member_offset (c, i, c->k * size, 1) + (r * c->k + d) * size;
    case GMLP_KERNEL_GEMM_DGRAD:
      return member_offset (c, i, c->n * size, 1) + (r * c->n + d) * size;
    case GMLP_KERNEL_GEMM_WGRAD:
    default:
      /* r: dy's column (0 .. n), d: the token. */
      if (is_fp8 (c))
        return member_offset (c, i, c->n, 1) + r * rows_of (c, i) + d;
      return member_offset (c, i, c->n * size, 1) + (d * c->n + r) * size;
    }
}

static guint64
b_at (const GemmCase *c,
      guint           i,
      gint64          j,
      gint64          d)
{
  guint64 size = gmlp_num_dtype_size (b_dtype_of (c));

  switch (c->p.kind)
    {
    case GMLP_KERNEL_GEMM_FPROP:
      /* j: the output column, d: the input feature; W_i is n × k. */
      return c->weight_offset[i] + (j * c->k + d) * size;
    case GMLP_KERNEL_GEMM_DGRAD:
      /* j: the output column (0 .. k), d: 0 .. n. 16-bit: W_i (n × k);
       * FP8: Wᵀ_i (k × n), K-major. */
      if (is_fp8 (c))
        return c->weight_offset[i] + (j * c->n + d) * size;
      return c->weight_offset[i] + (d * c->k + j) * size;
    case GMLP_KERNEL_GEMM_WGRAD:
    default:
      /* j: x's column (0 .. k), d: the token. */
      if (is_fp8 (c))
        return member_offset (c, i, c->k, 1) + j * rows_of (c, i) + d;
      return member_offset (c, i, c->k * size, 1) + (d * c->k + j) * size;
    }
}

static guint64
a_scale_member (const GemmCase *c,
                guint           i)
{
  gint64 cols;

  if (!c->p.dtypes->blockwise)
    return 256 * (guint64) i;
  if (c->p.kind == GMLP_KERNEL_GEMM_WGRAD)
    return member_offset (c, i, c->n * sizeof (float), kDepthBlock);
  cols = gmlp_quant_blocks_along (gemm_case_depth (c), kDepthBlock);
  return member_offset (c, i, cols * sizeof (float), 1);
}

static guint64
b_scale_member (const GemmCase *c,
                guint           i)
{
  gint64 tiles_n = gmlp_quant_blocks_along (c->n, kDepthBlock);
  gint64 tiles_k = gmlp_quant_blocks_along (c->k, kDepthBlock);

  if (!c->p.dtypes->blockwise)
    return 256 * (guint64) i;
  if (c->p.kind == GMLP_KERNEL_GEMM_WGRAD)
    return member_offset (c, i, c->k * sizeof (float), kDepthBlock);
  return i * gmlp_num_member_stride (tiles_n, tiles_k * sizeof (float));
}

/* The layout's scale of row r, depth d in a group's scales (as
 * gmlp_backend_fp8_scale_at()); the index, or 0 for per-tensor. */
static guint64
scale_index (const GmlpKernelFp8Scales *s,
             gint64                     r,
             gint64                     d)
{
  if (s->row_block == 0)
    return 0;
  return (r / s->row_block) * s->row_stride + (d / kDepthBlock) * s->depth_stride;
}

static double
a_value (const GemmCase *c,
         guint           i,
         gint64          r,
         gint64          d)
{
  double v = gmlp_num_load_float (c->a.host + a_at (c, i, r, d), c->p.dtypes->ab_dtype, 0);

  if (is_fp8 (c))
    v *= ((const float *) (c->a_scales.host + a_scale_member (c, i)))[scale_index (&c->a_layout, r, d)];
  return v;
}

static double
b_value (const GemmCase *c,
         guint           i,
         gint64          j,
         gint64          d)
{
  const guint8 *image = c->p.kind == GMLP_KERNEL_GEMM_WGRAD ? c->b_rows.host : c->weight.host;
  double v = gmlp_num_load_float (image + b_at (c, i, j, d), b_dtype_of (c), 0);

  if (is_fp8 (c))
    v *= ((const float *) (c->b_scales.host + b_scale_member (c, i)))[scale_index (&c->b_layout, j, d)];
  return v;
}

/* Where output value (group i, row r, column j) lies in the output's image. */
static guint64
out_at (const GemmCase *c,
        guint           i,
        gint64          r,
        gint64          j)
{
  guint64 size = gmlp_num_dtype_size (c->p.dtypes->c_dtype);
  gint64 cols = gemm_case_out_cols (c);

  if (c->p.kind == GMLP_KERNEL_GEMM_WGRAD)
    return c->wgrad_offset[i] + (r * c->k + j) * size;
  return member_offset (c, i, cols * size, 1) + (r * cols + j) * size;
}

/* The index of output value (group i, row r, column j) in want. */
static gsize
want_at (const GemmCase *c,
         guint           i,
         gint64          r,
         gint64          j)
{
  if (c->p.kind == GMLP_KERNEL_GEMM_WGRAD)
    return ((gsize) i * c->n + r) * c->k + j;
  return (gsize) (c->first_row[i] + r) * gemm_case_out_cols (c) + j;
}

static void
fill_scales (GemmBuffer *b,
             GRand      *rand)
{
  float *f = (float *) b->host;

  for (gsize i = 0; i < b->bytes / sizeof (float); i++)
    f[i] = (float) g_rand_double_range (rand, 0.25, 4.0);
}

static void
layouts (GemmCase *c)
{
  const gint64 tiles_k = gmlp_quant_blocks_along (c->k, kDepthBlock);
  const gint64 depth_blocks = gmlp_quant_blocks_along (gemm_case_depth (c), kDepthBlock);

  memset (&c->a_layout, 0, sizeof c->a_layout);
  memset (&c->b_layout, 0, sizeof c->b_layout);
  if (!is_fp8 (c) || !c->p.dtypes->blockwise)
    return;
  switch (c->p.kind)
    {
    case GMLP_KERNEL_GEMM_FPROP:
      c->a_layout = (GmlpKernelFp8Scales) { 1, depth_blocks, 1 };
      c->b_layout = (GmlpKernelFp8Scales) { 128, tiles_k, 1 };
      break;
    case GMLP_KERNEL_GEMM_DGRAD:
      c->a_layout = (GmlpKernelFp8Scales) { 1, depth_blocks, 1 };
      c->b_layout = (GmlpKernelFp8Scales) { 128, 1, tiles_k };
      break;
    case GMLP_KERNEL_GEMM_WGRAD:
    default:
      c->a_layout = (GmlpKernelFp8Scales) { 1, 1, c->n };
      c->b_layout = (GmlpKernelFp8Scales) { 1, 1, c->k };
      break;
    }
}

GemmCase *
gemm_case_new (const GemmProblem *p,
               guint32            seed,
               gboolean           with_values)
{
  GemmCase *c = g_new0 (GemmCase, 1);
  g_autoptr(GRand) rand = g_rand_new_with_seed (seed);
  const gboolean wgrad = p->kind == GMLP_KERNEL_GEMM_WGRAD;
  const gboolean fp8 = gmlp_num_dtype_is_fp8 (p->dtypes->ab_dtype);
  const int c_dtype = p->dtypes->c_dtype;
  const guint64 a_size = gmlp_num_dtype_size (p->dtypes->ab_dtype);
  const guint64 c_size = gmlp_num_dtype_size (c_dtype);
  guint64 b_size, w_stride, gap = 0;
  gint64 a_cols, w_rows, w_cols, depth, out_cols, row, placed = 0;
  guint ng;

  c->p = *p;
  c->n_groups = ng = p->shape->n_groups;
  c->n = p->shape->n;
  c->k = p->shape->k;
  b_size = gmlp_num_dtype_size (b_dtype_of (c));
  c->rows = g_new0 (gint64, ng);
  c->first_row = g_new0 (gint64, ng);
  c->kept = g_new0 (gint64, ng);
  for (guint i = 0; i < ng; i++)
    {
      c->rows[i] = p->shape->rows != NULL ? p->shape->rows[i] :
                   g_rand_int_range (rand, 0, (gint32) p->shape->max_random + 1);
      c->capacity += rows_of (c, i);
    }
  /* Device sizes: room for more rows than the groups take, or (cut) fewer. */
  c->capacity += p->shape->cut > 0 ? -p->shape->cut : p->device_rows ? 37 : 0;
  for (guint i = 0; i < ng; i++)
    {
      c->kept[i] = MIN (rows_of (c, i), MAX (0, c->capacity - placed));
      placed += rows_of (c, i);
      c->first_row[i] = c->total_rows;
      c->total_rows += kept_of (c, i);
    }
  layouts (c);
  depth = gemm_case_depth (c);
  out_cols = gemm_case_out_cols (c);
  a_cols = p->kind == GMLP_KERNEL_GEMM_FPROP ? c->k : c->n;

  /* A, and WGRAD's B (the same bytes rowwise or as copies). */
  buffer_alloc (&c->a, grouped_bytes (c, a_cols * a_size, 1));
  if (wgrad)
    buffer_alloc (&c->b_rows, grouped_bytes (c, c->k * b_size, 1));

  /* The per-group matrices. */
  w_rows = fp8 && p->kind == GMLP_KERNEL_GEMM_DGRAD ? c->k : c->n;
  w_cols = fp8 && p->kind == GMLP_KERNEL_GEMM_DGRAD ? c->n : c->k;
  if (!wgrad)
    {
      w_stride = gmlp_num_member_stride (w_rows, w_cols * b_size);
      c->weight_offset = g_new0 (guint64, ng);
      for (guint i = 0; i < ng; i++)
        {
          c->weight_offset[i] = i * w_stride + gap;
          /* Uneven gaps, so that no stride fits every pointer. */
          if (p->variant == GEMM_VARIANT_SCATTERED)
            gap += 256 * (i % 3 + 1);
        }
      buffer_alloc (&c->weight, ng * w_stride + gap);
      buffer_alloc (&c->c_rows, grouped_bytes (c, out_cols * c_size, 1));
    }
  else
    {
      guint64 stride = gmlp_num_member_stride (c->n, c->k * c_size);

      c->wgrad_offset = g_new0 (guint64, ng);
      for (guint i = 0; i < ng; i++)
        c->wgrad_offset[i] = i * stride;
      buffer_alloc (&c->wgrad, ng * stride);
    }
  if (p->variant == GEMM_VARIANT_BIAS && p->kind == GMLP_KERNEL_GEMM_FPROP)
    {
      guint64 stride = gmlp_num_member_stride (1, c->n * c_size);

      c->bias_offset = g_new0 (guint64, ng);
      for (guint i = 0; i < ng; i++)
        c->bias_offset[i] = i * stride;
      buffer_alloc (&c->bias, ng * stride);
    }

  /* The scales. */
  if (fp8 && !p->dtypes->blockwise)
    {
      buffer_alloc (&c->a_scales, 256 * (gsize) ng);
      buffer_alloc (&c->b_scales, 256 * (gsize) ng);
    }
  else if (fp8 && wgrad)
    {
      buffer_alloc (&c->a_scales, grouped_bytes (c, c->n * sizeof (float), kDepthBlock));
      buffer_alloc (&c->b_scales, grouped_bytes (c, c->k * sizeof (float), kDepthBlock));
    }
  else if (fp8)
    {
      gint64 tiles_n = gmlp_quant_blocks_along (c->n, kDepthBlock);
      gint64 tiles_k = gmlp_quant_blocks_along (c->k, kDepthBlock);

      buffer_alloc (&c->a_scales,
                    grouped_bytes (c, gmlp_quant_blocks_along (depth, kDepthBlock) * sizeof (float), 1));
      buffer_alloc (&c->b_scales, ng * gmlp_num_member_stride (tiles_n, tiles_k * sizeof (float)));
    }
  if (fp8)
    {
      fill_scales (&c->a_scales, rand);
      fill_scales (&c->b_scales, rand);
    }

  /* The device sizes, as the kernel reads them. */
  buffer_alloc (&c->device_rows, ng * sizeof (gint64));
  memcpy (c->device_rows.host, c->rows, ng * sizeof (gint64));
  if (!with_values)
    return c;

  /* The values, stored through the layouts, and read back as the product
   * sees them. a_values: the rows of A (WGRAD: dy's rows); b_values: W_i
   * n × k (WGRAD: x's rows). */
  c->a_values = g_new (double, MAX (c->total_rows * a_cols, 1));
  for (guint i = 0; i < ng; i++)
    for (row = 0; row < kept_of (c, i); row++)
      for (gint64 d = 0; d < a_cols; d++)
        {
          float v = (float) g_rand_double_range (rand, -1.0, 1.0);

          if (wgrad)
            {
              gmlp_num_store_float (c->a.host + a_at (c, i, d, row), p->dtypes->ab_dtype, 0, v);
              c->a_values[(c->first_row[i] + row) * a_cols + d] = a_value (c, i, d, row);
            }
          else
            {
              gmlp_num_store_float (c->a.host + a_at (c, i, row, d), p->dtypes->ab_dtype, 0, v);
              c->a_values[(c->first_row[i] + row) * a_cols + d] = a_value (c, i, row, d);
            }
        }
  if (wgrad)
    {
      c->b_values = g_new (double, MAX (c->total_rows * c->k, 1));
      for (guint i = 0; i < ng; i++)
        for (row = 0; row < kept_of (c, i); row++)
          for (gint64 j = 0; j < c->k; j++)
            {
              gmlp_num_store_float (c->b_rows.host + b_at (c, i, j, row), b_dtype_of (c), 0,
                                    (float) g_rand_double_range (rand, -1.0, 1.0));
              c->b_values[(c->first_row[i] + row) * c->k + j] = b_value (c, i, j, row);
            }
    }
  else
    {
      c->b_values = g_new (double, (gsize) ng * c->n * c->k);
      for (guint i = 0; i < ng; i++)
        for (gint64 o = 0; o < c->n; o++)
          for (gint64 f = 0; f < c->k; f++)
            {
              /* FPROP: B's row o, depth f; DGRAD: B's row f, depth o. */
              gboolean fprop = p->kind == GMLP_KERNEL_GEMM_FPROP;
              guint64 at = fprop ? b_at (c, i, o, f) : b_at (c, i, f, o);

              gmlp_num_store_float (c->weight.host + at, b_dtype_of (c), 0,
                                    (float) g_rand_double_range (rand, -1.0, 1.0));
              c->b_values[((gsize) i * c->n + o) * c->k + f] = fprop ? b_value (c, i, o, f) : b_value (c, i, f, o);
            }
    }
  if (c->bias.host != NULL)
    {
      c->bias_values = g_new (double, (gsize) ng * c->n);
      for (guint i = 0; i < ng; i++)
        for (gint64 j = 0; j < c->n; j++)
          {
            guint8 *at = c->bias.host + c->bias_offset[i] + j * c_size;

            gmlp_num_store_float (at, c_dtype, 0, (float) g_rand_double_range (rand, -1.0, 1.0));
            c->bias_values[(gsize) i * c->n + j] = gmlp_num_load_float (at, c_dtype, 0);
          }
    }

  /* The outputs' starting image: poison, and the accumulated groups'
   * priors. */
  if (wgrad && p->variant == GEMM_VARIANT_ACCUMULATE)
    {
      c->accumulate = g_new0 (guint8, ng);
      c->prior = g_new0 (double, (gsize) ng * c->n * c->k);
      for (guint i = 0; i < ng; i++)
        {
          c->accumulate[i] = i % 2 == 0;
          if (!c->accumulate[i])
            continue;
          for (gint64 j = 0; j < c->n * c->k; j++)
            {
              guint8 *at = c->wgrad.host + c->wgrad_offset[i] + j * c_size;

              gmlp_num_store_float (at, c_dtype, 0, (float) g_rand_double_range (rand, -4.0, 4.0));
              c->prior[(gsize) i * c->n * c->k + j] = gmlp_num_load_float (at, c_dtype, 0);
            }
        }
    }
  {
    const GemmBuffer *out = wgrad ? &c->wgrad : &c->c_rows;

    c->c_start = g_memdup2 (out->host, out->bytes + GEMM_GUARD_BYTES);
  }
  return c;
}

void
gemm_case_reference (GemmCase *c)
{
  const gint64 out_cols = gemm_case_out_cols (c);
  const gboolean wgrad = c->p.kind == GMLP_KERNEL_GEMM_WGRAD;
  gsize n_want = wgrad ? (gsize) c->n_groups * c->n * c->k : (gsize) c->total_rows * out_cols;

  g_free (c->want);
  c->want = g_new0 (double, MAX (n_want, 1));
  for (guint i = 0; i < c->n_groups; i++)
    {
      const gint64 m = kept_of (c, i), r0 = c->first_row[i];
      const double *w = c->b_values + (gsize) i * c->n * c->k;

      switch (c->p.kind)
        {
        case GMLP_KERNEL_GEMM_FPROP:
          for (gint64 r = 0; r < m; r++)
            for (gint64 j = 0; j < c->n; j++)
              {
                const double *x = c->a_values + (r0 + r) * c->k, *wj = w + j * c->k;
                double s = c->bias_values != NULL ? c->bias_values[(gsize) i * c->n + j] : 0.0;

                for (gint64 d = 0; d < c->k; d++)
                  s += x[d] * wj[d];
                c->want[want_at (c, i, r, j)] = s;
              }
          break;
        case GMLP_KERNEL_GEMM_DGRAD:
          for (gint64 r = 0; r < m; r++)
            {
              const double *dy = c->a_values + (r0 + r) * c->n;
              double *out = c->want + want_at (c, i, r, 0);

              for (gint64 o = 0; o < c->n; o++)
                for (gint64 j = 0; j < c->k; j++)
                  out[j] += dy[o] * w[o * c->k + j];
            }
          break;
        case GMLP_KERNEL_GEMM_WGRAD:
        default:
          {
            double *out = c->want + want_at (c, i, 0, 0);

            if (c->accumulate != NULL && c->accumulate[i])
              memcpy (out, c->prior + (gsize) i * c->n * c->k, c->n * c->k * sizeof (double));
            for (gint64 r = 0; r < m; r++)
              {
                const double *dy = c->a_values + (r0 + r) * c->n, *x = c->b_values + (r0 + r) * c->k;

                for (gint64 o = 0; o < c->n; o++)
                  for (gint64 j = 0; j < c->k; j++)
                    out[o * c->k + j] += dy[o] * x[j];
              }
          }
          break;
        }
    }
}

double *
gemm_case_naive (const GemmCase *c)
{
  const gint64 out_cols = gemm_case_out_cols (c);
  const gboolean wgrad = c->p.kind == GMLP_KERNEL_GEMM_WGRAD;
  const int c_dtype = c->p.dtypes->c_dtype;
  gsize n_want = wgrad ? (gsize) c->n_groups * c->n * c->k : (gsize) c->total_rows * out_cols;
  double *want = g_new0 (double, MAX (n_want, 1));

  for (guint i = 0; i < c->n_groups; i++)
    for (gint64 r = 0; r < (wgrad ? c->n : kept_of (c, i)); r++)
      for (gint64 j = 0; j < out_cols; j++)
        {
          double s = 0.0;

          if (c->bias.host != NULL)
            s = gmlp_num_load_float (c->bias.host + c->bias_offset[i], c_dtype, j);
          if (c->accumulate != NULL && c->accumulate[i])
            s = gmlp_num_load_float (c->c_start + out_at (c, i, r, j), c_dtype, 0);
          if (wgrad)
            for (gint64 t = 0; t < kept_of (c, i); t++)
              s += a_value (c, i, r, t) * b_value (c, i, j, t);
          else
            for (gint64 d = 0; d < gemm_case_depth (c); d++)
              s += a_value (c, i, r, d) * b_value (c, i, j, d);
          want[want_at (c, i, r, j)] = s;
        }
  return want;
}

gboolean
gemm_case_images_fit (const GemmCase *c)
{
  const GemmBuffer *all[] = { &c->a, &c->b_rows, &c->c_rows, &c->weight, &c->wgrad, &c->bias,
                              &c->a_scales, &c->b_scales, &c->device_rows };

  for (gsize i = 0; i < G_N_ELEMENTS (all); i++)
    for (gsize b = all[i]->bytes; all[i]->host != NULL && b < all[i]->bytes + GEMM_GUARD_BYTES; b++)
      if (all[i]->host[b] != kPoison)
        return FALSE;
  return TRUE;
}

static void *
base_of (const GemmBuffer *b,
         gboolean          on_device)
{
  if (b->host == NULL)
    return NULL;
  return on_device ? b->device : b->host;
}

void
gemm_case_describe (GemmCase *c,
                    gboolean  on_device)
{
  const GemmProblem *p = &c->p;
  const gboolean wgrad = p->kind == GMLP_KERNEL_GEMM_WGRAD, fp8 = is_fp8 (c);
  /* With device sizes the blockwise scales that follow them go grouped. */
  const gboolean grouped_a = fp8 && p->dtypes->blockwise && p->device_rows;
  const gboolean grouped_b = grouped_a && wgrad;
  guint8 *weight = base_of (&c->weight, on_device), *wg = base_of (&c->wgrad, on_device);
  guint8 *bias = base_of (&c->bias, on_device);
  guint8 *a_scales = base_of (&c->a_scales, on_device), *b_scales = base_of (&c->b_scales, on_device);
  const guint ng = c->n_groups;

  g_clear_pointer (&c->weight_table, g_free);
  g_clear_pointer (&c->wgrad_table, g_free);
  g_clear_pointer (&c->bias_table, g_free);
  g_clear_pointer (&c->a_scale_table, g_free);
  g_clear_pointer (&c->b_scale_table, g_free);
  if (!wgrad)
    {
      c->weight_table = g_new (const void *, ng);
      for (guint i = 0; i < ng; i++)
        c->weight_table[i] = weight + c->weight_offset[i];
    }
  else
    {
      c->wgrad_table = g_new (void *, ng);
      for (guint i = 0; i < ng; i++)
        c->wgrad_table[i] = wg + c->wgrad_offset[i];
    }
  if (bias != NULL)
    {
      c->bias_table = g_new (const void *, ng);
      for (guint i = 0; i < ng; i++)
        c->bias_table[i] = bias + c->bias_offset[i];
    }
  if (fp8 && !grouped_a)
    {
      c->a_scale_table = g_new (const float *, ng);
      for (guint i = 0; i < ng; i++)
        c->a_scale_table[i] = (const float *) (a_scales + a_scale_member (c, i));
    }
  if (fp8 && !grouped_b)
    {
      c->b_scale_table = g_new (const float *, ng);
      for (guint i = 0; i < ng; i++)
        c->b_scale_table[i] = (const float *) (b_scales + b_scale_member (c, i));
    }

  c->gemm = (GmlpKernelDeviceGemm) {
    .kind = p->kind,
    .n_groups = ng,
    .device_rows = p->device_rows ? base_of (&c->device_rows, on_device) : NULL,
    .host_rows = p->device_rows ? NULL : c->rows,
    .row_capacity = c->capacity,
    .n = c->n,
    .k = c->k,
    .ab_dtype = p->dtypes->ab_dtype,
    .c_dtype = p->dtypes->c_dtype,
    .a = base_of (&c->a, on_device),
    .b_rows = wgrad ? base_of (&c->b_rows, on_device) : NULL,
    .c_rows = wgrad ? NULL : base_of (&c->c_rows, on_device),
    .weight = c->weight_table,
    .wgrad = c->wgrad_table,
    .bias = c->bias_table,
    .accumulate = c->accumulate,
    .b_dtype = fp8 ? p->dtypes->b_dtype : 0,
    .a_scale_inv = c->a_scale_table,
    .b_scale_inv = c->b_scale_table,
    .a_scales = c->a_layout,
    .b_scales = c->b_layout,
    .a_scale_rows = grouped_a ? (const float *) a_scales : NULL,
    .b_scale_rows = grouped_b ? (const float *) b_scales : NULL,
  };
}

static gboolean
cuda_ok (cudaError_t  err,
         const char  *what,
         GError     **error)
{
  if (err == cudaSuccess)
    return TRUE;
  g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_FAILED, "%s: %s", what, cudaGetErrorString (err));
  return FALSE;
}

static gboolean
buffer_upload (GemmBuffer  *b,
               GError     **error)
{
  if (b->host == NULL)
    return TRUE;
  return cuda_ok (cudaMalloc (&b->device, b->bytes + GEMM_GUARD_BYTES), "cudaMalloc", error) &&
         cuda_ok (cudaMemcpy (b->device, b->host, b->bytes + GEMM_GUARD_BYTES, cudaMemcpyHostToDevice),
                  "cudaMemcpy", error);
}

gboolean
gemm_case_upload (GemmCase  *c,
                  GError   **error)
{
  GemmBuffer *all[] = { &c->a, &c->b_rows, &c->c_rows, &c->weight, &c->wgrad, &c->bias,
                        &c->a_scales, &c->b_scales, &c->device_rows };

  for (gsize i = 0; i < G_N_ELEMENTS (all); i++)
    if (!buffer_upload (all[i], error))
      return FALSE;
  gemm_case_describe (c, TRUE);
  return TRUE;
}

gboolean
gemm_case_reset (GemmCase      *c,
                 cudaStream_t   stream,
                 GError       **error)
{
  const GemmBuffer *out = c->p.kind == GMLP_KERNEL_GEMM_WGRAD ? &c->wgrad : &c->c_rows;

  return cuda_ok (cudaMemcpyAsync (out->device, c->c_start, out->bytes + GEMM_GUARD_BYTES,
                                   cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync", error) &&
         cuda_ok (cudaStreamSynchronize (stream), "cudaStreamSynchronize", error);
}

gboolean
gemm_close (const double  *got,
            const double  *want,
            gsize          n,
            double         tol,
            char         **message)
{
  double diff = 0.0, norm = 0.0, rms, worst = 0.0;
  gsize off = 0, first = 0, at = 0;

  for (gsize i = 0; i < n; i++)
    {
      if (!isfinite (got[i]))
        {
          *message = g_strdup_printf ("[%" G_GSIZE_FORMAT "] is %g (unwritten or overflowed)", i, got[i]);
          return FALSE;
        }
      diff += (got[i] - want[i]) * (got[i] - want[i]);
      norm += want[i] * want[i];
    }
  if (norm == 0.0)
    {
      for (gsize i = 0; i < n; i++)
        if (got[i] != 0.0)
          {
            *message = g_strdup_printf ("[%" G_GSIZE_FORMAT "] is %g where it must be 0", i, got[i]);
            return FALSE;
          }
      return TRUE;
    }
  if (sqrt (diff) <= tol * sqrt (norm))
    return TRUE;
  rms = sqrt (norm / n);
  for (gsize i = 0; i < n; i++)
    {
      double d = fabs (got[i] - want[i]);

      if (d > tol * rms && off++ == 0)
        first = i;
      if (d > worst)
        {
          worst = d;
          at = i;
        }
    }
  *message = g_strdup_printf ("relative error %.3g over tolerance %.3g: %" G_GSIZE_FORMAT " of %"
                              G_GSIZE_FORMAT " values off, the first [%" G_GSIZE_FORMAT "] %g "
                              "(want %g), the worst [%" G_GSIZE_FORMAT "] %g (want %g)",
                              sqrt (diff / norm), tol, off, n, first, got[first], want[first],
                              at, got[at], want[at]);
  return FALSE;
}

gboolean
gemm_case_check (GemmCase  *c,
                 double     tol,
                 char     **message)
{
  const gboolean wgrad = c->p.kind == GMLP_KERNEL_GEMM_WGRAD;
  const GemmBuffer *out = wgrad ? &c->wgrad : &c->c_rows;
  const gint64 out_cols = gemm_case_out_cols (c);
  const int c_dtype = c->p.dtypes->c_dtype;
  g_autofree guint8 *image = g_malloc (out->bytes + GEMM_GUARD_BYTES);
  cudaError_t err;

  err = cudaMemcpy (image, out->device, out->bytes + GEMM_GUARD_BYTES, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess)
    {
      *message = g_strdup_printf ("cudaMemcpy: %s", cudaGetErrorString (err));
      return FALSE;
    }
  for (gsize i = out->bytes; i < out->bytes + GEMM_GUARD_BYTES; i++)
    if (image[i] != kPoison)
      {
        *message = g_strdup_printf ("written past the output's allocation, at byte %" G_GSIZE_FORMAT
                                    " of %" G_GSIZE_FORMAT, i, out->bytes);
        return FALSE;
      }
  for (guint i = 0; i < c->n_groups; i++)
    {
      const gint64 rows = wgrad ? c->n : kept_of (c, i);
      g_autofree double *got = g_new (double, MAX (rows * out_cols, 1));
      g_autofree char *why = NULL;

      if (rows == 0)
        continue;
      for (gint64 r = 0; r < rows; r++)
        for (gint64 j = 0; j < out_cols; j++)
          got[r * out_cols + j] = gmlp_num_load_float (image + out_at (c, i, r, j), c_dtype, 0);
      if (!gemm_close (got, c->want + want_at (c, i, 0, 0), rows * out_cols, tol, &why))
        {
          *message = g_strdup_printf ("group %u (%" G_GINT64_FORMAT " rows): %s", i, c->rows[i], why);
          return FALSE;
        }
    }
  return TRUE;
}

/* The library tests' tolerances by output dtype (gmlp_test_tolerance()),
 * with FP8 operands' 5e-4 (Hopper's FP8 tensor cores keep about 14
 * significant bits in the partial sums they promote to FP32), and a
 * little more for FP32 outputs of deep reductions. */
double
gemm_case_tolerance (const GemmCase *c)
{
  double tol;

  switch (c->p.dtypes->c_dtype)
    {
    case GMLP_NUM_FLOAT16:  tol = 2e-3; break;
    case GMLP_NUM_BFLOAT16: tol = 1e-2; break;
    case GMLP_NUM_FLOAT32:
    default:                tol = 2e-5; break;
    }
  if (is_fp8 (c))
    tol = MAX (tol, 5e-4);
  return tol * MAX (1.0, sqrt ((double) gemm_case_depth (c) / 4096.0));
}

char *
gemm_problem_name (const GemmProblem *p)
{
  static const char *kinds[] = { "fprop", "dgrad", "wgrad" };
  static const char *variants[] = { "", "-bias", "-accumulate", "-scattered" };

  return g_strdup_printf ("%s/%s/%s-%s%s", kinds[p->kind], p->dtypes->name, p->shape->name,
                          p->device_rows ? "device" : "host", variants[p->variant]);
}

void
gemm_case_free (GemmCase *c)
{
  if (c == NULL)
    return;
  buffer_clear (&c->a);
  buffer_clear (&c->b_rows);
  buffer_clear (&c->c_rows);
  buffer_clear (&c->weight);
  buffer_clear (&c->wgrad);
  buffer_clear (&c->bias);
  buffer_clear (&c->a_scales);
  buffer_clear (&c->b_scales);
  buffer_clear (&c->device_rows);
  for (gsize e = 0; e < G_N_ELEMENTS (c->prefixes); e++)
    g_free (c->prefixes[e].offsets);
  g_free (c->rows);
  g_free (c->kept);
  g_free (c->first_row);
  g_free (c->c_start);
  g_free (c->weight_offset);
  g_free (c->wgrad_offset);
  g_free (c->bias_offset);
  g_free (c->accumulate);
  g_free (c->a_values);
  g_free (c->b_values);
  g_free (c->bias_values);
  g_free (c->prior);
  g_free (c->want);
  g_free (c->weight_table);
  g_free (c->wgrad_table);
  g_free (c->bias_table);
  g_free (c->a_scale_table);
  g_free (c->b_scale_table);
  g_free (c);
}

gboolean
gemm_cuda_device (int *major,
                  int *minor,
                  int *n_sms)
{
  int count = 0;

  if (cudaGetDeviceCount (&count) != cudaSuccess || count == 0 ||
      cudaSetDevice (0) != cudaSuccess ||
      cudaDeviceGetAttribute (major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute (minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute (n_sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess)
    {
      (void) cudaGetLastError ();
      return FALSE;
    }
  return TRUE;
}
