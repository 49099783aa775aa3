/* gmlp-cpu-backend.c: the reference backend
 *
 * Plain C on the host. Device memory is host memory; the stream is the
 * calling thread, so every call completes before it returns.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "backend/gmlp-backend.h"
#include "backend/gmlp-backend-gemm.h"
#include "backend/cpu/gmlp-cpu-quantize.h"
#include "backend/cpu/gmlp-cpu-gemm-fp8.h"
#include "backend/cpu/gmlp-cpu-activation-quantize.h"
#include "backend/cpu/gmlp-cpu-permute.h"
#include "backend/cpu/gmlp-cpu-row-chunks.h"
#include "backend/cpu/gmlp-cpu-router.h"
#include "backend/cpu/gmlp-cpu-comm.h"
#include "gmlp-activation-numeric.h"
#include "gmlp-error.h"
#include "gmlp-numeric.h"

struct _GmlpBackendDevice
{
  int ordinal;
};

/* Work on the CPU is done when the call returns: events are born complete,
 * and the time they were made is when the work before them ended. */
struct _GmlpBackendEvent
{
  gint64 time_us;
};

static int
cpu_get_device_count (void)
{
  return 1;
}

static GmlpBackendDevice *
cpu_open_device (int      ordinal,
                 GError **error)
{
  GmlpBackendDevice *device = g_new0 (GmlpBackendDevice, 1);

  device->ordinal = ordinal;
  return device;
}

static void
cpu_close_device (GmlpBackendDevice *device)
{
  g_free (device);
}

static char *
cpu_get_device_name (GmlpBackendDevice *device)
{
  if (device->ordinal == 0)
    return g_strdup ("cpu");
  return g_strdup_printf ("cpu:%d", device->ordinal);
}

static gpointer
cpu_alloc (GmlpBackendDevice  *device,
           gsize               nbytes,
           GError            **error)
{
  gsize rounded = (MAX (nbytes, 1) + kGmlpMemberAlignment - 1) & ~(gsize) (kGmlpMemberAlignment - 1);
  gpointer ptr = NULL;

  if (rounded < nbytes || posix_memalign (&ptr, kGmlpMemberAlignment, rounded) != 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_OUT_OF_MEMORY,
                   "Out of host memory allocating %" G_GSIZE_FORMAT " bytes", nbytes);
      return NULL;
    }
  return ptr;
}

static void
cpu_free (GmlpBackendDevice *device,
          gpointer           ptr)
{
  free (ptr);
}

static gboolean
cpu_copy (GmlpBackendDevice  *device,
          gpointer            dst,
          gconstpointer       src,
          gsize               nbytes,
          GError            **error)
{
  if (nbytes > 0)
    memmove (dst, src, nbytes);
  return TRUE;
}

static gboolean
cpu_fill_bytes (GmlpBackendDevice  *device,
                gpointer            dst,
                int                 value,
                gsize               nbytes,
                GError            **error)
{
  if (nbytes > 0)
    memset (dst, value, nbytes);
  return TRUE;
}

static gboolean
cpu_synchronize (GmlpBackendDevice  *device,
                 GError            **error)
{
  return TRUE;
}

static void
convert_elements (const guint8 *src,
                  int           src_dtype,
                  guint8       *dst,
                  int           dst_dtype,
                  guint64       n)
{
  guint64 i;

  if (src_dtype == dst_dtype)
    {
      memcpy (dst, src, n * gmlp_num_dtype_size (src_dtype));
    }
  else if (src_dtype == GMLP_NUM_INT32 && dst_dtype == GMLP_NUM_INT64)
    {
      for (i = 0; i < n; i++)
        ((gint64 *) dst)[i] = ((const gint32 *) src)[i];
    }
  else if (src_dtype == GMLP_NUM_INT64 && dst_dtype == GMLP_NUM_INT32)
    {
      for (i = 0; i < n; i++)
        ((gint32 *) dst)[i] = gmlp_num_int64_to_int32 (((const gint64 *) src)[i]);
    }
  else
    {
      for (i = 0; i < n; i++)
        gmlp_num_store_float (dst, dst_dtype, i, gmlp_num_load_float (src, src_dtype, i));
    }
}

static gboolean
cpu_fill_random (GmlpBackendDevice  *device,
                 gpointer            dst,
                 int                 dtype,
                 guint64             n_elements,
                 guint64             seed,
                 float               scale,
                 GError            **error)
{
  guint64 i;

  for (i = 0; i < n_elements; i++)
    gmlp_num_store_float (dst, dtype, i, gmlp_num_random_uniform (seed, i, scale));
  return TRUE;
}

/* A float copy of n elements (the input itself for FP32). */
static float *
as_float (const void *src,
          int         dtype,
          gsize       n,
          float     **owned)
{
  gsize i;

  *owned = NULL;
  if (dtype == GMLP_NUM_FLOAT32)
    return (float *) src;
  *owned = g_new (float, MAX (n, 1));
  for (i = 0; i < n; i++)
    (*owned)[i] = gmlp_num_load_float (src, dtype, i);
  return *owned;
}

