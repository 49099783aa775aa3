/* fuzz-values.c: the argument factory of the fuzz suite
 *
 * The catalogue of flavours (the pools of plain values are in
 * fuzz-pools.c): named recipes for the objects, GBytes and GVariants a case
 * passes, from well-made ones of the suite's geometry to unfinished, failed,
 * foreign and odd ones. The parent only names flavours; a case's child
 * builds the ones it uses, once each.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include "gmlp-fuzz.h"

/* Flavours */

static GPtrArray *catalogue;      /* FzFlavour, in a fixed order */
static GHashTable *by_name;       /* name → FzFlavour */
static GHashTable *by_type;       /* type → GPtrArray of FzFlavour */

static const GmlpDType float_dtypes[] = { GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16 };
static const GmlpDType all_dtypes[] = {
  GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16, GMLP_DTYPE_FLOAT8_E4M3,
  GMLP_DTYPE_FLOAT8_E5M2, GMLP_DTYPE_INT32, GMLP_DTYPE_INT64,
};
static const GmlpScalingRecipe recipes[] = {
  GMLP_SCALING_RECIPE_DELAYED, GMLP_SCALING_RECIPE_CURRENT, GMLP_SCALING_RECIPE_BLOCKWISE,
  GMLP_SCALING_RECIPE_MXFP8,
};

const char *
fz_dtype_short (GmlpDType dtype)
{
  switch (dtype)
    {
    case GMLP_DTYPE_FLOAT32: return "f32";
    case GMLP_DTYPE_FLOAT16: return "f16";
    case GMLP_DTYPE_BFLOAT16: return "bf16";
    case GMLP_DTYPE_FLOAT8_E4M3: return "e4m3";
    case GMLP_DTYPE_FLOAT8_E5M2: return "e5m2";
    case GMLP_DTYPE_INT32: return "i32";
    case GMLP_DTYPE_INT64: return "i64";
    default: return "?";
    }
}

static const char *
recipe_short (int recipe)
{
  switch (recipe)
    {
    case GMLP_SCALING_RECIPE_DELAYED: return "delayed";
    case GMLP_SCALING_RECIPE_CURRENT: return "current";
    case GMLP_SCALING_RECIPE_BLOCKWISE: return "blockwise";
    case GMLP_SCALING_RECIPE_MXFP8: return "mxfp8";
    default: return "none";
    }
}

static const char *
role_short (int role)
{
  switch (role)
    {
    case GMLP_QUANTIZER_ROLE_INPUT: return "input";
    case GMLP_QUANTIZER_ROLE_WEIGHT: return "weight";
    default: return "grad";
    }
}

/* Layouts of the tensors: the rows of each member. */
enum {
  LAYOUT_STD,      /* FZ_ROWS0, FZ_ROWS1 */
  LAYOUT_3G,       /* 1, 2, 3 */
  LAYOUT_1G,       /* 8 */
  LAYOUT_64G,      /* 64 groups of 0 to 2 rows */
  LAYOUT_MAXG,     /* 65535 groups, one row in the first */
  LAYOUT_EMPTY,    /* 0, 0 */
};

static gint64 *
layout_rows (int    layout,
             guint *n_groups)
{
  gint64 *rows;
  guint g;

  switch (layout)
    {
    case LAYOUT_3G:
      *n_groups = 3;
      break;
    case LAYOUT_1G:
      *n_groups = 1;
      break;
    case LAYOUT_64G:
      *n_groups = 64;
      break;
    case LAYOUT_MAXG:
      *n_groups = 65535;
      break;
    default:
      *n_groups = FZ_GROUPS;
    }
  rows = g_new0 (gint64, *n_groups);
  switch (layout)
    {
    case LAYOUT_STD:
      rows[0] = FZ_ROWS0;
      rows[1] = FZ_ROWS1;
      break;
    case LAYOUT_3G:
      for (g = 0; g < 3; g++)
        rows[g] = g + 1;
      break;
    case LAYOUT_1G:
      rows[0] = FZ_ROWS0 + FZ_ROWS1;
      break;
    case LAYOUT_64G:
      for (g = 0; g < 64; g++)
        rows[g] = g % 3;
      break;
    case LAYOUT_MAXG:
      rows[0] = 1;
      break;
    default:
      break;
    }
  return rows;
}

/* n elements of dtype from a generator: small values, deterministic. */
static GBytes *
make_data (GmlpDType  dtype,
           gsize      n,
           guint32    seed,
           gboolean   specials)
{
  static const float special_values[] = { NAN, INFINITY, -INFINITY, -0.0f, 3.4e38f, 1e-45f, 65504.0f, 448.0f };
  g_autoptr(GRand) rand = g_rand_new_with_seed (seed);
  gsize elem = gmlp_dtype_get_size (dtype);
  guint8 *data = g_malloc0 (MAX (n * elem, 1));
  gsize i;

  for (i = 0; i < n; i++)
    {
      float v = (float) g_rand_double_range (rand, -1.0, 1.0);

      if (specials && g_rand_int_range (rand, 0, 4) == 0)
        v = special_values[g_rand_int_range (rand, 0, G_N_ELEMENTS (special_values))];
      switch (dtype)
        {
        case GMLP_DTYPE_FLOAT32: ((float *) data)[i] = v; break;
        case GMLP_DTYPE_FLOAT16: ((guint16 *) data)[i] = gmlp_dtype_float_to_half (v); break;
        case GMLP_DTYPE_BFLOAT16: ((guint16 *) data)[i] = gmlp_dtype_float_to_bfloat16 (v); break;
        case GMLP_DTYPE_FLOAT8_E4M3: data[i] = gmlp_dtype_float_to_e4m3 (v); break;
        case GMLP_DTYPE_FLOAT8_E5M2: data[i] = gmlp_dtype_float_to_e5m2 (v); break;
        case GMLP_DTYPE_INT32: ((gint32 *) data)[i] = (gint32) (v * 4); break;
        case GMLP_DTYPE_INT64: ((gint64 *) data)[i] = (gint64) (v * 4); break;
        default: break;
        }
    }
  return g_bytes_new_take (data, n * elem);
}

static GmlpDevice *
flavour_device (FzCtx           *ctx,
                const FzFlavour *f,
                GError         **error)
{
  if (f->on_cpu)
    return fz_get (ctx, "dev:cpu", error);
  return ctx->device;
}

/* Builders: each returns a new reference, or NULL with an error. */

static gpointer
build_device (FzCtx           *ctx,
              const FzFlavour *f,
              GError         **error)
{
  if (f->on_cpu)
    return gmlp_device_new (GMLP_DEVICE_KIND_CPU, 0, error);
  return g_object_ref (ctx->device);
}

static GType
flavour_gtype (const FzFlavour *f)
{
  return g_registered_type_info_get_g_type ((GIRegisteredTypeInfo *) f->info);
}

static gpointer
build_bare (FzCtx           *ctx,
            const FzFlavour *f,
            GError         **error)
{
  return g_object_new (flavour_gtype (f), NULL);
}

/* The value a well-made object would have for a construct property, by
 * name; FALSE to leave the property unset. */
static gboolean
sane_property (FzCtx      *ctx,
               GParamSpec *pspec,
               GValue     *value)
{
  const char *name = pspec->name;
  GType type = G_PARAM_SPEC_VALUE_TYPE (pspec);

  g_value_init (value, type);
  if (type == GMLP_TYPE_DEVICE)
    g_value_set_object (value, ctx->device);
  else if (G_TYPE_IS_OBJECT (type) || G_TYPE_IS_BOXED (type) || type == G_TYPE_VARIANT)
    {
      g_value_unset (value);
      return FALSE;
    }
  else if (g_str_equal (name, "n-groups"))
    g_value_set_uint (value, FZ_GROUPS);
  else if (g_str_equal (name, "in-features") || g_str_equal (name, "hidden") ||
           g_str_equal (name, "cols"))
    g_value_set_int64 (value, FZ_K);
  else if (g_str_equal (name, "out-features") || g_str_equal (name, "ffn-hidden"))
    g_value_set_int64 (value, FZ_O);
  else if (g_str_equal (name, "row-capacity"))
    g_value_set_int64 (value, FZ_ROWS0 + FZ_ROWS1);
  else if (g_str_equal (name, "recipe"))
    g_value_set_enum (value, GMLP_SCALING_RECIPE_CURRENT);
  else
    g_param_value_set_default (pspec, value);
  return TRUE;
}