/* One group of a 16-bit or FP32 product with OpenBLAS's sgemm: inputs
 * widened to FP32, the product accumulated in FP32 (FPROP: plus @bias, n
 * values of C's dtype, or NULL), rounded once to C's dtype. */
static void
cpu_gemm_group (const GmlpCpuGemm *gemm,
                guint              g,
                const void        *bias)
{
  gint64 m = gemm->rows[g], n = gemm->n, k = gemm->k;
  gsize a_len, b_len, c_len;
  g_autofree float *a_owned = NULL, *b_owned = NULL, *c_owned = NULL;
  const float *a, *b;
  float *c;
  gboolean accumulate = gemm->kind == GMLP_GEMM_WGRAD && gemm->accumulate != NULL &&
                        gemm->accumulate[g];
  gsize i;

  switch (gemm->kind)
    {
    case GMLP_GEMM_FPROP: a_len = m * k; b_len = n * k; c_len = m * n; break;
    case GMLP_GEMM_DGRAD: a_len = m * n; b_len = n * k; c_len = m * k; break;
    case GMLP_GEMM_WGRAD: a_len = m * n; b_len = m * k; c_len = n * k; break;
    default: g_assert_not_reached ();
    }

  if (c_len == 0)
    return;
  if (m == 0)
    {
      /* Only WGRAD has output here: zero, or left as it is. */
      if (!accumulate)
        memset (gemm->c[g], 0, c_len * gmlp_num_dtype_size (gemm->c_dtype));
      return;
    }

  a = as_float (gemm->a[g], gemm->a_dtype, a_len, &a_owned);
  b = as_float (gemm->b[g], gemm->a_dtype, b_len, &b_owned);
  if (gemm->c_dtype == GMLP_NUM_FLOAT32)
    c = gemm->c[g];
  else if (accumulate)
    c = as_float (gemm->c[g], gemm->c_dtype, c_len, &c_owned);
  else
    c = c_owned = g_new (float, c_len);

  switch (gemm->kind)
    {
    case GMLP_GEMM_FPROP:
      cblas_sgemm (CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k,
                   1.0f, a, k, b, k, 0.0f, c, n);
      break;
    case GMLP_GEMM_DGRAD:
      cblas_sgemm (CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n,
                   1.0f, a, n, b, k, 0.0f, c, k);
      break;
    case GMLP_GEMM_WGRAD:
      cblas_sgemm (CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m,
                   1.0f, a, n, b, k, accumulate ? 1.0f : 0.0f, c, k);
      break;
    default:
      g_assert_not_reached ();
    }

  if (bias != NULL)
    gmlp_cpu_add_bias_rows (c, m, n, bias, gemm->c_dtype);
  if (c_owned != NULL)
    for (i = 0; i < c_len; i++)
      gmlp_num_store_float (gemm->c[g], gemm->c_dtype, i, c_owned[i]);
}

static gboolean
cpu_check_float_dtype (int       dtype,
                       GError  **error)
{
  if (dtype != GMLP_NUM_FLOAT32 && dtype != GMLP_NUM_FLOAT16 && dtype != GMLP_NUM_BFLOAT16)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "The CPU backend multiplies float32, float16 and bfloat16, not dtype %d", dtype);
      return FALSE;
    }
  return TRUE;
}

/* The 16-bit and FP32 products. An FPROP's bias goes into the FP32
 * product, before the one rounding to C's dtype. */
static gboolean
cpu_gemm_groups (const GmlpCpuGemm  *gemm,
                 GError            **error)
{
  guint g;

  if (!cpu_check_float_dtype (gemm->a_dtype, error))
    return FALSE;
  if (gemm->c_dtype != gemm->a_dtype && gemm->c_dtype != GMLP_NUM_FLOAT32)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "GEMM output must be the input dtype or float32");
      return FALSE;
    }
  if (gemm->n > G_MAXINT32 || gemm->k > G_MAXINT32)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED, "GEMM dimensions beyond int range");
      return FALSE;
    }
  for (g = 0; g < gemm->n_groups; g++)
    if (gemm->rows[g] > G_MAXINT32)
      {
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED, "GEMM dimensions beyond int range");
        return FALSE;
      }

  for (g = 0; g < gemm->n_groups; g++)
    cpu_gemm_group (gemm, g, gemm->bias != NULL ? gemm->bias[g] : NULL);
  return TRUE;
}

static gboolean
cpu_bias_grad (GmlpBackendDevice  *device,
               guint               n_groups,
               const gint64       *rows,
               gint64              n,
               int                 dtype,
               const void * const *a,
               void * const       *dbias,
               GError            **error)
{
  g_autofree float *sum = g_new (float, MAX (n, 1));
  guint g;

  if (!cpu_check_float_dtype (dtype, error))
    return FALSE;

  for (g = 0; g < n_groups; g++)
    {
      gint64 r, j;

      memset (sum, 0, sizeof (float) * n);
      for (r = 0; r < rows[g]; r++)
        for (j = 0; j < n; j++)
          sum[j] += gmlp_num_load_float (a[g], dtype, (guint64) (r * n + j));
      for (j = 0; j < n; j++)
        gmlp_num_store_float (dbias[g], dtype, (guint64) j, sum[j]);
    }
  return TRUE;
}