gboolean
fz_value_set_int64 (GValue *value,
                    gint64  v)
{
  switch (G_TYPE_FUNDAMENTAL (G_VALUE_TYPE (value)))
    {
    case G_TYPE_BOOLEAN: g_value_set_boolean (value, v != 0); break;
    case G_TYPE_INT: g_value_set_int (value, (int) v); break;
    case G_TYPE_UINT: g_value_set_uint (value, (guint) v); break;
    case G_TYPE_INT64: g_value_set_int64 (value, v); break;
    case G_TYPE_UINT64: g_value_set_uint64 (value, (guint64) v); break;
    case G_TYPE_ENUM: g_value_set_enum (value, (int) v); break;
    case G_TYPE_FLAGS: g_value_set_flags (value, (guint) v); break;
    case G_TYPE_DOUBLE: g_value_set_double (value, (double) v); break;
    default: return FALSE;
    }
  return TRUE;
}

/* Whether the property takes v as it is: out of its range GObject itself
 * warns, which says nothing of the library. */
gboolean
fz_pspec_takes (GParamSpec *pspec,
                gint64      v)
{
  GValue value = G_VALUE_INIT;
  gboolean ok;
  gint64 back = 0;

  g_value_init (&value, G_PARAM_SPEC_VALUE_TYPE (pspec));
  ok = fz_value_set_int64 (&value, v) && !g_param_value_validate (pspec, &value);
  if (ok)
    {
      switch (G_TYPE_FUNDAMENTAL (G_VALUE_TYPE (&value)))
        {
        case G_TYPE_BOOLEAN: back = g_value_get_boolean (&value); break;
        case G_TYPE_INT: back = g_value_get_int (&value); break;
        case G_TYPE_UINT: back = g_value_get_uint (&value); break;
        case G_TYPE_INT64: back = g_value_get_int64 (&value); break;
        case G_TYPE_UINT64: back = (gint64) g_value_get_uint64 (&value); break;
        case G_TYPE_ENUM: back = g_value_get_enum (&value); break;
        case G_TYPE_FLAGS: back = g_value_get_flags (&value); break;
        case G_TYPE_DOUBLE: back = (gint64) g_value_get_double (&value); break;
        default: break;
        }
      ok = back == v;
    }
  g_value_unset (&value);
  return ok;
}

/* The construct properties of a class, at sane values, one of them (when
 * hostile_prop is not NULL) at hostile_value instead. */
static GObject *
new_with_construct_properties (FzCtx      *ctx,
                               GType       type,
                               const char *hostile_prop,
                               gint64      hostile_value)
{
  g_autoptr(GTypeClass) klass = g_type_class_ref (type);
  g_autofree GParamSpec **pspecs = NULL;
  g_autoptr(GPtrArray) names = g_ptr_array_new ();
  g_autoptr(GArray) values = g_array_new (FALSE, TRUE, sizeof (GValue));
  GObject *object;
  guint n, i;

  g_array_set_clear_func (values, (GDestroyNotify) g_value_unset);
  pspecs = g_object_class_list_properties (G_OBJECT_CLASS (klass), &n);
  for (i = 0; i < n; i++)
    {
      GValue value = G_VALUE_INIT;

      if ((pspecs[i]->flags & G_PARAM_WRITABLE) == 0 ||
          (pspecs[i]->flags & (G_PARAM_CONSTRUCT | G_PARAM_CONSTRUCT_ONLY)) == 0)
        continue;
      if (!sane_property (ctx, pspecs[i], &value))
        continue;
      if (hostile_prop != NULL && g_str_equal (pspecs[i]->name, hostile_prop) &&
          !fz_value_set_int64 (&value, hostile_value))
        g_param_value_set_default (pspecs[i], &value);   /* an object: NULL */
      g_ptr_array_add (names, (gpointer) pspecs[i]->name);
      g_array_append_val (values, value);
    }

  object = g_object_new_with_properties (type, names->len, (const char **) names->pdata,
                                         (const GValue *) values->data);
  return object;
}

GObject *
fz_new_with_construct_properties (FzCtx      *ctx,
                                  GType       type,
                                  const char *hostile_prop,
                                  gint64      hostile_value)
{
  return new_with_construct_properties (ctx, type, hostile_prop, hostile_value);
}

static gpointer
build_props (FzCtx           *ctx,
             const FzFlavour *f,
             GError         **error)
{
  return new_with_construct_properties (ctx, flavour_gtype (f), NULL, 0);
}

/* Construct properties with one absurd size, then g_initable_init(), which
 * fails: the object stays, as a caller that ignores the error keeps it. */
static gpointer
build_failed (FzCtx           *ctx,
              const FzFlavour *f,
              GError         **error)
{
  g_autoptr(GError) local = NULL;
  GObject *object = new_with_construct_properties (ctx, flavour_gtype (f), f->base, f->n);

  if (G_IS_INITABLE (object) && g_initable_init (G_INITABLE (object), NULL, &local))
    fz_note (ctx, "note: init with %s=%" G_GINT64_FORMAT " succeeded", f->base, f->n);
  return object;
}

static gpointer
build_tensor (FzCtx           *ctx,
              const FzFlavour *f,
              GError         **error)
{
  g_autofree gint64 *rows = NULL;
  g_autoptr(GBytes) bytes = NULL;
  GmlpDevice *device = flavour_device (ctx, f, error);
  gint64 total = 0;
  guint n_groups, g;

  if (device == NULL)
    return NULL;
  rows = layout_rows (f->layout, &n_groups);
  for (g = 0; g < n_groups; g++)
    total += rows[g];
  bytes = make_data (f->dtype, (gsize) total * f->n, g_str_hash (f->name), FALSE);
  return gmlp_grouped_tensor_new_from_bytes (device, f->dtype, rows, n_groups, f->n, bytes, error);
}

static gpointer
build_sizes (FzCtx           *ctx,
             const FzFlavour *f,
             GError         **error)
{
  gint64 rows = 1;
  gint64 sizes[FZ_GROUPS] = { FZ_ROWS0, FZ_ROWS1 };
  g_autoptr(GBytes) bytes = NULL;

  if (f->layout != LAYOUT_STD)
    {
      /* Sizes a router could never write: negative, and past any capacity. */
      sizes[0] = -1;
      sizes[1] = (gint64) 1 << 40;
    }
  bytes = g_bytes_new (sizes, sizeof sizes);
  return gmlp_grouped_tensor_new_from_bytes (ctx->device, GMLP_DTYPE_INT64, &rows, 1, FZ_GROUPS,
                                             bytes, error);
}

static gpointer
build_device_sized (FzCtx           *ctx,
                    const FzFlavour *f,
                    GError         **error)
{
  g_autoptr(GmlpGroupedTensor) t = NULL;
  GmlpGroupedTensor *sizes = fz_get (ctx, f->base, error);

  if (sizes == NULL)
    return NULL;
  t = gmlp_grouped_tensor_new_with_device_sizes (ctx->device, f->dtype, sizes,
                                                 FZ_ROWS0 + FZ_ROWS1, f->n, error);
  if (t == NULL || !gmlp_grouped_tensor_fill_random (t, g_str_hash (f->name), 1.0, error))
    return NULL;
  return g_steal_pointer (&t);
}

static gpointer
build_uniform (FzCtx           *ctx,
               const FzFlavour *f,
               GError         **error)
{
  g_autoptr(GmlpGroupedTensor) t = NULL;

  t = gmlp_grouped_tensor_new_uniform (ctx->device, f->dtype, f->layout == LAYOUT_1G ? 1 : FZ_GROUPS,
                                       FZ_O, FZ_K, error);
  if (t == NULL || !gmlp_grouped_tensor_fill_zero (t, error))
    return NULL;
  return g_steal_pointer (&t);
}

static gpointer
build_member (FzCtx           *ctx,
              const FzFlavour *f,
              GError         **error)
{
  GmlpGroupedTensor *base = fz_get (ctx, f->base, error);

  if (base == NULL)
    return NULL;
  return gmlp_grouped_tensor_get_member (base, (guint) f->n, error);
}

static gpointer
build_fp8 (FzCtx           *ctx,
           const FzFlavour *f,
           GError         **error)
{
  g_autoptr(GmlpQuantizer) q = NULL;
  GmlpGroupedTensor *src = fz_get (ctx, f->base, error);

  if (src == NULL)
    return NULL;
  q = gmlp_quantizer_new (ctx->device, f->recipe, GMLP_FP8_FORMAT_HYBRID, f->role);
  if (q == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "no quantizer");
      return NULL;
    }
  gmlp_quantizer_set_columnwise (q, f->flags != 0);
  return gmlp_quantizer_quantize (q, src, error);
}

/* A part of another tensor that a getter gives (transfer none). */
static gpointer
build_part (FzCtx           *ctx,
            const FzFlavour *f,
            GError         **error)
{
  gpointer base = fz_get (ctx, f->base, error);
  GmlpGroupedTensor *part = NULL;

  if (base == NULL)
    return NULL;
  if (g_str_has_suffix (f->name, "col-only"))
    part = gmlp_grouped_tensor_get_columnwise (base);
  else if (g_str_has_suffix (f->name, "scale-inv"))
    part = gmlp_grouped_tensor_get_scale_inv (base);
  else if (g_str_equal (f->name, "lin:weight"))
    part = gmlp_grouped_linear_get_weight (base);
  else if (g_str_equal (f->name, "lin:wgrad"))
    {
      /* The gradient exists once a backward has run. */
      if (fz_get (ctx, "saved:consumed", error) == NULL)
        return NULL;
      part = gmlp_grouped_linear_get_wgrad (base);
    }
  else if (g_str_equal (f->name, "mlp:fc1"))
    return g_object_ref (gmlp_grouped_mlp_get_fc1 (base));
  if (part == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE, "%s has none", f->base);
      return NULL;
    }
  return g_object_ref (part);
}

static gpointer
build_linear (FzCtx           *ctx,
              const FzFlavour *f,
              GError         **error)
{
  g_autoptr(GmlpGroupedLinear) layer = NULL;
  GmlpDevice *device = flavour_device (ctx, f, error);

  if (device == NULL)
    return NULL;
  layer = gmlp_grouped_linear_new_full (device, (guint) f->n, FZ_K, FZ_O, f->dtype, f->flags, error);
  if (layer == NULL)
    return NULL;
  if (f->recipe != GMLP_SCALING_RECIPE_NONE)
    {
      g_autoptr(GmlpQuantizer) qi = gmlp_quantizer_new (device, f->recipe, GMLP_FP8_FORMAT_HYBRID,
                                                        GMLP_QUANTIZER_ROLE_INPUT);
      g_autoptr(GmlpQuantizer) qw = gmlp_quantizer_new (device, f->recipe, GMLP_FP8_FORMAT_HYBRID,
                                                        GMLP_QUANTIZER_ROLE_WEIGHT);
      g_autoptr(GmlpQuantizer) qg = gmlp_quantizer_new (device, f->recipe, GMLP_FP8_FORMAT_HYBRID,
                                                        GMLP_QUANTIZER_ROLE_GRAD_OUTPUT);

      if (!gmlp_grouped_linear_set_quantizers (layer, qi, qw, qg, error))
        return NULL;
    }
  return g_steal_pointer (&layer);
}

static gpointer
build_mlp (FzCtx           *ctx,
           const FzFlavour *f,
           GError         **error)
{
  g_autoptr(GmlpGroupedMLP) mlp = NULL;
  GmlpDevice *device = flavour_device (ctx, f, error);

  if (device == NULL)
    return NULL;
  mlp = gmlp_grouped_mlp_new_full (device, (guint) f->n, FZ_K, FZ_O, f->activation, f->dtype,
                                   f->flags, error);
  if (mlp == NULL)
    return NULL;
  if (f->recipe != GMLP_SCALING_RECIPE_NONE &&
      !gmlp_grouped_mlp_set_fp8_recipe (mlp, f->recipe, GMLP_FP8_FORMAT_HYBRID, error))
    return NULL;
  return g_steal_pointer (&mlp);
}

/* A router: f->n experts, top-2; f->activation the score function, f->flags
 * its gradient flags; f->role 1 adds groups, an expert bias and both
 * losses (DeepSeek-V3's routing). */
static gpointer
build_router (FzCtx           *ctx,
              const FzFlavour *f,
              GError         **error)
{
  GmlpDevice *device = flavour_device (ctx, f, error);

  if (device == NULL)
    return NULL;
  return g_initable_new (GMLP_TYPE_ROUTER, NULL, error,
                         "device", device,
                         "hidden", (gint64) FZ_K,
                         "n-experts", (guint) f->n,
                         "top-k", 2u,
                         "score-function", f->activation,
                         "n-expert-groups", f->role == 1 ? 4u : 0u,
                         "topk-groups", f->role == 1 ? 2u : 0u,
                         "expert-bias", f->role == 1,
                         "aux-loss-coeff", f->role == 1 ? 0.01 : 0.0,
                         "z-loss-coeff", f->role == 1 ? 0.001 : 0.0,
                         "flags", (GmlpLinearFlags) f->flags,
                         NULL);
}

static gpointer
build_quantizer (FzCtx           *ctx,
                 const FzFlavour *f,
                 GError         **error)
{
  g_autoptr(GmlpQuantizer) q = NULL;
  GmlpDevice *device = flavour_device (ctx, f, error);

  if (device == NULL)
    return NULL;
  q = gmlp_quantizer_new (device, f->recipe, GMLP_FP8_FORMAT_HYBRID, f->role);
  if (q == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "no quantizer");
      return NULL;
    }
  if (f->base != NULL)
    {
      /* Used: it has quantized a tensor, so it keeps state for its groups. */
      g_autoptr(GmlpGroupedTensor) out = NULL;
      GmlpGroupedTensor *src = fz_get (ctx, f->base, error);

      if (src == NULL || (out = gmlp_quantizer_quantize (q, src, error)) == NULL)
        return NULL;
    }
  return g_steal_pointer (&q);
}

static gpointer
build_offload (FzCtx           *ctx,
               const FzFlavour *f,
               GError         **error)
{
  GmlpDevice *device = flavour_device (ctx, f, error);
  GmlpOffloadContext *oc;

  if (device == NULL)
    return NULL;
  oc = gmlp_offload_context_new (device, error);
  if (oc != NULL && f->flags != 0)
    gmlp_offload_context_push_thread_default (oc, TRUE);
  return oc;
}

static gpointer
build_event (FzCtx           *ctx,
             const FzFlavour *f,
             GError         **error)
{
  GmlpDevice *device = flavour_device (ctx, f, error);

  if (device == NULL)
    return NULL;
  return gmlp_event_new_recorded (device, error);
}