static GmlpBackendEvent *
cpu_event_record (GmlpBackendDevice  *device,
                  GError            **error)
{
  GmlpBackendEvent *event = g_new0 (GmlpBackendEvent, 1);

  event->time_us = g_get_monotonic_time ();
  return event;
}

static gboolean
cpu_event_elapsed (GmlpBackendEvent  *start,
                   GmlpBackendEvent  *end,
                   double            *ms,
                   GError           **error)
{
  *ms = (end->time_us - start->time_us) / 1000.0;
  return TRUE;
}

static gboolean
cpu_event_synchronize (GmlpBackendEvent  *event,
                       GError           **error)
{
  return TRUE;
}

static gboolean
cpu_event_query (GmlpBackendEvent *event)
{
  return TRUE;
}

static gboolean
cpu_event_wait (GmlpBackendDevice  *device,
                GmlpBackendEvent   *event,
                GError            **error)
{
  return TRUE;
}

static gpointer
cpu_event_get_native (GmlpBackendEvent *event)
{
  return NULL;
}

static void
cpu_event_free (GmlpBackendEvent *event)
{
  g_free (event);
}

/* Offload on the CPU: "host" memory is ordinary memory, and copies are
 * done when they return. */
static gpointer
cpu_host_alloc (GmlpBackendDevice  *device,
                gsize               nbytes,
                GError            **error)
{
  return cpu_alloc (device, nbytes, error);
}

static GmlpBackendEvent *
cpu_copy_async (GmlpBackendDevice  *device,
                gpointer            dst,
                gconstpointer       src,
                gsize               nbytes,
                gboolean            to_host,
                gboolean            after_compute,
                GError            **error)
{
  if (nbytes > 0)
    memcpy (dst, src, nbytes);
  return cpu_event_record (device, error);
}

/* The activation functions and their derivatives, in FP32: those of
 * gmlp-activation-numeric.h, the same bits as the CUDA kernels'. */
static float
act_value (int act, float x)
{
  return gmlp_act_eval (act, x).value;
}

static float
act_derivative (int act, float x)
{
  return gmlp_act_eval (act, x).grad;
}

static gboolean
cpu_activation (GmlpBackendDevice  *device,
                int                 act,
                guint               n_groups,
                const gint64       *rows,
                gint64              f,
                int                 dtype,
                const void * const *in,
                const void * const *d_out,
                void * const       *out,
                GError            **error)
{
  gboolean gated = act == GMLP_ACT_SWIGLU || act == GMLP_ACT_GEGLU;
  gint64 in_width = gated ? 2 * f : f;
  guint g;

  if (!cpu_check_float_dtype (dtype, error))
    return FALSE;
  if (act < GMLP_ACT_GELU || act > GMLP_ACT_GEGLU)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED, "Unknown activation %d", act);
      return FALSE;
    }

  for (g = 0; g < n_groups; g++)
    {
      gint64 r, j;

      for (r = 0; r < rows[g]; r++)
        for (j = 0; j < f; j++)
          {
            guint64 ia = (guint64) (r * in_width + j), io = (guint64) (r * f + j);
            float a = gmlp_num_load_float (in[g], dtype, ia);
            float b = gated ? gmlp_num_load_float (in[g], dtype, ia + (guint64) f) : 1.0f;

            if (d_out == NULL)
              {
                gmlp_num_store_float (out[g], dtype, io, act_value (act, a) * b);
              }
            else
              {
                float dy = gmlp_num_load_float (d_out[g], dtype, io);

                gmlp_num_store_float (out[g], dtype, ia, dy * b * act_derivative (act, a));
                if (gated)
                  gmlp_num_store_float (out[g], dtype, ia + (guint64) f, dy * act_value (act, a));
              }
          }
    }
  return TRUE;
}

/* Calls fn on every member of a device-sized shape with the member's
 * element count and its two offsets (for the layouts of two dtypes). */
typedef void (*MemberFunc) (gpointer data, guint64 n, guint64 offset_a, guint64 offset_b);

static void
for_each_member (const GmlpBackendShape *shape,
                 int                     dtype_a,
                 int                     dtype_b,
                 MemberFunc              fn,
                 gpointer                data)
{
  guint64 row_a = (guint64) shape->cols * gmlp_num_dtype_size (dtype_a);
  guint64 row_b = (guint64) shape->cols * gmlp_num_dtype_size (dtype_b);
  guint64 offset_a = 0, offset_b = 0;
  gint64 rows_left = shape->row_capacity;
  guint g;

  for (g = 0; g < shape->n_groups; g++)
    {
      gint64 rows = CLAMP (shape->device_rows[g], 0, rows_left);

      fn (data, (guint64) rows * (guint64) shape->cols, offset_a, offset_b);
      offset_a += gmlp_num_member_stride (rows, row_a);
      offset_b += gmlp_num_member_stride (rows, row_b);
      rows_left -= rows;
    }
}