/* A group of one rank: none of its calls waits for another. */
static gpointer
build_communicator (FzCtx           *ctx,
                    const FzFlavour *f,
                    GError         **error)
{
  GmlpDevice *device = flavour_device (ctx, f, error);
  g_autoptr(GBytes) uid = NULL;

  if (device == NULL || (uid = gmlp_communicator_new_unique_id (device, error)) == NULL)
    return NULL;
  return gmlp_communicator_new (device, uid, 0, 1, error);
}

static gpointer
build_graph (FzCtx           *ctx,
             const FzFlavour *f,
             GError         **error)
{
  GmlpGroupedTensor *t = fz_get (ctx, "x:f32", error);

  if (t == NULL || !gmlp_device_begin_capture (ctx->device, error))
    return NULL;
  if (!gmlp_grouped_tensor_fill_zero (t, error))
    {
      g_autoptr(GmlpGraph) graph = gmlp_device_end_capture (ctx->device, NULL);

      return NULL;
    }
  return gmlp_device_end_capture (ctx->device, error);
}

/* Routings of the tokens of "x:f32:1g" (FZ_ROWS0 + FZ_ROWS1 of them) to
 * FZ_GROUPS experts, top-2, one choice out of range: "routing" permuted
 * once (f->flags), so that combine and the backwards can succeed,
 * "routing:fresh" as made, and "perm", the permute's output (FZ_GROUPS
 * groups of FZ_K columns with device sizes, which a GroupedLinear of the
 * suite's geometry takes too). */
#define FZ_TOKENS (FZ_ROWS0 + FZ_ROWS1)

static gpointer
build_routing_part (FzCtx           *ctx,
                    const FzFlavour *f,
                    GError         **error)
{
  gint64 idx[FZ_TOKENS * 2], rows = FZ_TOKENS;
  float probs[FZ_TOKENS * 2];
  g_autoptr(GBytes) bytes = NULL;
  guint i;

  for (i = 0; i < FZ_TOKENS * 2; i++)
    {
      idx[i] = (i * 7 + i / 2) % FZ_GROUPS;
      probs[i] = 0.5f;
    }
  idx[5] = -1;
  if (f->dtype == GMLP_DTYPE_INT64)
    bytes = g_bytes_new (idx, sizeof idx);
  else
    bytes = g_bytes_new (probs, sizeof probs);
  return gmlp_grouped_tensor_new_from_bytes (ctx->device, f->dtype, &rows, 1, 2, bytes, error);
}

static gpointer
build_routing (FzCtx           *ctx,
               const FzFlavour *f,
               GError         **error)
{
  g_autoptr(GmlpRouting) routing = NULL;
  g_autoptr(GmlpGroupedTensor) perm = NULL;
  GmlpGroupedTensor *indices = fz_get (ctx, "routing:indices", error);
  GmlpGroupedTensor *probs = indices != NULL ? fz_get (ctx, "routing:probs", error) : NULL;
  GmlpGroupedTensor *x = probs != NULL ? fz_get (ctx, "x:f32:1g", error) : NULL;

  if (x == NULL || (routing = gmlp_routing_new (ctx->device, indices, probs, FZ_GROUPS, error)) == NULL)
    return NULL;
  if (f->flags != 0 && (perm = gmlp_routing_permute (routing, x, error)) == NULL)
    return NULL;
  return g_steal_pointer (&routing);
}

static gpointer
build_permuted (FzCtx           *ctx,
                const FzFlavour *f,
                GError         **error)
{
  GmlpRouting *routing = fz_get (ctx, "routing", error);
  GmlpGroupedTensor *x = routing != NULL ? fz_get (ctx, "x:f32:1g", error) : NULL;

  if (x == NULL)
    return NULL;
  return gmlp_routing_permute (routing, x, error);
}

/* The input and the output gradient that fit a layer flavour. */
static char *
input_for (const FzFlavour *layer,
           gboolean         grad)
{
  GmlpDType dtype = layer->dtype;
  gboolean mlp = g_str_equal (layer->type, "GmlpGroupedMLP");
  const char *kind = grad ? (mlp ? "dyh" : "dy") : "x";

  if (layer->n == 3)
    return g_strdup_printf ("%s:f32:3g", kind);
  if (layer->on_cpu)
    return g_strdup_printf ("%s:cpu", kind);
  return g_strdup_printf ("%s:%s", kind, fz_dtype_short (dtype));
}

static gboolean
is_layer_flavour (const FzFlavour *f)
{
  return f != NULL && f->build != build_bare && f->build != build_props && f->build != build_failed &&
         (g_str_equal (f->type, "GmlpGroupedLinear") || g_str_equal (f->type, "GmlpGroupedMLP"));
}

char *
fz_input_for (const char *layer,
              gboolean    grad)
{
  const FzFlavour *f = fz_flavour_lookup (layer);

  /* A router routes one group of tokens. */
  if (f != NULL && f->build == build_router && !grad)
    return g_strdup (f->on_cpu ? "x:cpu:1g" : "x:f32:1g");
  if (!is_layer_flavour (f))
    return NULL;
  return input_for (f, grad);
}

/* What a forward saved. f->base: the layer ("self": the case's instance);
 * f->flags: 1 consumed by a backward, 2 offloaded; the input is the layer's
 * (f->role 1: the device-sized one). */
static gpointer
build_saved (FzCtx           *ctx,
             const FzFlavour *f,
             GError         **error)
{
  g_autoptr(GmlpSavedActivations) saved = NULL;
  g_autoptr(GmlpGroupedTensor) y = NULL;
  g_autofree char *input_name = NULL, *grad_name = NULL;
  g_autoptr(GmlpOffloadContext) oc = NULL;
  const char *layer_name = f->base;
  const FzFlavour *lf;
  GmlpGroupedTensor *x;
  gpointer layer;
  gboolean mlp;

  if (g_str_equal (layer_name, "self"))
    layer_name = is_layer_flavour (fz_flavour_lookup (ctx->self_name)) ? ctx->self_name : "linear:f32";
  lf = fz_flavour_lookup (layer_name);
  mlp = g_str_equal (lf->type, "GmlpGroupedMLP");
  if (f->role == 1)
    {
      input_name = g_strdup ("x:dev:f32");
      grad_name = g_strdup (mlp ? "x:dev:f32@dy" : "dy:dev:f32");
    }
  else
    {
      input_name = input_for (lf, FALSE);
      grad_name = input_for (lf, TRUE);
    }

  layer = fz_get (ctx, layer_name, error);
  x = layer != NULL ? fz_get (ctx, input_name, error) : NULL;
  if (x == NULL)
    return NULL;

  if (f->flags == 2)
    {
      oc = gmlp_offload_context_new (ctx->device, error);
      if (oc == NULL)
        return NULL;
      gmlp_offload_context_push_thread_default (oc, TRUE);
    }
  y = mlp ? gmlp_grouped_mlp_forward (layer, x, &saved, error)
          : gmlp_grouped_linear_forward (layer, x, &saved, error);
  if (oc != NULL && !gmlp_offload_context_pop_thread_default (oc, y != NULL ? error : NULL))
    return NULL;
  if (y == NULL)
    return NULL;

  if (f->flags == 1)
    {
      g_autoptr(GmlpGroupedTensor) dx = NULL;
      GmlpGroupedTensor *dy = fz_get (ctx, grad_name, error);

      if (dy == NULL)
        return NULL;
      dx = mlp ? gmlp_grouped_mlp_backward (layer, saved, dy, error)
               : gmlp_grouped_linear_backward (layer, saved, dy, error);
      if (dx == NULL)
        return NULL;
    }
  return g_steal_pointer (&saved);
}

static gpointer
build_bytes (FzCtx           *ctx,
             const FzFlavour *f,
             GError         **error)
{
  if (f->n % 4 == 0)
    return make_data (GMLP_DTYPE_FLOAT32, f->n / 4, g_str_hash (f->name), f->flags != 0);
  return g_bytes_new_take (g_malloc0 (MAX (f->n, 1)), f->n);
}

/* GVariants: a quantizer's state, and that state with one entry changed. */
static GVariant *
mutate_entry (GVariant *value,
              int       how)
{
  static const double odd_values[] = { NAN, -1.0, INFINITY, 0.0, 1e300 };

  if (how == 3)
    return g_variant_new_string ("bogus");
  switch (g_variant_classify (value))
    {
    case G_VARIANT_CLASS_UINT32:
      return g_variant_new_uint32 (how == 0 ? G_MAXUINT32 : how == 1 ? 0 : 65536);
    case G_VARIANT_CLASS_INT32:
      return g_variant_new_int32 (how == 0 ? G_MININT32 : how == 1 ? G_MAXINT32 : -1);
    case G_VARIANT_CLASS_STRING:
      return g_variant_new_string (how == 0 ? "bogus" : how == 1 ? "" : "e5m2");
    case G_VARIANT_CLASS_ARRAY:
      {
        const GVariantType *elem = g_variant_type_element (g_variant_get_type (value));
        gsize n = how == 0 ? 0 : how == 1 ? g_variant_n_children (value) : 100000;
        g_autoptr(GVariantBuilder) b = g_variant_builder_new (g_variant_get_type (value));
        gsize i;

        for (i = 0; i < n; i++)
          {
            double v = odd_values[i % G_N_ELEMENTS (odd_values)];

            if (g_variant_type_equal (elem, G_VARIANT_TYPE_DOUBLE))
              g_variant_builder_add (b, "d", v);
            else if (g_variant_type_equal (elem, G_VARIANT_TYPE ("f")) )
              g_variant_builder_add_value (b, g_variant_new_double (v));
            else
              return g_variant_new_string ("bogus");
          }
        return g_variant_builder_end (b);
      }
    default:
      return g_variant_new_boolean (TRUE);
    }
}

static gpointer
build_variant (FzCtx           *ctx,
               const FzFlavour *f,
               GError         **error)
{
  g_autoptr(GVariant) state = NULL;
  GVariantBuilder b;
  GVariantIter iter;
  GmlpQuantizer *q;
  const char *key;
  GVariant *value;
  gsize n, k, i = 0;

  if (g_str_equal (f->name, "var:int"))
    return g_variant_ref_sink (g_variant_new_int32 (1));
  if (g_str_equal (f->name, "var:empty-dict"))
    return g_variant_ref_sink (g_variant_new ("a{sv}", NULL));

  q = fz_get (ctx, f->base, error);
  if (q == NULL || (state = gmlp_quantizer_save_state (q, error)) == NULL)
    return NULL;
  if (f->layout < 0)
    return g_steal_pointer (&state);

  /* Entry f->n (modulo their number) changed as f->layout says, or
   * removed (4). */
  n = g_variant_n_children (state);
  k = (gsize) f->n % MAX (n, 1);
  g_variant_builder_init (&b, G_VARIANT_TYPE_VARDICT);
  g_variant_iter_init (&iter, state);
  while (g_variant_iter_next (&iter, "{&sv}", &key, &value))
    {
      if (i == k)
        {
          fz_note (ctx, "state entry %s %s", key, f->layout == 4 ? "removed" : "changed");
          if (f->layout != 4)
            g_variant_builder_add (&b, "{sv}", key, mutate_entry (value, f->layout));
        }
      else
        g_variant_builder_add (&b, "{sv}", key, value);
      g_variant_unref (value);
      i++;
    }
  return g_variant_ref_sink (g_variant_builder_end (&b));
}

/* The catalogue */

static FzFlavour *
add (const char  *name,
     const char  *type,
     FzBuildFunc  build)
{
  FzFlavour *f = g_new0 (FzFlavour, 1);

  f->name = g_strdup (name);
  f->type = g_strdup (type);
  f->kind = g_str_equal (type, "GBytes") ? FZ_VALUE_BYTES
          : g_str_equal (type, "GVariant") ? FZ_VALUE_VARIANT : FZ_VALUE_OBJECT;
  f->build = build;
  f->recipe = GMLP_SCALING_RECIPE_NONE;
  g_ptr_array_add (catalogue, f);
  return f;
}

static FzFlavour *
add_tensor (const char *name,
            GmlpDType   dtype,
            int         layout,
            gint64      cols)
{
  FzFlavour *f = add (name, "GmlpGroupedTensor", build_tensor);

  f->dtype = dtype;
  f->layout = layout;
  f->n = cols;
  return f;
}

/* The flavours every class has: made by g_object_new() with no property
 * ("bare"), with its construct properties and no g_initable_init()
 * ("props"), and, where a group count can be zero, after an init that
 * failed on it ("failed"). */
static void
add_generic (GIObjectInfo *info)
{
  const char *type = g_registered_type_info_get_type_name ((GIRegisteredTypeInfo *) info);
  g_autofree char *qual = g_strdup_printf ("%s.%s", g_base_info_get_namespace (info),
                                           g_base_info_get_name (info));
  g_autofree char *name = NULL;
  g_autoptr(GTypeClass) klass = NULL;
  GParamSpec *groups;
  gboolean initable = FALSE;
  gboolean construct = FALSE;
  FzFlavour *f;
  int i;

  /* Registering the type touches no device. */
  klass = g_type_class_ref (g_registered_type_info_get_g_type ((GIRegisteredTypeInfo *) info));
  for (i = 0; i < g_object_info_get_n_interfaces (info); i++)
    {
      FzAutoInfo iface = g_object_info_get_interface (info, i);

      if (g_str_equal (g_base_info_get_name (iface), "Initable"))
        initable = TRUE;
    }
  for (i = 0; i < g_object_info_get_n_properties (info); i++)
    {
      FzAutoInfo prop = g_object_info_get_property (info, i);
      GParamFlags flags = g_property_info_get_flags (prop);

      if ((flags & G_PARAM_WRITABLE) && (flags & (G_PARAM_CONSTRUCT | G_PARAM_CONSTRUCT_ONLY)))
        construct = TRUE;
    }

  name = g_strdup_printf ("%s:bare", qual);
  f = add (name, type, build_bare);
  f->info = g_base_info_ref (info);
  f->special = TRUE;
  if (construct)
    {
      g_free (name);
      name = g_strdup_printf ("%s:props", qual);
      f = add (name, type, build_props);
      f->info = g_base_info_ref (info);
      /* With GInitable, "props" is the object before g_initable_init(); else
       * it is how the library itself makes one: then it is well-made. */
      f->special = initable;
    }
  groups = g_object_class_find_property (G_OBJECT_CLASS (klass), "n-groups");
  if (initable && groups != NULL && (groups->flags & G_PARAM_WRITABLE) &&
      (groups->flags & (G_PARAM_CONSTRUCT | G_PARAM_CONSTRUCT_ONLY)) && fz_pspec_takes (groups, 0))
    {
      g_free (name);
      name = g_strdup_printf ("%s:failed", qual);
      f = add (name, type, build_failed);
      f->info = g_base_info_ref (info);
      f->base = g_strdup ("n-groups");
      f->n = 0;
      f->special = TRUE;
    }
}