typedef struct {
  const guint8 *x;
  guint8       *y;
  int           x_dtype, y_dtype;
  float         alpha, beta;
  double        sum;
} ElementwiseArgs;

static void
axpby_member (gpointer data, guint64 n, guint64 offset_x, guint64 offset_y)
{
  ElementwiseArgs *e = data;
  guint64 i;

  for (i = 0; i < n; i++)
    {
      float v = e->beta * gmlp_num_load_float (e->y + offset_y, e->y_dtype, i);
      if (e->x != NULL)
        v += e->alpha * gmlp_num_load_float (e->x + offset_x, e->x_dtype, i);
      gmlp_num_store_float (e->y + offset_y, e->y_dtype, i, v);
    }
}

typedef struct {
  const guint8 *src;
  guint8       *dst;
  int           src_dtype, dst_dtype;
} ConvertArgs;

static void
convert_member (gpointer data, guint64 n, guint64 offset_src, guint64 offset_dst)
{
  ConvertArgs *c = data;

  convert_elements (c->src + offset_src, c->src_dtype, c->dst + offset_dst, c->dst_dtype, n);
}

static gboolean
cpu_convert (GmlpBackendDevice      *device,
             const GmlpBackendShape *shape,
             gconstpointer           src,
             int                     src_dtype,
             gpointer                dst,
             int                     dst_dtype,
             GError                **error)
{
  ConvertArgs c = { src, dst, src_dtype, dst_dtype };

  /* Clamped to the row capacity as the CUDA kernels clamp. */
  for_each_member (shape, src_dtype, dst_dtype, convert_member, &c);
  return TRUE;
}

static gboolean
cpu_axpby (GmlpBackendDevice      *device,
           const GmlpBackendShape *shape,
           gconstpointer           x,
           int                     x_dtype,
           gpointer                y,
           int                     y_dtype,
           float                   alpha,
           float                   beta,
           GError                **error)
{
  ElementwiseArgs e = { x, y, x_dtype, y_dtype, alpha, beta, 0.0 };

  if ((x != NULL && !cpu_check_float_dtype (x_dtype, error)) || !cpu_check_float_dtype (y_dtype, error))
    return FALSE;
  for_each_member (shape, x != NULL ? x_dtype : y_dtype, y_dtype, axpby_member, &e);
  return TRUE;
}

static void
sum_squares_member (gpointer data, guint64 n, guint64 offset_x, guint64 unused)
{
  ElementwiseArgs *e = data;
  guint64 i;

  for (i = 0; i < n; i++)
    {
      double v = gmlp_num_load_float (e->x + offset_x, e->x_dtype, i);
      e->sum += v * v;
    }
}

static gboolean
cpu_split_bfloat16 (GmlpBackendDevice       *device,
                    const GmlpBackendSplit  *split,
                    GError                 **error)
{
  const char *invalid = gmlp_backend_split_invalid (split);
  gint64 r, c;
  guint j;

  if (invalid != NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "CPU: split_bfloat16: %s", invalid);
      return FALSE;
    }
  for (r = 0; r < split->rows; r++)
    for (c = 0; c < split->cols; c++)
      {
        guint16 parts[GMLP_BACKEND_MAX_SPLIT_PARTS];
        gint64 at = r * split->dst_row_stride + c * split->dst_col_stride;

        gmlp_num_split_bfloat16 (split->src[r * split->src_stride + c], (int) split->n_parts, parts);
        for (j = 0; j < split->n_outputs; j++)
          split->dst[split->offset[j] + at] = parts[split->part[j]];
      }
  return TRUE;
}

static gboolean
cpu_sum_parts (GmlpBackendDevice          *device,
               const GmlpBackendSumParts  *sum,
               GError                    **error)
{
  const char *invalid = gmlp_backend_sum_parts_invalid (sum);
  gint64 r, c;

  if (invalid != NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "CPU: sum_parts: %s", invalid);
      return FALSE;
    }
  for (r = 0; r < sum->rows; r++)
    for (c = 0; c < sum->cols; c++)
      {
        gint64 at = r * sum->src_stride + c;
        float v = sum->src[sum->offset[sum->n_parts - 1] + at];
        float *out = &sum->dst[r * sum->dst_stride + c];
        guint p;

        for (p = sum->n_parts - 1; p > 0; p--)
          v = v + sum->src[sum->offset[p - 1] + at];
        *out = sum->accumulate ? *out + v : v;
      }
  return TRUE;
}

static gboolean
cpu_sum_squares (GmlpBackendDevice      *device,
                 const GmlpBackendShape *shape,
                 gconstpointer           x,
                 int                     dtype,
                 double                 *result,
                 GError                **error)
{
  ElementwiseArgs e = { x, NULL, dtype, dtype, 0.0f, 0.0f, 0.0 };

  if (!cpu_check_float_dtype (dtype, error))
    return FALSE;
  for_each_member (shape, dtype, dtype, sum_squares_member, &e);
  *result = e.sum;
  return TRUE;
}

/* Device group sizes: the CPU "device" is host memory, so these read the
 * sizes directly, work out where each member lies and how many of its rows
 * fit exactly as the CUDA kernels do (impls/grouped_operand.cuh: a negative
 * size counts as 0, and a group gets the rows that fit, from its offset, in
 * the allocation of every row-grouped operand), then run the host-sizes
 * code on those rows. */

/* Offsets stick here (far beyond any allocation), as in the kernels. */
#define CPU_OFFSET_SATURATION (G_GUINT64_CONSTANT (1) << 62)
#define CPU_MAX_TENSOR_BYTES  (G_GUINT64_CONSTANT (1) << 60)

/* One operand grouped by rows, and where the walk over its members is. */
typedef struct {
  guint8  *data;
  guint64  row_bytes;
  guint64  capacity;       /* bytes of the allocation */
  gint64   overflow_rows;  /* a member this long crosses the end anyway */
  guint64  offset;         /* of the next member */
} CpuRowsOperand;

static gboolean
cpu_rows_operand_init (CpuRowsOperand  *op,
                       gconstpointer    data,
                       gint64           cols,
                       int              dtype,
                       guint            n_groups,
                       gint64           row_capacity,
                       GError         **error)
{
  guint64 row_bytes, padding;

  if (data == NULL || cols <= 0 || cols > G_MAXINT32 || row_capacity < 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: a grouped operand needs data, columns and a row capacity");
      return FALSE;
    }
  row_bytes = (guint64) cols * gmlp_num_dtype_size (dtype);
  /* The padding the allocation may add, to keep the bound in range. */
  padding = row_bytes % kGmlpMemberAlignment == 0 ? 0 : (guint64) n_groups * (kGmlpMemberAlignment - 1);
  if ((guint64) row_capacity > (CPU_MAX_TENSOR_BYTES - padding) / row_bytes)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: a row capacity of %" G_GINT64_FORMAT " is too large", row_capacity);
      return FALSE;
    }
  op->data = (guint8 *) data;
  op->row_bytes = row_bytes;
  op->capacity = gmlp_num_device_sized_bytes (n_groups, row_capacity, row_bytes);
  op->overflow_rows = (gint64) (op->capacity / row_bytes + 1);
  op->offset = 0;
  return TRUE;
}

/* How many of rows rows fit from the operand's current offset. */
static gint64
cpu_rows_operand_fit (const CpuRowsOperand *op,
                      gint64                rows)
{
  guint64 fit;

  if (rows <= 0 || op->offset >= op->capacity)
    return 0;
  fit = (op->capacity - op->offset) / op->row_bytes;
  return (guint64) rows < fit ? rows : (gint64) fit;
}

/* Moves past a member of rows rows (the size as given, not as clamped). */
static void
cpu_rows_operand_advance (CpuRowsOperand *op,
                          gint64          rows)
{
  guint64 stride = gmlp_num_member_stride (MIN (rows, op->overflow_rows), op->row_bytes);

  op->offset = MIN (op->offset + stride, CPU_OFFSET_SATURATION);
}

/* The rows each group gets and its member pointers in each operand. */
static void
cpu_walk_device_rows (const gint64   *device_rows,
                      guint           n_groups,
                      CpuRowsOperand *ops,
                      guint           n_ops,
                      gint64         *rows,
                      gpointer      **members)
{
  guint g, o;

  for (g = 0; g < n_groups; g++)
    {
      gint64 fit = device_rows[g];

      for (o = 0; o < n_ops; o++)
        fit = cpu_rows_operand_fit (&ops[o], fit);
      rows[g] = MAX (fit, 0);
      for (o = 0; o < n_ops; o++)
        {
          /* An empty member is never touched: keep its pointer inside the
           * allocation. */
          members[o][g] = rows[g] > 0 ? ops[o].data + ops[o].offset : ops[o].data;
          cpu_rows_operand_advance (&ops[o], device_rows[g]);
        }
    }
}

static const char cpu_no_device_fp8[] =
  "CPU: FP8 products with device sizes are FPROP and DGRAD with scales (blockwise: "
  "a's in rows, grouped by the sizes)";

/* Whether the CPU multiplies the FP8 operands of gemm as they are: with
 * host sizes, always; with device sizes FPROP and DGRAD (blockwise: a's
 * scales in rows). */