void
fz_catalogue_init (GIRepository *repo,
                   gboolean      cuda)
{
  static const struct { const char *name; GmlpActivation act; GmlpDType dtype; int flags; } mlps[] = {
    { "mlp:f32:gelu", GMLP_ACTIVATION_GELU, GMLP_DTYPE_FLOAT32, 0 },
    { "mlp:bf16:swiglu", GMLP_ACTIVATION_SWIGLU, GMLP_DTYPE_BFLOAT16, 0 },
    { "mlp:f16:relu:bias", GMLP_ACTIVATION_RELU, GMLP_DTYPE_FLOAT16, GMLP_LINEAR_BIAS },
    { "mlp:f32:srelu:recompute", GMLP_ACTIVATION_SRELU, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_RECOMPUTE_ACTIVATION },
    { "mlp:f32:geglu:delay", GMLP_ACTIVATION_GEGLU, GMLP_DTYPE_FLOAT32, GMLP_LINEAR_DELAY_WGRAD_COMPUTE },
    { "mlp:f32:gelu:fuse", GMLP_ACTIVATION_GELU, GMLP_DTYPE_FLOAT32,
      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION },
  };
  static const struct { const char *name; GmlpDType dtype; int flags; } linears[] = {
    { "linear:f32", GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT },
    { "linear:f16", GMLP_DTYPE_FLOAT16, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT },
    { "linear:bf16", GMLP_DTYPE_BFLOAT16, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT },
    { "linear:f32:per-group", GMLP_DTYPE_FLOAT32, GMLP_LINEAR_NONE },
    { "linear:f32:bias", GMLP_DTYPE_FLOAT32, GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_BIAS },
    { "linear:bf16:bias:per-group", GMLP_DTYPE_BFLOAT16, GMLP_LINEAR_BIAS },
    { "linear:f32:fuse", GMLP_DTYPE_FLOAT32,
      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION },
    { "linear:f32:delay", GMLP_DTYPE_FLOAT32,
      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_DELAY_WGRAD_COMPUTE },
    { "linear:bf16:fuse:delay", GMLP_DTYPE_BFLOAT16,
      GMLP_LINEAR_SINGLE_GROUPED_WEIGHT | GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION |
      GMLP_LINEAR_DELAY_WGRAD_COMPUTE | GMLP_LINEAR_BIAS },
  };
  g_autofree char *name = NULL;
  FzFlavour *f;
  guint i, j;
  int n;

  catalogue = g_ptr_array_new ();
  by_name = g_hash_table_new (g_str_hash, g_str_equal);
  by_type = g_hash_table_new (g_str_hash, g_str_equal);

  /* Devices */
  add ("dev", "GmlpDevice", build_device);
  if (cuda)
    {
      f = add ("dev:cpu", "GmlpDevice", build_device);
      f->on_cpu = TRUE;
      f->special = TRUE;
    }

  /* Tensors */
  for (i = 0; i < G_N_ELEMENTS (all_dtypes); i++)
    {
      g_free (name);
      name = g_strdup_printf ("x:%s", fz_dtype_short (all_dtypes[i]));
      f = add_tensor (name, all_dtypes[i], LAYOUT_STD, FZ_K);
      f->special = all_dtypes[i] != GMLP_DTYPE_FLOAT32;
    }
  for (i = 0; i < G_N_ELEMENTS (float_dtypes); i++)
    {
      g_free (name);
      name = g_strdup_printf ("dy:%s", fz_dtype_short (float_dtypes[i]));
      add_tensor (name, float_dtypes[i], LAYOUT_STD, FZ_O);
      g_free (name);
      name = g_strdup_printf ("dyh:%s", fz_dtype_short (float_dtypes[i]));
      add_tensor (name, float_dtypes[i], LAYOUT_STD, FZ_K);
    }
  add_tensor ("x:f32:3g", GMLP_DTYPE_FLOAT32, LAYOUT_3G, FZ_K);
  add_tensor ("dy:f32:3g", GMLP_DTYPE_FLOAT32, LAYOUT_3G, FZ_O);
  add_tensor ("dyh:f32:3g", GMLP_DTYPE_FLOAT32, LAYOUT_3G, FZ_K);
  add_tensor ("x:f32:1g", GMLP_DTYPE_FLOAT32, LAYOUT_1G, FZ_K)->special = TRUE;
  add_tensor ("x:f32:64g", GMLP_DTYPE_FLOAT32, LAYOUT_64G, FZ_K);
  add_tensor ("x:f32:65535g", GMLP_DTYPE_FLOAT32, LAYOUT_MAXG, FZ_K)->special = TRUE;
  add_tensor ("x:f32:empty", GMLP_DTYPE_FLOAT32, LAYOUT_EMPTY, FZ_K)->special = TRUE;
  add_tensor ("dy:f32:empty", GMLP_DTYPE_FLOAT32, LAYOUT_EMPTY, FZ_O);
  add_tensor ("x:f32:cols7", GMLP_DTYPE_FLOAT32, LAYOUT_STD, 7)->special = TRUE;
  add_tensor ("x:f32:cols128", GMLP_DTYPE_FLOAT32, LAYOUT_STD, 128);
  add_tensor ("dy:f32:cols16", GMLP_DTYPE_FLOAT32, LAYOUT_STD, FZ_K);
  if (cuda)
    {
      f = add_tensor ("x:cpu", GMLP_DTYPE_FLOAT32, LAYOUT_STD, FZ_K);
      f->on_cpu = TRUE;
      f->special = TRUE;
      f = add_tensor ("dy:cpu", GMLP_DTYPE_FLOAT32, LAYOUT_STD, FZ_O);
      f->on_cpu = TRUE;
      f = add_tensor ("dyh:cpu", GMLP_DTYPE_FLOAT32, LAYOUT_STD, FZ_K);
      f->on_cpu = TRUE;
    }
  add ("sizes", "GmlpGroupedTensor", build_sizes);
  add ("sizes:hostile", "GmlpGroupedTensor", build_sizes)->layout = LAYOUT_EMPTY;
  f = add ("x:dev:f32", "GmlpGroupedTensor", build_device_sized);
  f->dtype = GMLP_DTYPE_FLOAT32, f->n = FZ_K, f->base = g_strdup ("sizes"), f->special = TRUE;
  f = add ("dy:dev:f32", "GmlpGroupedTensor", build_device_sized);
  f->dtype = GMLP_DTYPE_FLOAT32, f->n = FZ_O, f->base = g_strdup ("sizes");
  f = add ("x:dev:hostile", "GmlpGroupedTensor", build_device_sized);
  f->dtype = GMLP_DTYPE_FLOAT32, f->n = FZ_K, f->base = g_strdup ("sizes:hostile"), f->special = TRUE;
  f = add ("w:f32", "GmlpGroupedTensor", build_uniform);
  f->dtype = GMLP_DTYPE_FLOAT32;
  f = add ("w:bf16", "GmlpGroupedTensor", build_uniform);
  f->dtype = GMLP_DTYPE_BFLOAT16;
  f = add ("w1:f32", "GmlpGroupedTensor", build_uniform);
  f->dtype = GMLP_DTYPE_FLOAT32, f->layout = LAYOUT_1G;
  f = add ("member", "GmlpGroupedTensor", build_member);
  f->base = g_strdup ("x:f32"), f->n = 1, f->special = TRUE;
  f = add ("member:empty", "GmlpGroupedTensor", build_member);
  f->base = g_strdup ("x:f32:empty"), f->n = 0, f->special = TRUE;
  for (i = 0; i < G_N_ELEMENTS (recipes); i++)
    {
      g_free (name);
      name = g_strdup_printf ("fp8:%s", recipe_short (recipes[i]));
      f = add (name, "GmlpGroupedTensor", build_fp8);
      f->recipe = recipes[i], f->role = GMLP_QUANTIZER_ROLE_INPUT, f->special = TRUE;
      f->base = g_strdup ("x:f32:cols128");
    }
  f = add ("fp8:current:k16", "GmlpGroupedTensor", build_fp8);
  f->recipe = GMLP_SCALING_RECIPE_CURRENT, f->role = GMLP_QUANTIZER_ROLE_INPUT;
  f->base = g_strdup ("x:f32");
  f = add ("fp8:blockwise:col", "GmlpGroupedTensor", build_fp8);
  f->recipe = GMLP_SCALING_RECIPE_BLOCKWISE, f->role = GMLP_QUANTIZER_ROLE_INPUT, f->flags = 1;
  f->base = g_strdup ("x:f32:cols128"), f->special = TRUE;
  f = add ("fp8:blockwise:col-only", "GmlpGroupedTensor", build_part);
  f->base = g_strdup ("fp8:blockwise:col"), f->special = TRUE;
  f = add ("fp8:mxfp8:scale-inv", "GmlpGroupedTensor", build_part);
  f->base = g_strdup ("fp8:mxfp8"), f->special = TRUE;
  f = add ("lin:weight", "GmlpGroupedTensor", build_part);
  f->base = g_strdup ("linear:f32");
  f = add ("lin:wgrad", "GmlpGroupedTensor", build_part);
  f->base = g_strdup ("linear:f32");

  /* Layers */
  for (i = 0; i < G_N_ELEMENTS (linears); i++)
    {
      f = add (linears[i].name, "GmlpGroupedLinear", build_linear);
      f->dtype = linears[i].dtype, f->flags = linears[i].flags, f->n = FZ_GROUPS;
    }
  f = add ("linear:f32:3g", "GmlpGroupedLinear", build_linear);
  f->dtype = GMLP_DTYPE_FLOAT32, f->flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, f->n = 3;
  f = add ("linear:f32:other", "GmlpGroupedLinear", build_linear);
  f->dtype = GMLP_DTYPE_FLOAT32, f->flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, f->n = FZ_GROUPS;
  for (i = 0; i < G_N_ELEMENTS (recipes); i++)
    {
      g_free (name);
      name = g_strdup_printf ("linear:fp8:%s", recipe_short (recipes[i]));
      f = add (name, "GmlpGroupedLinear", build_linear);
      f->dtype = GMLP_DTYPE_BFLOAT16, f->flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT;
      f->n = FZ_GROUPS, f->recipe = recipes[i], f->special = recipes[i] == GMLP_SCALING_RECIPE_DELAYED;
    }
  if (cuda)
    {
      f = add ("linear:cpu", "GmlpGroupedLinear", build_linear);
      f->dtype = GMLP_DTYPE_FLOAT32, f->flags = GMLP_LINEAR_SINGLE_GROUPED_WEIGHT, f->n = FZ_GROUPS;
      f->on_cpu = TRUE, f->special = TRUE;
    }
  f = add ("mlp:fc1", "GmlpGroupedLinear", build_part);
  f->base = g_strdup ("mlp:f32:gelu");

  for (i = 0; i < G_N_ELEMENTS (mlps); i++)
    {
      f = add (mlps[i].name, "GmlpGroupedMLP", build_mlp);
      f->dtype = mlps[i].dtype, f->flags = mlps[i].flags, f->activation = mlps[i].act, f->n = FZ_GROUPS;
    }
  f = add ("mlp:f32:gelu:3g", "GmlpGroupedMLP", build_mlp);
  f->dtype = GMLP_DTYPE_FLOAT32, f->activation = GMLP_ACTIVATION_GELU, f->n = 3;
  for (i = 0; i < G_N_ELEMENTS (recipes); i++)
    {
      g_free (name);
      name = g_strdup_printf ("mlp:fp8:%s", recipe_short (recipes[i]));
      f = add (name, "GmlpGroupedMLP", build_mlp);
      f->dtype = GMLP_DTYPE_BFLOAT16, f->activation = GMLP_ACTIVATION_SWIGLU;
      f->n = FZ_GROUPS, f->recipe = recipes[i], f->special = recipes[i] == GMLP_SCALING_RECIPE_MXFP8;
    }
  if (cuda)
    {
      f = add ("mlp:cpu", "GmlpGroupedMLP", build_mlp);
      f->dtype = GMLP_DTYPE_FLOAT32, f->activation = GMLP_ACTIVATION_GELU, f->n = FZ_GROUPS;
      f->on_cpu = TRUE, f->special = TRUE;
    }

  /* Routers */
  f = add ("router", "GmlpRouter", build_router);
  f->n = 8, f->activation = GMLP_SCORE_FUNCTION_SOFTMAX, f->special = TRUE;
  f = add ("router:deepseek", "GmlpRouter", build_router);
  f->n = 16, f->activation = GMLP_SCORE_FUNCTION_SIGMOID, f->role = 1, f->special = TRUE;
  f = add ("router:fuse:delay", "GmlpRouter", build_router);
  f->n = 8, f->activation = GMLP_SCORE_FUNCTION_SOFTMAX, f->special = TRUE;
  f->flags = GMLP_LINEAR_FUSE_WGRAD_ACCUMULATION | GMLP_LINEAR_DELAY_WGRAD_COMPUTE;
  if (cuda)
    {
      f = add ("router:cpu", "GmlpRouter", build_router);
      f->n = 8, f->activation = GMLP_SCORE_FUNCTION_SOFTMAX, f->on_cpu = TRUE, f->special = TRUE;
      f = add ("x:cpu:1g", "GmlpGroupedTensor", build_tensor);
      f->dtype = GMLP_DTYPE_FLOAT32, f->layout = LAYOUT_1G, f->n = FZ_K, f->on_cpu = TRUE;
    }

  /* Quantizers */
  for (i = 0; i < G_N_ELEMENTS (recipes); i++)
    for (j = 0; j < 3; j++)
      {
        g_free (name);
        name = g_strdup_printf ("q:%s:%s", recipe_short (recipes[i]), role_short (j));
        f = add (name, "GmlpQuantizer", build_quantizer);
        f->recipe = recipes[i], f->role = j;
      }
  f = add ("q:delayed:used", "GmlpQuantizer", build_quantizer);
  f->recipe = GMLP_SCALING_RECIPE_DELAYED, f->role = GMLP_QUANTIZER_ROLE_INPUT;
  f->base = g_strdup ("x:f32"), f->special = TRUE;
  f = add ("q:delayed:used-3g", "GmlpQuantizer", build_quantizer);
  f->recipe = GMLP_SCALING_RECIPE_DELAYED, f->role = GMLP_QUANTIZER_ROLE_INPUT;
  f->base = g_strdup ("x:f32:3g");
  if (cuda)
    {
      f = add ("q:cpu", "GmlpQuantizer", build_quantizer);
      f->recipe = GMLP_SCALING_RECIPE_CURRENT, f->on_cpu = TRUE, f->special = TRUE;
    }

  /* Offload contexts, saved activations, events, graphs */
  add ("offload", "GmlpOffloadContext", build_offload);
  add ("offload:pushed", "GmlpOffloadContext", build_offload)->flags = 1;
  if (cuda)
    {
      f = add ("offload:cpu", "GmlpOffloadContext", build_offload);
      f->on_cpu = TRUE, f->special = TRUE;
    }
  {
    static const struct { const char *name; const char *layer; int flags; int role; gboolean special; } saved[] = {
      { "saved:self", "self", 0, 0, FALSE },
      { "saved:linear", "linear:f32", 0, 0, FALSE },
      { "saved:other-layer", "linear:f32:other", 0, 0, TRUE },
      { "saved:mlp", "mlp:f32:gelu", 0, 0, TRUE },
      { "saved:consumed", "linear:f32", 1, 0, TRUE },
      { "saved:mlp-consumed", "mlp:f32:gelu", 1, 0, FALSE },
      { "saved:offloaded", "linear:f32", 2, 0, TRUE },
      { "saved:fp8", "linear:fp8:current", 0, 0, TRUE },
      { "saved:delay", "linear:f32:delay", 0, 0, FALSE },
      { "saved:dev", "linear:f32", 0, 1, TRUE },
      { "saved:3g", "linear:f32:3g", 0, 0, FALSE },
    };

    for (i = 0; i < G_N_ELEMENTS (saved); i++)
      {
        f = add (saved[i].name, "GmlpSavedActivations", build_saved);
        f->base = g_strdup (saved[i].layer), f->flags = saved[i].flags, f->role = saved[i].role;
        f->special = saved[i].special;
      }
  }
  f = add ("routing:indices", "GmlpGroupedTensor", build_routing_part);
  f->dtype = GMLP_DTYPE_INT64, f->special = TRUE;
  f = add ("routing:probs", "GmlpGroupedTensor", build_routing_part);
  f->dtype = GMLP_DTYPE_FLOAT32, f->special = TRUE;
  add ("routing", "GmlpRouting", build_routing)->flags = 1;
  add ("routing:fresh", "GmlpRouting", build_routing)->special = TRUE;
  f = add ("perm", "GmlpGroupedTensor", build_permuted);
  f->dtype = GMLP_DTYPE_FLOAT32, f->n = FZ_K, f->special = TRUE;
  add ("event", "GmlpEvent", build_event);
  add ("comm", "GmlpCommunicator", build_communicator);
  if (cuda)
    {
      f = add ("event:cpu", "GmlpEvent", build_event);
      f->on_cpu = TRUE, f->special = TRUE;
      add ("graph", "GmlpGraph", build_graph);
    }

  /* Bytes and variants */
  for (i = 0; i < fz_n_bytes_sizes; i++)
    {
      g_free (name);
      name = g_strdup_printf ("bytes:%" G_GSIZE_FORMAT, fz_bytes_sizes[i]);
      add (name, "GBytes", build_bytes)->n = fz_bytes_sizes[i];
      if (fz_bytes_sizes[i] >= 128 && fz_bytes_sizes[i] <= 4096)
        {
          g_free (name);
          name = g_strdup_printf ("bytes:nan:%" G_GSIZE_FORMAT, fz_bytes_sizes[i]);
          f = add (name, "GBytes", build_bytes);
          f->n = fz_bytes_sizes[i], f->flags = 1;
        }
    }
  add ("var:int", "GVariant", build_variant);
  add ("var:empty-dict", "GVariant", build_variant);
  f = add ("var:state:delayed", "GVariant", build_variant);
  f->base = g_strdup ("q:delayed:used"), f->layout = -1;
  f = add ("var:state:delayed-3g", "GVariant", build_variant);
  f->base = g_strdup ("q:delayed:used-3g"), f->layout = -1;
  f = add ("var:state:current", "GVariant", build_variant);
  f->base = g_strdup ("q:current:input"), f->layout = -1;
  f = add ("var:state:fresh", "GVariant", build_variant);
  f->base = g_strdup ("q:delayed:input"), f->layout = -1;
  for (n = 0; n < 12; n++)
    for (j = 0; j < 5; j++)
      {
        g_free (name);
        name = g_strdup_printf ("var:state:entry%d:%s", n,
                                (const char *[]) { "min", "zero", "big", "wrong-type", "missing" }[j]);
        f = add (name, "GVariant", build_variant);
        f->base = g_strdup ("q:delayed:used"), f->n = n, f->layout = j;
      }

  /* Every class of the namespace: unfinished, and failed. */
  for (n = 0; n < g_irepository_get_n_infos (repo, "Gmlp"); n++)
    {
      FzAutoInfo info = g_irepository_get_info (repo, "Gmlp", n);

      if (g_base_info_get_type (info) == GI_INFO_TYPE_OBJECT)
        add_generic ((GIObjectInfo *) info);
    }

  for (i = 0; i < catalogue->len; i++)
    {
      FzFlavour *fl = catalogue->pdata[i];
      GPtrArray *list = g_hash_table_lookup (by_type, fl->type);

      g_hash_table_insert (by_name, fl->name, fl);
      if (list == NULL)
        {
          list = g_ptr_array_new ();
          g_hash_table_insert (by_type, fl->type, list);
        }
      g_ptr_array_add (list, fl);
    }
}