static gboolean
cpu_gemm_supported (GmlpBackendDevice      *device,
                    const GmlpBackendGemm  *gemm,
                    const char            **reason)
{
  gboolean blockwise = gmlp_backend_gemm_blockwise (gemm);

  if (!gmlp_backend_gemm_is_fp8 (gemm) || gemm->rows != NULL)
    return TRUE;
  if (gemm->kind == GMLP_GEMM_WGRAD || gemm->b.scale_inv == NULL || gemm->a.scale_inv == NULL ||
      (blockwise && gemm->a.scales.row_block != 1))
    {
      *reason = cpu_no_device_fp8;
      return FALSE;
    }
  return TRUE;
}

/* With device sizes: reads them (host memory here), clamps them as the
 * kernels do, and finds each group's members in the grouped operands
 * (a, and c or WGRAD's b; blockwise: a's scales). */
static gboolean
cpu_gemm_walk_device_rows (const GmlpBackendGemm  *gemm,
                           GmlpCpuGemm            *groups,
                           gint64                 *rows,
                           GError                **error)
{
  gboolean wgrad = gemm->kind == GMLP_GEMM_WGRAD;
  gboolean fp8 = gmlp_backend_gemm_is_fp8 (gemm);
  gboolean blockwise = fp8 && gmlp_backend_gemm_blockwise (gemm);
  const GmlpBackendOperand *second = wgrad ? &gemm->b : &gemm->c;
  const char *reason;
  CpuRowsOperand ops[3];
  gpointer *members[3];

  if (gemm->n <= 0 || gemm->k <= 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "CPU: grouped products with device sizes need n and k of at least 1");
      return FALSE;
    }
  if (gemm->device_rows == NULL || gemm->a.base == NULL || second->base == NULL ||
      (wgrad ? gemm->c.layout : gemm->b.layout) == GMLP_BACKEND_OPERAND_NONE)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: a grouped product with device sizes is missing an operand");
      return FALSE;
    }
  if (fp8 && !cpu_gemm_supported (NULL, gemm, &reason))
    {
      g_set_error_literal (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED, reason);
      return FALSE;
    }
  if ((!fp8 && !cpu_check_float_dtype (gemm->a.dtype, error)) ||
      !cpu_check_float_dtype (gemm->c.dtype, error) ||
      !cpu_rows_operand_init (&ops[0], gemm->a.base, gmlp_backend_gemm_row_cols (gemm, &gemm->a),
                              gemm->a.dtype, gemm->n_groups, gemm->row_capacity, error) ||
      !cpu_rows_operand_init (&ops[1], second->base, gmlp_backend_gemm_row_cols (gemm, second),
                              second->dtype, gemm->n_groups, gemm->row_capacity, error))
    return FALSE;

  /* Blockwise: a's scales are grouped by the same sizes. */
  if (blockwise)
    {
      gint64 scale_rows, row_floats;

      gmlp_backend_gemm_scale_rows (gemm, &gemm->a, 1, &scale_rows, &row_floats);
      if (!cpu_rows_operand_init (&ops[2], gemm->a.scale_inv, row_floats, GMLP_NUM_FLOAT32,
                                  gemm->n_groups, gemm->row_capacity, error))
        return FALSE;
    }

  members[0] = groups->a;
  members[1] = wgrad ? groups->b : groups->c;
  members[2] = (gpointer *) groups->a_scale_inv;
  cpu_walk_device_rows (gemm->device_rows, gemm->n_groups, ops, blockwise ? 3 : 2, rows, members);
  return TRUE;
}

/* Every product: the groups' members found (with device sizes, the sizes
 * read and clamped first), then the host-sizes arithmetic, group by
 * group. */
static gboolean
cpu_gemm (GmlpBackendDevice      *device,
          const GmlpBackendGemm  *gemm,
          GError                **error)
{
  guint n = gemm->n_groups, g;
  gboolean fp8 = gmlp_backend_gemm_is_fp8 (gemm);
  gboolean wgrad = gemm->kind == GMLP_GEMM_WGRAD;
  gpointer local[GMLP_BACKEND_GEMM_LOCAL_TABLES];
  g_autofree gpointer *heap = NULL;
  gpointer *tables;
  g_autofree gint64 *device_sized = NULL;
  GmlpCpuGemm groups = {
    .kind = gemm->kind,
    .n_groups = n,
    .rows = gemm->rows,
    .n = gemm->n,
    .k = gemm->k,
    .a_dtype = gemm->a.dtype,
    .b_dtype = gemm->b.dtype,
    .c_dtype = gemm->c.dtype,
    .a_scales = gemm->a.scales,
    .b_scales = gemm->b.scales,
    .accumulate = wgrad ? gemm->accumulate : NULL,
  };

  if (gemm->kind != GMLP_GEMM_FPROP && gemm->kind != GMLP_GEMM_DGRAD && !wgrad)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "CPU: unknown GEMM kind %d",
                   (int) gemm->kind);
      return FALSE;
    }
  if (n == 0)
    return TRUE;

  /* One block for every table: a, b, c, bias and the two scales. */
  tables = gmlp_backend_gemm_tables (local, 6 * (gsize) n, &heap);
  groups.a = tables;
  groups.b = tables + n;
  groups.c = tables + 2 * n;
  groups.a_scale_inv = (const float **) (tables + 4 * n);
  groups.b_scale_inv = (const float **) (tables + 5 * n);
  if (gemm->kind == GMLP_GEMM_FPROP && gemm->bias.layout != GMLP_BACKEND_OPERAND_NONE)
    {
      groups.bias = tables + 3 * n;
      for (g = 0; g < n; g++)
        groups.bias[g] = gmlp_backend_operand_fixed (&gemm->bias, g);
    }

  if (gemm->rows != NULL)
    {
      gmlp_backend_gemm_members (gemm, &gemm->a, groups.a);
      gmlp_backend_gemm_members (gemm, &gemm->b, groups.b);
      gmlp_backend_gemm_members (gemm, &gemm->c, groups.c);
      if (fp8)
        gmlp_backend_gemm_scale_members (gemm, &gemm->a, groups.a_scale_inv);
    }
  else
    {
      groups.rows = device_sized = g_new (gint64, n);
      if (!cpu_gemm_walk_device_rows (gemm, &groups, device_sized, error))
        return FALSE;
      /* The per-group matrices, and a's per-tensor scales. */
      for (g = 0; g < n; g++)
        {
          if (wgrad)
            groups.c[g] = gmlp_backend_operand_fixed (&gemm->c, g);
          else
            groups.b[g] = gmlp_backend_operand_fixed (&gemm->b, g);
          if (fp8 && !gmlp_backend_operand_scales_follow_rows (&gemm->a))
            groups.a_scale_inv[g] = gmlp_backend_operand_fixed_scales (&gemm->a, g);
        }
    }
  if (fp8)
    {
      gmlp_backend_gemm_scale_members (gemm, &gemm->b, groups.b_scale_inv);
      if (gemm->a.scale_inv == NULL || gemm->b.scale_inv == NULL)
        groups.a_scale_inv = groups.b_scale_inv = NULL;
      return gmlp_cpu_fp8_products (&groups, error);
    }
  return cpu_gemm_groups (&groups, error);
}

static gboolean
cpu_bias_grad_device (GmlpBackendDevice       *device,
                      const GmlpBackendShape  *shape,
                      int                      dtype,
                      gconstpointer            a,
                      void * const            *dbias,
                      GError                 **error)
{
  CpuRowsOperand op;
  g_autofree gint64 *rows = NULL;
  g_autofree gpointer *members = NULL;

  if (!cpu_check_float_dtype (dtype, error))
    return FALSE;
  if (shape->n_groups == 0 || shape->cols == 0)
    return TRUE;
  if (shape->device_rows == NULL || dbias == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: bias_grad_device needs the sizes and the gradients");
      return FALSE;
    }
  if (!cpu_rows_operand_init (&op, a, shape->cols, dtype, shape->n_groups, shape->row_capacity,
                              error))
    return FALSE;

  rows = g_new (gint64, shape->n_groups);
  members = g_new (gpointer, shape->n_groups);
  cpu_walk_device_rows (shape->device_rows, shape->n_groups, &op, 1, rows, &members);
  return cpu_bias_grad (device, shape->n_groups, rows, shape->cols, dtype,
                        (const void * const *) members, dbias, error);
}

/* The activation with device sizes: each group gets the rows that fit in
 * in and in the f-wide operand (out forward, d_out backward; a backward
 * out is as wide as in), as the CUDA kernel finds them, then the
 * host-sizes code runs on those rows. */
static gboolean
cpu_activation_device (GmlpBackendDevice       *device,
                       const GmlpBackendShape  *shape,
                       int                      act,
                       int                      dtype,
                       gconstpointer            in,
                       gconstpointer            d_out,
                       gpointer                 out,
                       GError                 **error)
{
  gboolean backward = d_out != NULL;
  gint64 in_cols = act == GMLP_ACT_SWIGLU || act == GMLP_ACT_GEGLU ? 2 * shape->cols : shape->cols;
  CpuRowsOperand ops[3];
  g_autofree gint64 *rows = NULL;
  g_autofree gpointer *in_members = NULL, *second = NULL, *out_members = NULL;
  gpointer *members[3];

  if (!cpu_check_float_dtype (dtype, error))
    return FALSE;
  if (act < GMLP_ACT_GELU || act > GMLP_ACT_GEGLU)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED, "Unknown activation %d", act);
      return FALSE;
    }
  if (shape->n_groups == 0 || shape->cols == 0)
    return TRUE;
  if (shape->device_rows == NULL || shape->cols < 0)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "CPU: activation_device needs the sizes and f of at least 0");
      return FALSE;
    }
  if (!cpu_rows_operand_init (&ops[0], in, in_cols, dtype, shape->n_groups, shape->row_capacity, error) ||
      !cpu_rows_operand_init (&ops[1], backward ? d_out : out, shape->cols, dtype, shape->n_groups,
                              shape->row_capacity, error) ||
      (backward && !cpu_rows_operand_init (&ops[2], out, in_cols, dtype, shape->n_groups,
                                           shape->row_capacity, error)))
    return FALSE;

  rows = g_new (gint64, shape->n_groups);
  members[0] = in_members = g_new (gpointer, shape->n_groups);
  members[1] = second = g_new (gpointer, shape->n_groups);
  members[2] = out_members = backward ? g_new (gpointer, shape->n_groups) : NULL;
  cpu_walk_device_rows (shape->device_rows, shape->n_groups, ops, backward ? 3 : 2, rows, members);
  return cpu_activation (device, act, shape->n_groups, rows, shape->cols, dtype,
                         (const void * const *) members[0],
                         backward ? (const void * const *) members[1] : NULL,
                         (void * const *) (backward ? members[2] : members[1]), error);
}