const FzFlavour *
fz_flavour_lookup (const char *name)
{
  g_autofree char *base = NULL;
  const char *hash;

  if (name == NULL)
    return NULL;
  hash = strchr (name, '@');
  if (hash == NULL)
    return g_hash_table_lookup (by_name, name);
  base = g_strndup (name, hash - name);
  return g_hash_table_lookup (by_name, base);
}

GPtrArray *
fz_flavours_of_type (const char *type)
{
  return g_hash_table_lookup (by_type, type);
}

const char *
fz_default_flavour (const char *type)
{
  static const char *defaults[][2] = {
    { "GmlpDevice", "dev" },
    { "GmlpGroupedTensor", "x:f32" },
    { "GmlpGroupedLinear", "linear:f32" },
    { "GmlpGroupedMLP", "mlp:f32:gelu" },
    { "GmlpRouter", "router" },
    { "GmlpQuantizer", "q:current:input" },
    { "GmlpOffloadContext", "offload" },
    { "GmlpSavedActivations", "saved:self" },
    { "GmlpEvent", "event" },
    { "GmlpRouting", "routing" },
    { "GmlpGraph", "graph" },
    { "GmlpCommunicator", "comm" },
    { "GBytes", "bytes:512" },
    { "GVariant", "var:state:delayed" },
  };
  GPtrArray *list;
  guint i;

  for (i = 0; i < G_N_ELEMENTS (defaults); i++)
    if (g_str_equal (type, defaults[i][0]) && g_hash_table_contains (by_name, defaults[i][1]))
      return defaults[i][1];
  list = fz_flavours_of_type (type);
  return list != NULL && list->len > 0 ? ((FzFlavour *) list->pdata[0])->name : NULL;
}

GmlpDType
fz_flavour_dtype (const char *name)
{
  const FzFlavour *f = fz_flavour_lookup (name);

  if (f != NULL && (f->build == build_tensor || f->build == build_linear || f->build == build_mlp ||
                    f->build == build_uniform || f->build == build_device_sized))
    return f->dtype;
  return GMLP_DTYPE_FLOAT32;
}

/* Building */

static void
built_free (FzBuilt *b)
{
  switch (b->kind)
    {
    case FZ_VALUE_OBJECT: g_clear_object (&b->value); break;
    case FZ_VALUE_BYTES: g_clear_pointer (&b->value, g_bytes_unref); break;
    case FZ_VALUE_VARIANT: g_clear_pointer (&b->value, g_variant_unref); break;
    default: break;
    }
  g_free (b->name);
  g_free (b);
}

gpointer
fz_get (FzCtx       *ctx,
        const char  *name,
        GError     **error)
{
  const FzFlavour *f;
  FzBuilt *b = g_hash_table_lookup (ctx->built, name);
  gboolean in_call = ctx->in_call;
  gpointer value;

  if (b != NULL)
    return b->value;

  f = fz_flavour_lookup (name);
  if (f == NULL)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "no flavour %s", name);
      return NULL;
    }

  /* Logs while building are judged as outside the call under test. */
  ctx->in_call = FALSE;
  value = f->build (ctx, f, error);
  ctx->in_call = in_call;
  if (value == NULL)
    {
      if (error != NULL && *error == NULL)
        g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT, "%s could not be made", name);
      if (error != NULL)
        g_prefix_error (error, "%s: ", name);
      return NULL;
    }

  b = g_new0 (FzBuilt, 1);
  b->name = g_strdup (name);
  b->kind = f->kind;
  b->value = value;
  g_hash_table_insert (ctx->built, b->name, b);
  g_ptr_array_add (ctx->order, b);
  return value;
}

void
fz_ctx_clear_built (FzCtx *ctx)
{
  guint i;

  /* Newest first: what was made from something goes before it. */
  for (i = ctx->order->len; i > 0; i--)
    {
      FzBuilt *b = ctx->order->pdata[i - 1];

      g_hash_table_remove (ctx->built, b->name);
      built_free (b);
    }
  g_ptr_array_set_size (ctx->order, 0);
}