/* Work on the CPU runs as it is enqueued: there is nothing to record. */
static gboolean
cpu_capture_begin (GmlpBackendDevice  *device,
                   GError            **error)
{
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
               "graph capture needs a GPU device; the CPU runs work as it is enqueued");
  return FALSE;
}

static GmlpBackendGraph *
cpu_capture_end (GmlpBackendDevice  *device,
                 GError            **error)
{
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
               "no graph capture is in progress on the CPU");
  return NULL;
}

static gboolean
cpu_is_capturing (GmlpBackendDevice *device)
{
  return FALSE;
}

static gboolean
cpu_graph_launch (GmlpBackendGraph  *graph,
                  GError           **error)
{
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED, "the CPU has no graphs");
  return FALSE;
}

static void
cpu_graph_free (GmlpBackendGraph *graph)
{
}

static const GmlpBackend cpu_backend = {
  .abi_version = GMLP_BACKEND_ABI_VERSION,
  .name = "cpu",
  .get_device_count = cpu_get_device_count,
  .open_device = cpu_open_device,
  .close_device = cpu_close_device,
  .get_device_name = cpu_get_device_name,
  .alloc = cpu_alloc,
  .free = cpu_free,
  .upload = cpu_copy,
  .download = cpu_copy,
  .copy = cpu_copy,
  .fill_bytes = cpu_fill_bytes,
  .synchronize = cpu_synchronize,
  .convert = cpu_convert,
  .fill_random = cpu_fill_random,
  .gemm = cpu_gemm,
  .gemm_supported = cpu_gemm_supported,
  .bias_grad = cpu_bias_grad,
  .event_record = cpu_event_record,
  .event_synchronize = cpu_event_synchronize,
  .event_query = cpu_event_query,
  .event_wait = cpu_event_wait,
  .event_elapsed = cpu_event_elapsed,
  .event_get_native = cpu_event_get_native,
  .event_free = cpu_event_free,
  .host_alloc = cpu_host_alloc,
  .host_free = cpu_free,
  .copy_async = cpu_copy_async,
  .copy_stream_alloc = cpu_alloc,
  .free_after_copies = cpu_free,
  .activation = cpu_activation,
  .activation_device = cpu_activation_device,
  .axpby = cpu_axpby,
  .sum_squares = cpu_sum_squares,
  .bias_grad_device = cpu_bias_grad_device,
  .capture_begin = cpu_capture_begin,
  .capture_end = cpu_capture_end,
  .is_capturing = cpu_is_capturing,
  .graph_launch = cpu_graph_launch,
  .graph_free = cpu_graph_free,
  /* FP8 quantization (gmlp-quantizer): entries below this line. */
  .quantize = gmlp_cpu_quantize,
  .dequantize = gmlp_cpu_dequantize,
  .quantizer_update = gmlp_cpu_quantizer_update,
  .activation_quantize = gmlp_cpu_activation_quantize,
  /* Token permutation: entries below this line. */
  .routing_count = gmlp_cpu_routing_count,
  .routing_map = gmlp_cpu_routing_map,
  .permute = gmlp_cpu_permute,
  /* Router (gmlp-router): entries below this line. */
  .router_forward = gmlp_cpu_router_forward,
  .router_backward = gmlp_cpu_router_backward,
  .router_update_bias = gmlp_cpu_router_update_bias,
  /* Communicators: entries below this line. */
  .comm_unique_id = gmlp_cpu_comm_unique_id,
  .comm_init = gmlp_cpu_comm_init,
  .comm_join = gmlp_cpu_comm_join,
  .comm_abort = gmlp_cpu_comm_abort,
  .comm_free = gmlp_cpu_comm_free,
  .comm_all_reduce = gmlp_cpu_comm_all_reduce,
  .comm_all_gather = gmlp_cpu_comm_all_gather,
  .comm_all_to_all = gmlp_cpu_comm_all_to_all,
  .move_rows = gmlp_cpu_move_rows,
  .split_bfloat16 = cpu_split_bfloat16,
  .sum_parts = cpu_sum_parts,
};

const GmlpBackend *
gmlp_backend_cpu_get (void)
{
  return &cpu_backend;
}
