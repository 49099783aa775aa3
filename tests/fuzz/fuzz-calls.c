/* fuzz-calls.c: every function of the Gmlp namespace, called through
 * GObject-Introspection
 *
 * The callables are found in the typelib (methods, constructors and static
 * functions of the classes, functions of the enums, global functions) and
 * invoked with g_function_info_invoke(), their arguments built from the arg
 * infos as a binding would: an array and its length argument agree, out
 * arguments get storage (or NULL where optional), and what (transfer full)
 * returns is freed. The cases: every readable property of every flavour,
 * g_object_new() with one hostile construct property, every method on every
 * special instance with sane arguments, and random calls with one to three
 * arguments made hostile.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gmlp-fuzz.h"

/* DLPack's DLManagedTensor (the ABI of v0.8), as a consumer of
 * gmlp_grouped_tensor_to_dlpack() sees it. */
typedef struct DLManaged {
  void     *data;
  int32_t   device[2];
  int32_t   ndim;
  uint8_t   dtype[4];
  int64_t  *shape;
  int64_t  *strides;
  uint64_t  byte_offset;
  void     *manager_ctx;
  void    (*deleter) (struct DLManaged *self);
} DLManaged;

typedef enum {
  P_BOOL,
  P_INT,
  P_FLOAT,
  P_DOUBLE,
  P_ENUM,
  P_FLAGS,
  P_OBJECT,
  P_BYTES,
  P_VARIANT,
  P_STRING,
  P_ARRAY,
  P_POINTER,
  P_UNSUPPORTED,
} FzParamKind;

typedef struct {
  char         *name;
  GIDirection   dir;
  GITypeTag     tag;          /* P_INT, P_ARRAY's elements */
  FzParamKind   kind;
  GIBaseInfo   *iface;        /* enums, flags */
  char         *type;         /* GType name of objects */
  gboolean      nullable;
  gboolean      optional;
  GITransfer    transfer;
  int           length_of;    /* this is the length of that argument, or -1 */
  int           length_arg;   /* P_ARRAY: index of the length argument, or -1 */
} FzParam;

typedef struct {
  FzCallable    pub;
  FzParam      *params;
  guint         n_params;
  gboolean      supported;
} Callable;

static GPtrArray *callables;   /* Callable, by qualified name */

/* Introspection of the arguments */

static void
describe_type (GITypeInfo *ti,
               FzParam    *p)
{
  GITypeTag tag = g_type_info_get_tag (ti);

  p->tag = tag;
  switch (tag)
    {
    case GI_TYPE_TAG_BOOLEAN:
      p->kind = P_BOOL;
      break;
    case GI_TYPE_TAG_INT8: case GI_TYPE_TAG_UINT8:
    case GI_TYPE_TAG_INT16: case GI_TYPE_TAG_UINT16:
    case GI_TYPE_TAG_INT32: case GI_TYPE_TAG_UINT32:
    case GI_TYPE_TAG_INT64: case GI_TYPE_TAG_UINT64:
      p->kind = P_INT;
      break;
    case GI_TYPE_TAG_FLOAT:
      p->kind = P_FLOAT;
      break;
    case GI_TYPE_TAG_DOUBLE:
      p->kind = P_DOUBLE;
      break;
    case GI_TYPE_TAG_UTF8:
    case GI_TYPE_TAG_FILENAME:
      p->kind = P_STRING;
      break;
    case GI_TYPE_TAG_VOID:
      p->kind = g_type_info_is_pointer (ti) ? P_POINTER : P_UNSUPPORTED;
      break;
    case GI_TYPE_TAG_ARRAY:
      {
        FzAutoInfo elem = g_type_info_get_param_type (ti, 0);

        p->kind = g_type_info_get_array_type (ti) == GI_ARRAY_TYPE_C &&
                  g_type_info_get_array_length (ti) >= 0 ? P_ARRAY : P_UNSUPPORTED;
        p->length_arg = g_type_info_get_array_length (ti);
        p->tag = g_type_info_get_tag (elem);
        if (p->tag != GI_TYPE_TAG_INT64 && p->tag != GI_TYPE_TAG_BOOLEAN &&
            p->tag != GI_TYPE_TAG_INT32 && p->tag != GI_TYPE_TAG_UINT32)
          p->kind = P_UNSUPPORTED;
        break;
      }
    case GI_TYPE_TAG_INTERFACE:
      {
        GIBaseInfo *iface = g_type_info_get_interface (ti);
        GIInfoType itype = g_base_info_get_type (iface);

        if (itype == GI_INFO_TYPE_ENUM || itype == GI_INFO_TYPE_FLAGS)
          {
            p->kind = itype == GI_INFO_TYPE_ENUM ? P_ENUM : P_FLAGS;
            p->iface = g_base_info_ref (iface);
          }
        else if (itype == GI_INFO_TYPE_OBJECT)
          {
            p->kind = P_OBJECT;
            p->type = g_strdup (g_registered_type_info_get_type_name (iface));
          }
        else if (g_str_equal (g_base_info_get_namespace (iface), "GLib") &&
                 g_str_equal (g_base_info_get_name (iface), "Bytes"))
          p->kind = P_BYTES;
        else if (g_str_equal (g_base_info_get_namespace (iface), "GLib") &&
                 g_str_equal (g_base_info_get_name (iface), "Variant"))
          p->kind = P_VARIANT;
        else
          p->kind = P_UNSUPPORTED;
        g_base_info_unref (iface);
        break;
      }
    default:
      p->kind = P_UNSUPPORTED;
    }
}

static Callable *
callable_new (GIFunctionInfo *info,
              const char     *qualname,
              const char     *container)
{
  Callable *c = g_new0 (Callable, 1);
  guint i;

  c->pub.info = g_base_info_ref (info);
  c->pub.qualname = g_strdup (qualname);
  c->pub.symbol = g_function_info_get_symbol (info);
  c->pub.container = g_strdup (container);
  c->pub.is_method = g_callable_info_is_method (info);
  c->pub.throws = g_callable_info_can_throw_gerror (info);
  c->n_params = g_callable_info_get_n_args (info);
  c->params = g_new0 (FzParam, c->n_params);
  c->supported = TRUE;
  for (i = 0; i < c->n_params; i++)
    c->params[i].length_of = -1;

  for (i = 0; i < c->n_params; i++)
    {
      FzAutoInfo ai = g_callable_info_get_arg (info, i);
      FzAutoInfo ti = g_arg_info_get_type (ai);
      FzParam *p = &c->params[i];

      p->name = g_strdup (g_base_info_get_name (ai));
      p->dir = g_arg_info_get_direction (ai);
      p->nullable = g_arg_info_may_be_null (ai);
      p->optional = g_arg_info_is_optional (ai) || (p->dir != GI_DIRECTION_IN && p->nullable);
      p->transfer = g_arg_info_get_ownership_transfer (ai);
      p->length_arg = -1;
      describe_type (ti, p);
      if (p->kind == P_UNSUPPORTED || p->dir == GI_DIRECTION_INOUT ||
          (p->dir == GI_DIRECTION_OUT && g_arg_info_is_caller_allocates (ai)))
        c->supported = FALSE;
    }
  for (i = 0; i < c->n_params; i++)
    if (c->params[i].kind == P_ARRAY && c->params[i].length_arg >= 0 &&
        c->params[i].length_arg < (int) c->n_params)
      c->params[c->params[i].length_arg].length_of = i;
  return c;
}

static int
compare_callables (gconstpointer a,
                   gconstpointer b)
{
  const Callable *ca = *(const Callable **) a, *cb = *(const Callable **) b;

  return strcmp (ca->pub.qualname, cb->pub.qualname);
}

static void
add_function (GHashTable     *seen,
              GIFunctionInfo *fi,
              const char     *prefix,
              const char     *container)
{
  g_autofree char *qualname = NULL;
  const char *symbol = g_function_info_get_symbol (fi);

  if (g_hash_table_contains (seen, symbol))
    return;
  g_hash_table_add (seen, (gpointer) symbol);
  qualname = g_strdup_printf ("%s.%s", prefix, g_base_info_get_name (fi));
  g_ptr_array_add (callables, callable_new (fi, qualname, container));
}

void
fz_calls_init (GIRepository *repo)
{
  g_autoptr(GHashTable) seen = g_hash_table_new (g_str_hash, g_str_equal);
  int n, i;

  callables = g_ptr_array_new ();
  for (n = 0; n < g_irepository_get_n_infos (repo, "Gmlp"); n++)
    {
      GIBaseInfo *info = g_irepository_get_info (repo, "Gmlp", n);
      g_autofree char *prefix = g_strdup_printf ("Gmlp.%s", g_base_info_get_name (info));

      switch (g_base_info_get_type (info))
        {
        case GI_INFO_TYPE_OBJECT:
          for (i = 0; i < g_object_info_get_n_methods (info); i++)
            {
              FzAutoInfo fi = g_object_info_get_method (info, i);

              add_function (seen, fi, prefix,
                            g_registered_type_info_get_type_name ((GIRegisteredTypeInfo *) info));
            }
          break;
        case GI_INFO_TYPE_STRUCT:
        case GI_INFO_TYPE_BOXED:
          if (g_struct_info_is_gtype_struct (info))
            break;
          for (i = 0; i < g_struct_info_get_n_methods (info); i++)
            {
              FzAutoInfo fi = g_struct_info_get_method (info, i);

              add_function (seen, fi, prefix, NULL);
            }
          break;
        case GI_INFO_TYPE_ENUM:
        case GI_INFO_TYPE_FLAGS:
          for (i = 0; i < g_enum_info_get_n_methods (info); i++)
            {
              FzAutoInfo fi = g_enum_info_get_method (info, i);

              add_function (seen, fi, prefix, NULL);
            }
          break;
        case GI_INFO_TYPE_FUNCTION:
          add_function (seen, info, "Gmlp", NULL);
          break;
        default:
          break;
        }
      /* The infos live as long as the repository; keep them. */
    }
  g_ptr_array_sort (callables, compare_callables);
}

guint
fz_n_callables (void)
{
  return callables->len;
}

const FzCallable *
fz_callable (guint i)
{
  return &((Callable *) callables->pdata[i])->pub;
}

/* Sane and hostile arguments */

static gboolean
is_name (const char *name,
         const char *a)
{
  return g_str_equal (name, a);
}

static gint64
sane_int (const Callable *c,
          const FzParam  *p)
{
  const char *n = p->name;

  if (is_name (n, "n_groups"))
    return FZ_GROUPS;
  if (is_name (n, "index") || is_name (n, "ordinal"))
    return 0;
  if (is_name (n, "in_features") || is_name (n, "hidden") || is_name (n, "cols"))
    return FZ_K;
  if (is_name (n, "out_features") || is_name (n, "ffn_hidden"))
    return FZ_O;
  if (is_name (n, "rows"))
    return FZ_ROWS0;
  if (is_name (n, "row_capacity"))
    return FZ_ROWS0 + FZ_ROWS1;
  if (is_name (n, "seed"))
    return 7;
  if (is_name (n, "bits"))
    return 0x3c;
  return 1;
}

static double
sane_double (const FzParam *p)
{
  if (is_name (p->name, "alpha") || is_name (p->name, "scale"))
    return 0.5;
  return 1.5;
}

static gint64
enum_value (GIBaseInfo *iface,
            const char *nick)
{
  int i;

  for (i = 0; i < g_enum_info_get_n_values (iface); i++)
    {
      FzAutoInfo v = g_enum_info_get_value (iface, i);

      if (g_str_equal (g_base_info_get_name (v), nick))
        return g_value_info_get_value (v);
    }
  return 0;
}

static gint64
sane_enum (const Callable *c,
           const FzParam  *p,
           const char     *self)
{
  const char *type = g_base_info_get_name (p->iface);

  if (g_str_equal (type, "DType"))
    {
      if (g_str_has_suffix (c->pub.symbol, "_convert") || g_str_has_suffix (c->pub.symbol, "_dequantize"))
        return GMLP_DTYPE_BFLOAT16;
      return fz_flavour_dtype (self);
    }
  if (g_str_equal (type, "DeviceKind"))
    return g_str_has_prefix (g_getenv ("GMLP_TEST_DEVICE") != NULL ? g_getenv ("GMLP_TEST_DEVICE") : "", "cuda")
             ? GMLP_DEVICE_KIND_CUDA : GMLP_DEVICE_KIND_CPU;
  if (g_str_equal (type, "ScalingRecipe"))
    return enum_value (p->iface, "current");
  if (g_str_equal (type, "Fp8Format"))
    return enum_value (p->iface, "hybrid");
  return 0;
}

static char *
sane_flavour (const Callable *c,
              const FzParam  *p,
              const char     *self)
{
  const char *n = p->name;
  const char *sym = c->pub.symbol;
  const FzFlavour *sf = fz_flavour_lookup (self);
  const char *type = p->kind == P_BYTES ? "GBytes" : p->kind == P_VARIANT ? "GVariant" : p->type;
  char *layer_input;

  if (g_str_equal (type, "GmlpGroupedTensor"))
    {
      if ((is_name (n, "input") || is_name (n, "grad_output")) &&
          (layer_input = fz_input_for (self, is_name (n, "grad_output"))) != NULL)
        return layer_input;
      if (is_name (n, "grad_output"))
        return g_strdup (g_str_has_prefix (sym, "gmlp_grouped_mlp_") ? "dyh:f32" : "dy:f32");
      if (is_name (n, "main_grad"))
        return g_strdup (g_str_has_suffix (sym, "_member") ? "w1:f32" : "w:f32");
      if (is_name (n, "sizes"))
        return g_strdup ("sizes");
      if (is_name (n, "other") && sf != NULL && g_str_equal (sf->type, "GmlpGroupedTensor"))
        return g_strdup_printf ("%s@other", self);
      return g_strdup ("x:f32");
    }
  if (g_str_equal (type, "GmlpSavedActivations"))
    return g_strdup (g_str_has_prefix (sym, "gmlp_offload_context_") ? "saved:offloaded" : "saved:self");
  if (g_str_equal (type, "GmlpQuantizer"))
    {
      if (is_name (n, "weight"))
        return g_strdup ("q:current:weight");
      if (is_name (n, "grad_output"))
        return g_strdup ("q:current:grad");
      return g_strdup ("q:current:input");
    }
  if (g_str_equal (type, "GmlpEvent"))
    return g_strdup (is_name (n, "end") ? "event@end" : "event");
  if (g_str_equal (type, "GBytes"))
    {
      gsize elem = gmlp_dtype_get_size (fz_flavour_dtype (self));

      if (g_str_has_suffix (sym, "set_weight_from_bytes"))
        return g_strdup_printf ("bytes:%" G_GSIZE_FORMAT, (gsize) FZ_GROUPS * FZ_O * FZ_K * elem);
      if (g_str_has_suffix (sym, "set_bias_from_bytes"))
        return g_strdup_printf ("bytes:%" G_GSIZE_FORMAT, (gsize) FZ_GROUPS * FZ_O * elem);
      return g_strdup_printf ("bytes:%d", (FZ_ROWS0 + FZ_ROWS1) * FZ_K * 4);
    }
  return g_strdup (fz_default_flavour (type));
}

static void
sane_arg (const Callable *c,
          guint           i,
          const char     *self,
          FzArg          *a)
{
  const FzParam *p = &c->params[i];

  memset (a, 0, sizeof *a);
  if (p->dir == GI_DIRECTION_OUT)
    {
      a->kind = FZ_ARG_OUT;
      return;
    }
  if (p->length_of >= 0)
    {
      a->kind = FZ_ARG_LENGTH;
      return;
    }
  switch (p->kind)
    {
    case P_BOOL:
      a->kind = FZ_ARG_BOOL;
      a->i = TRUE;
      break;
    case P_INT:
      a->kind = FZ_ARG_INT;
      a->i = sane_int (c, p);
      break;
    case P_FLOAT:
    case P_DOUBLE:
      a->kind = FZ_ARG_DOUBLE;
      a->d = sane_double (p);
      break;
    case P_ENUM:
      a->kind = FZ_ARG_INT;
      a->i = sane_enum (c, p, self);
      break;
    case P_FLAGS:
      a->kind = FZ_ARG_INT;
      a->i = 0;
      break;
    case P_OBJECT:
    case P_BYTES:
    case P_VARIANT:
      a->kind = FZ_ARG_FLAVOUR;
      a->flavour = sane_flavour (c, p, self);
      if (a->flavour == NULL)
        a->kind = FZ_ARG_NULL;
      break;
    case P_STRING:
      a->kind = FZ_ARG_STRING;
      a->i = g_str_has_prefix (g_getenv ("GMLP_TEST_DEVICE") != NULL ? g_getenv ("GMLP_TEST_DEVICE") : "", "cuda")
               ? 2 : 0;
      break;
    case P_ARRAY:
      a->kind = FZ_ARG_ARRAY;
      a->length = FZ_GROUPS;
      a->fill = p->tag == GI_TYPE_TAG_BOOLEAN ? 1 : FZ_ROWS0;
      a->odd = p->tag == GI_TYPE_TAG_BOOLEAN ? 0 : FZ_ROWS1;
      break;
    case P_POINTER:
    default:
      a->kind = FZ_ARG_NULL;
    }
}

static gboolean
set_int_arg (GIArgument *arg,
             GITypeTag   tag,
             gint64      v)
{
  switch (tag)
    {
    case GI_TYPE_TAG_INT8: arg->v_int8 = (gint8) v; break;
    case GI_TYPE_TAG_UINT8: arg->v_uint8 = (guint8) v; break;
    case GI_TYPE_TAG_INT16: arg->v_int16 = (gint16) v; break;
    case GI_TYPE_TAG_UINT16: arg->v_uint16 = (guint16) v; break;
    case GI_TYPE_TAG_INT32: arg->v_int32 = (gint32) v; break;
    case GI_TYPE_TAG_UINT32: arg->v_uint32 = (guint32) v; break;
    case GI_TYPE_TAG_INT64: arg->v_int64 = v; break;
    case GI_TYPE_TAG_UINT64: arg->v_uint64 = (guint64) v; break;
    default: return FALSE;
    }
  return TRUE;
}

static gint64
get_int_arg (const GIArgument *arg,
             GITypeTag         tag)
{
  switch (tag)
    {
    case GI_TYPE_TAG_INT8: return arg->v_int8;
    case GI_TYPE_TAG_UINT8: return arg->v_uint8;
    case GI_TYPE_TAG_INT16: return arg->v_int16;
    case GI_TYPE_TAG_UINT16: return arg->v_uint16;
    case GI_TYPE_TAG_INT32: return arg->v_int32;
    case GI_TYPE_TAG_UINT32: return arg->v_uint32;
    case GI_TYPE_TAG_INT64: return arg->v_int64;
    case GI_TYPE_TAG_UINT64: return (gint64) arg->v_uint64;
    default: return 0;
    }
}

static const char *
random_flavour (GRand      *rand,
                const char *type)
{
  GPtrArray *list = fz_flavours_of_type (type);

  if (list == NULL || list->len == 0)
    return NULL;
  return ((FzFlavour *) list->pdata[g_rand_int_range (rand, 0, list->len)])->name;
}

static void
hostile_arg (const Callable *c,
             guint           i,
             GRand          *rand,
             FzArg          *a)
{
  static const gint64 odd_flags[] = { 1 << 5, 0x1f, 0xff, -1 };
  const FzParam *p = &c->params[i];
  const char *type = p->kind == P_BYTES ? "GBytes" : p->kind == P_VARIANT ? "GVariant" : p->type;

  if (p->dir == GI_DIRECTION_OUT)
    {
      a->kind = FZ_ARG_OUT_NULL;
      return;
    }
  g_clear_pointer (&a->flavour, g_free);
  switch (p->kind)
    {
    case P_BOOL:
      a->i = !a->i;
      break;
    case P_INT:
      {
        GIArgument v;

        /* The value the function sees, as its type holds it. */
        a->kind = FZ_ARG_INT;
        set_int_arg (&v, p->tag, fz_int_pool[g_rand_int_range (rand, 0, fz_n_int_pool)]);
        a->i = get_int_arg (&v, p->tag);
        break;
      }
    case P_FLOAT:
    case P_DOUBLE:
      a->kind = FZ_ARG_DOUBLE;
      a->d = fz_double_pool[g_rand_int_range (rand, 0, fz_n_double_pool)];
      break;
    case P_ENUM:
      {
        int n = g_enum_info_get_n_values (p->iface), k = g_rand_int_range (rand, 0, n + 2);

        a->kind = FZ_ARG_INT;
        if (k < n)
          {
            FzAutoInfo v = g_enum_info_get_value (p->iface, k);

            a->i = g_value_info_get_value (v);
          }
        else
          a->i = k == n ? -1 : 99;
        break;
      }
    case P_FLAGS:
      {
        int n = g_enum_info_get_n_values (p->iface);
        int k = g_rand_int_range (rand, 0, n + G_N_ELEMENTS (odd_flags));

        a->kind = FZ_ARG_INT;
        if (k < n)
          {
            FzAutoInfo v = g_enum_info_get_value (p->iface, k);

            a->i = g_value_info_get_value (v);
          }
        else
          a->i = odd_flags[k - n];
        break;
      }
    case P_OBJECT:
    case P_BYTES:
    case P_VARIANT:
      if (g_rand_int_range (rand, 0, 6) == 0 || random_flavour (rand, type) == NULL)
        a->kind = FZ_ARG_NULL;
      else
        {
          a->kind = FZ_ARG_FLAVOUR;
          a->flavour = g_strdup (random_flavour (rand, type));
        }
      break;
    case P_STRING:
      if (g_rand_int_range (rand, 0, 8) == 0)
        a->kind = FZ_ARG_NULL;
      else
        {
          a->kind = FZ_ARG_STRING;
          a->i = g_rand_int_range (rand, 0, fz_n_string_pool);
        }
      break;
    case P_ARRAY:
      a->kind = FZ_ARG_ARRAY;
      switch (g_rand_int_range (rand, 0, 3))
        {
        case 0:   /* another length */
          a->length = fz_array_lengths[g_rand_int_range (rand, 0, fz_n_array_lengths)];
          a->odd = a->fill;
          break;
        case 1:   /* one hostile element */
          a->odd = p->tag == GI_TYPE_TAG_BOOLEAN ? 0 : fz_int_pool[g_rand_int_range (rand, 0, fz_n_int_pool)];
          if (p->tag != GI_TYPE_TAG_INT64)
            a->odd = (gint32) a->odd;
          break;
        default:  /* every element hostile */
          a->fill = a->odd = p->tag == GI_TYPE_TAG_BOOLEAN
                               ? 1 : fz_int_pool[g_rand_int_range (rand, 0, fz_n_int_pool)];
          if (p->tag != GI_TYPE_TAG_INT64)
            a->fill = a->odd = (gint32) a->odd;
          a->length = fz_array_lengths[g_rand_int_range (rand, 0, fz_n_array_lengths)];
        }
      break;
    default:
      a->kind = FZ_ARG_NULL;
    }
}

/* Descriptions */

static char *
enum_text (GIBaseInfo *iface,
           gint64      value)
{
  int i;

  for (i = 0; i < g_enum_info_get_n_values (iface); i++)
    {
      FzAutoInfo v = g_enum_info_get_value (iface, i);

      if (g_value_info_get_value (v) == value)
        return g_strdup (g_base_info_get_name (v));
    }
  return g_strdup_printf ("%" G_GINT64_FORMAT, value);
}

static char *
string_arg_text (gint64 i)
{
  const char *s = fz_string_pool[i];

  if (g_str_equal (s, "long"))
    return g_strdup ("\"a\"×65536");
  if (!g_utf8_validate (s, -1, NULL))
    return g_strdup ("<invalid UTF-8>");
  return g_strdup_printf ("\"%s\"", s);
}

static void
append_arg (GString        *s,
            const Callable *c,
            guint           i,
            const FzArg    *a)
{
  const FzParam *p = &c->params[i];
  g_autofree char *v = NULL, *fill = NULL, *odd = NULL;

  switch (a->kind)
    {
    case FZ_ARG_INT:
      v = p->kind == P_ENUM || p->kind == P_FLAGS ? enum_text (p->iface, a->i) : fz_int_name (a->i);
      break;
    case FZ_ARG_DOUBLE: v = fz_double_name (a->d); break;
    case FZ_ARG_BOOL: v = g_strdup (a->i ? "TRUE" : "FALSE"); break;
    case FZ_ARG_NULL: v = g_strdup ("NULL"); break;
    case FZ_ARG_FLAVOUR: v = g_strdup (a->flavour); break;
    case FZ_ARG_STRING: v = string_arg_text (a->i); break;
    case FZ_ARG_LENGTH: v = g_strdup ("(length)"); break;
    case FZ_ARG_OUT: v = g_strdup ("(out)"); break;
    case FZ_ARG_OUT_NULL: v = g_strdup ("(out NULL)"); break;
    case FZ_ARG_ARRAY:
      fill = fz_int_name (a->fill);
      odd = fz_int_name (a->odd);
      if (a->length == 0)
        v = g_strdup ("NULL[0]");
      else if (a->length == 2)
        v = g_strdup_printf ("[%s, %s]", fill, odd);
      else if (a->fill == a->odd)
        v = g_strdup_printf ("[%s]×%u", fill, a->length);
      else
        v = g_strdup_printf ("[%s…, %s]×%u", fill, odd, a->length);
      break;
    default:
      v = g_strdup ("?");
    }
  g_string_append_printf (s, "%s%s=%s", s->str[s->len - 1] == '(' ? "" : ", ", p->name, v);
}

static char *
describe_call (const Callable *c,
               const FzCase   *k)
{
  GString *s = g_string_new (c->pub.qualname);
  guint i;

  g_string_append_c (s, '(');
  if (c->pub.is_method)
    g_string_append_printf (s, "self=%s", k->self != NULL ? k->self : "NULL");
  for (i = 0; i < c->n_params; i++)
    append_arg (s, c, i, &k->args[i]);
  g_string_append_c (s, ')');
  return g_string_free (s, FALSE);
}

/* Generation */

static FzCase *
call_case (const Callable *c,
           const char     *self)
{
  FzCase *k = g_new0 (FzCase, 1);
  guint i;

  k->kind = FZ_CASE_CALL;
  k->callable = &c->pub;
  k->self = g_strdup (self);
  k->n_args = c->n_params;
  k->args = g_new0 (FzArg, c->n_params);
  for (i = 0; i < c->n_params; i++)
    sane_arg (c, i, self, &k->args[i]);
  return k;
}

/* A random call: sane arguments, then one to three of them (or the
 * instance) made hostile. */
static FzCase *
random_case (const Callable *c,
             guint64         seed,
             guint           variant)
{
  guint32 seeds[3] = { (guint32) seed ^ (guint32) (seed >> 32), g_str_hash (c->pub.symbol), variant };
  g_autoptr(GRand) rand = g_rand_new_with_seed_array (seeds, 3);
  g_autoptr(GArray) slots = g_array_new (FALSE, FALSE, sizeof (int));
  const char *self = c->pub.is_method ? fz_default_flavour (c->pub.container) : NULL;
  FzCase *k;
  int n_mutations, i, slot;

  if (c->pub.is_method && g_rand_int_range (rand, 0, 3) == 0)
    self = random_flavour (rand, c->pub.container);
  k = call_case (c, self);

  if (c->pub.is_method)
    {
      slot = -1;
      g_array_append_val (slots, slot);
    }
  for (i = 0; i < (int) c->n_params; i++)
    if (c->params[i].length_of < 0 &&
        (c->params[i].dir == GI_DIRECTION_IN || c->params[i].optional))
      g_array_append_val (slots, i);

  n_mutations = g_rand_int_range (rand, 0, 20);
  n_mutations = n_mutations < 13 ? 1 : n_mutations < 18 ? 2 : 3;
  for (i = 0; i < n_mutations && slots->len > 0; i++)
    {
      slot = g_array_index (slots, int, g_rand_int_range (rand, 0, slots->len));
      if (slot < 0)
        {
          g_free (k->self);
          k->self = g_rand_int_range (rand, 0, 6) == 0
                      ? NULL : g_strdup (random_flavour (rand, c->pub.container));
        }
      else
        hostile_arg (c, slot, rand, &k->args[slot]);
    }
  return k;
}

/* The readable properties of every flavour, and the writable ones that are
 * not construct-only set. */
static void
add_property_cases (GPtrArray *cases)
{
  static const char *types[] = {
    "GmlpDevice", "GmlpGroupedTensor", "GmlpGroupedLinear", "GmlpGroupedMLP", "GmlpQuantizer",
    "GmlpOffloadContext", "GmlpSavedActivations", "GmlpEvent", "GmlpGraph",
  };
  guint t, i;

  for (t = 0; t < G_N_ELEMENTS (types); t++)
    {
      GPtrArray *list = fz_flavours_of_type (types[t]);

      for (i = 0; list != NULL && i < list->len; i++)
        {
          const FzFlavour *f = list->pdata[i];
          FzCase *k = g_new0 (FzCase, 1);

          k->kind = FZ_CASE_PROPERTIES;
          k->self = g_strdup (f->name);
          k->description = g_strdup_printf ("properties of %s: get all, set the writable", f->name);
          g_ptr_array_add (cases, k);
        }
    }
}

/* g_object_new() with one construct property at a hostile value that its
 * pspec allows, then g_initable_init(). */
static void
add_construct_cases (GIRepository *repo,
                     GPtrArray    *cases)
{
  g_autoptr(GArray) candidates = g_array_new (FALSE, FALSE, sizeof (gint64));
  int n, i;
  guint v;

  for (n = 0; n < g_irepository_get_n_infos (repo, "Gmlp"); n++)
    {
      FzAutoInfo info = g_irepository_get_info (repo, "Gmlp", n);
      g_autoptr(GTypeClass) klass = NULL;
      const char *type_name;
      GType type;

      if (g_base_info_get_type (info) != GI_INFO_TYPE_OBJECT)
        continue;
      type_name = g_registered_type_info_get_type_name ((GIRegisteredTypeInfo *) info);
      /* Registering the type touches no device. */
      type = g_registered_type_info_get_g_type ((GIRegisteredTypeInfo *) info);
      klass = g_type_class_ref (type);

      for (i = 0; i < g_object_info_get_n_properties (info); i++)
        {
          FzAutoInfo prop = g_object_info_get_property (info, i);
          GParamSpec *pspec = g_object_class_find_property (G_OBJECT_CLASS (klass),
                                                            g_base_info_get_name (prop));
          GType vt;

          if (pspec == NULL || (pspec->flags & G_PARAM_WRITABLE) == 0 ||
              (pspec->flags & (G_PARAM_CONSTRUCT | G_PARAM_CONSTRUCT_ONLY)) == 0)
            continue;
          vt = G_PARAM_SPEC_VALUE_TYPE (pspec);
          g_array_set_size (candidates, 0);
          if (G_TYPE_IS_ENUM (vt))
            {
              g_autoptr(GTypeClass) eclass = g_type_class_ref (vt);

              for (v = 0; v < G_ENUM_CLASS (eclass)->n_values; v++)
                g_array_append_val (candidates, G_ENUM_CLASS (eclass)->values[v].value);
            }
          else if (vt == G_TYPE_BOOLEAN)
            g_array_append_vals (candidates, (gint64[]) { 0, 1 }, 2);
          else if (vt == G_TYPE_INT || vt == G_TYPE_UINT || vt == G_TYPE_INT64 ||
                   vt == G_TYPE_UINT64 || vt == G_TYPE_DOUBLE)
            g_array_append_vals (candidates, fz_int_pool, fz_n_int_pool);
          for (v = 0; v < candidates->len; v++)
            {
              gint64 value = g_array_index (candidates, gint64, v);
              g_autofree char *vname = NULL;
              FzCase *k;

              if (!fz_pspec_takes (pspec, value))
                continue;
              vname = G_TYPE_IS_ENUM (vt) ? g_strdup (g_enum_get_value (g_type_class_peek (vt), value)->value_nick)
                                          : fz_int_name (value);
              k = g_new0 (FzCase, 1);
              k->kind = FZ_CASE_CONSTRUCT;
              k->type = g_strdup (type_name);
              k->prop = g_strdup (pspec->name);
              k->prop_value = value;
              k->description = g_strdup_printf ("g_object_new (%s, %s=%s, the others sane) and init",
                                                type_name, pspec->name, vname);
              g_ptr_array_add (cases, k);
            }
          if (vt == GMLP_TYPE_DEVICE)
            {
              /* Unset (NULL), as g_object_new() without it leaves it. */
              FzCase *k = g_new0 (FzCase, 1);

              k->kind = FZ_CASE_CONSTRUCT;
              k->type = g_strdup (type_name);
              k->prop = g_strdup (pspec->name);
              k->prop_value = G_MININT64;
              k->description = g_strdup_printf ("g_object_new (%s, %s=NULL, the others sane) and init",
                                                type_name, pspec->name);
              g_ptr_array_add (cases, k);
            }
        }
    }
}

/* For each argument of c, a call on self with every special flavour of its
 * type in it (with values, every GBytes and GVariant), the others sane. */
static void
add_argument_sweep (GPtrArray      *cases,
                    const Callable *c,
                    const char     *self,
                    gboolean        values)
{
  guint p, j;

  for (p = 0; p < c->n_params; p++)
    {
      const FzParam *param = &c->params[p];
      g_autofree char *sane = NULL;
      GPtrArray *list;

      if (param->dir != GI_DIRECTION_IN || (param->kind != P_OBJECT && !values) ||
          (param->kind != P_BYTES && param->kind != P_VARIANT && param->kind != P_OBJECT))
        continue;
      sane = sane_flavour (c, param, self);
      list = fz_flavours_of_type (param->kind == P_BYTES ? "GBytes"
                                  : param->kind == P_VARIANT ? "GVariant" : param->type);
      for (j = 0; list != NULL && j < list->len; j++)
        {
          const FzFlavour *f = list->pdata[j];
          const FzFlavour *base = fz_flavour_lookup (f->base);
          FzCase *k;

          if (param->kind == P_OBJECT && (!f->special || g_strcmp0 (f->name, sane) == 0))
            continue;
          /* A saved state goes to a quantizer like the one that saved it. */
          k = call_case (c, base != NULL && g_strcmp0 (base->type, c->pub.container) == 0 &&
                            param->kind == P_VARIANT ? base->name : self);
          g_free (k->args[p].flavour);
          k->args[p].flavour = g_strdup (f->name);
          k->description = describe_call (c, k);
          g_ptr_array_add (cases, k);
        }
    }
}

static guint
random_weight (const Callable *c)
{
  guint i, n = c->pub.is_method ? 1 : 0;

  for (i = 0; i < c->n_params; i++)
    if (c->params[i].length_of < 0 && (c->params[i].dir == GI_DIRECTION_IN || c->params[i].optional))
      n++;
  return MAX (n, 1);
}

guint
fz_n_random_slots (void)
{
  guint i, n = 0;

  for (i = 0; i < callables->len; i++)
    if (((Callable *) callables->pdata[i])->supported)
      n += random_weight (callables->pdata[i]);
  return n;
}

void
fz_calls_generate (GPtrArray *cases,
                   guint64    seed,
                   guint      n_random)
{
  GIRepository *repo = g_irepository_get_default ();
  guint i, j, n_supported = 0;
  g_autoptr(GPtrArray) supported = g_ptr_array_new ();
  g_autoptr(GPtrArray) weighted = g_ptr_array_new ();

  add_property_cases (cases);
  add_construct_cases (repo, cases);

  for (i = 0; i < callables->len; i++)
    {
      Callable *c = callables->pdata[i];

      if (!c->supported)
        {
          FzCase *k = g_new0 (FzCase, 1);

          /* Listed so that an argument type the suite can't build shows. */
          k->kind = FZ_CASE_CALL;
          k->callable = &c->pub;
          k->description = g_strdup_printf ("%s: an argument type the suite does not build",
                                            c->pub.qualname);
          g_ptr_array_add (cases, k);
          continue;
        }
      g_ptr_array_add (supported, c);

      /* Sane arguments on the default instance, then on every special one. */
      {
        FzCase *k = call_case (c, c->pub.is_method ? fz_default_flavour (c->pub.container) : NULL);

        k->description = describe_call (c, k);
        g_ptr_array_add (cases, k);
      }
      if (c->pub.is_method)
        {
          GPtrArray *list = fz_flavours_of_type (c->pub.container);

          for (j = 0; list != NULL && j < list->len; j++)
            {
              const FzFlavour *f = list->pdata[j];
              FzCase *k;

              if (!f->special || g_strcmp0 (f->name, fz_default_flavour (c->pub.container)) == 0)
                continue;
              k = call_case (c, f->name);
              k->description = describe_call (c, k);
              g_ptr_array_add (cases, k);
            }
          {
            /* NULL instance: the one NULL every method must refuse. */
            FzCase *k = call_case (c, NULL);

            k->description = describe_call (c, k);
            g_ptr_array_add (cases, k);
          }
        }
    }

  /* Every GBytes and GVariant for each such argument: short, long, exact
   * and odd buffers, every change of a saved quantizer state (on a
   * quantizer like the one that saved it); and every special object
   * (unfinished, failed, foreign, odd) for each object argument, on the
   * default instance and on the unfinished ones (an unfinished layer and
   * bare saved activations may agree on who made them). */
  for (i = 0; i < supported->len; i++)
    {
      Callable *c = supported->pdata[i];
      GPtrArray *list = c->pub.is_method ? fz_flavours_of_type (c->pub.container) : NULL;

      add_argument_sweep (cases, c, c->pub.is_method ? fz_default_flavour (c->pub.container) : NULL, TRUE);
      for (j = 0; list != NULL && j < list->len; j++)
        if (((FzFlavour *) list->pdata[j])->info != NULL)
          add_argument_sweep (cases, c, ((FzFlavour *) list->pdata[j])->name, FALSE);
    }

  /* Round robin over the functions, each as often as it has arguments to
   * make hostile (the instance counts as one), so that a getter does not
   * get as many random calls as a forward. */
  for (i = 0; i < supported->len; i++)
    for (j = 0; j < random_weight (supported->pdata[i]); j++)
      g_ptr_array_add (weighted, supported->pdata[i]);
  n_supported = weighted->len;
  for (i = 0; i < n_random && n_supported > 0; i++)
    {
      Callable *c = weighted->pdata[i % n_supported];
      FzCase *k = random_case (c, seed, i);

      k->description = describe_call (c, k);
      g_ptr_array_add (cases, k);
    }
}

/* Running a call */

typedef struct {
  GIArgument  in[32];
  GIArgument  out[32];
  GIArgument  out_store[32];
  int         in_of[32];     /* GI argument → index in in[], or -1 */
  int         out_of[32];
  gpointer    arrays[32];
  int         n_in, n_out;
} Frame;

static gpointer
make_array (const FzParam *p,
            const FzArg   *a)
{
  guint i;

  if (a->length == 0)
    return NULL;   /* what a binding passes for an empty list */
  if (p->tag == GI_TYPE_TAG_INT64)
    {
      gint64 *v = g_new (gint64, a->length);

      for (i = 0; i < a->length; i++)
        v[i] = a->fill;
      v[a->length - 1] = a->odd;
      return v;
    }
  else
    {
      gint32 *v = g_new (gint32, a->length);

      for (i = 0; i < a->length; i++)
        v[i] = (gint32) a->fill;
      v[a->length - 1] = (gint32) a->odd;
      return v;
    }
}

static char *
long_string (void)
{
  char *s = g_malloc (65537);

  memset (s, 'a', 65536);
  s[65536] = '\0';
  return s;
}

/* Uses a tensor a call returned a little: a crash here is the call's. */
static void
probe_tensor (FzCtx             *ctx,
              GmlpGroupedTensor *t)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) bytes = NULL;

  if (!GMLP_IS_GROUPED_TENSOR (t))
    {
      fz_fail (ctx, "bad result", "the call returned a %s where a tensor was due",
               t != NULL ? G_OBJECT_TYPE_NAME (t) : "NULL");
      return;
    }
  gmlp_grouped_tensor_get_n_groups (t);
  gmlp_grouped_tensor_get_cols (t);
  gmlp_grouped_tensor_get_dtype (t);
  if (gmlp_grouped_tensor_get_nbytes (t) <= 64 << 20 && gmlp_grouped_tensor_has_host_sizes (t))
    {
      bytes = gmlp_grouped_tensor_to_bytes (t, &error);
      fz_check_result (ctx, "to_bytes of the result", bytes != NULL, error);
    }
}

/* Frees what a call returned with (transfer full) or (transfer container). */
static void
free_value (FzCtx            *ctx,
            const Callable   *c,
            GITypeInfo       *ti,
            GITransfer        transfer,
            GIArgument       *v,
            gboolean          probe)
{
  GITypeTag tag = g_type_info_get_tag (ti);

  if (tag == GI_TYPE_TAG_INTERFACE)
    {
      FzAutoInfo iface = g_type_info_get_interface (ti);
      GIInfoType itype = g_base_info_get_type (iface);

      if (itype == GI_INFO_TYPE_OBJECT)
        {
          if (probe && v->v_pointer != NULL &&
              g_str_equal (g_registered_type_info_get_type_name (iface), "GmlpGroupedTensor"))
            probe_tensor (ctx, v->v_pointer);
          if (transfer != GI_TRANSFER_NOTHING)
            g_clear_object (&v->v_pointer);
        }
      else if (transfer != GI_TRANSFER_NOTHING && v->v_pointer != NULL &&
               (itype == GI_INFO_TYPE_STRUCT || itype == GI_INFO_TYPE_BOXED))
        {
          if (g_str_equal (g_base_info_get_name (iface), "Bytes"))
            g_bytes_unref (v->v_pointer);
          else if (g_str_equal (g_base_info_get_name (iface), "Variant"))
            g_variant_unref (v->v_pointer);
        }
      return;
    }
  if (transfer == GI_TRANSFER_NOTHING || v->v_pointer == NULL)
    return;
  switch (tag)
    {
    case GI_TYPE_TAG_UTF8:
    case GI_TYPE_TAG_FILENAME:
    case GI_TYPE_TAG_ARRAY:
      g_free (v->v_pointer);
      break;
    case GI_TYPE_TAG_VOID:
      if (g_str_equal (c->pub.symbol, "gmlp_grouped_tensor_to_dlpack"))
        {
          DLManaged *m = v->v_pointer;

          if (m->deleter != NULL)
            m->deleter (m);
        }
      break;
    default:
      break;
    }
}

static char *
return_text (GITypeInfo *ti,
             GIArgument *v)
{
  GITypeTag tag = g_type_info_get_tag (ti);

  switch (tag)
    {
    case GI_TYPE_TAG_BOOLEAN: return g_strdup (v->v_boolean ? "TRUE" : "FALSE");
    case GI_TYPE_TAG_FLOAT: return g_strdup_printf ("%g", v->v_float);
    case GI_TYPE_TAG_DOUBLE: return g_strdup_printf ("%g", v->v_double);
    case GI_TYPE_TAG_UTF8:
      return v->v_string != NULL && g_utf8_validate (v->v_string, -1, NULL)
               ? g_strdup_printf ("\"%s\"", v->v_string) : g_strdup (v->v_string ? "<bytes>" : "NULL");
    case GI_TYPE_TAG_INTERFACE:
      {
        FzAutoInfo iface = g_type_info_get_interface (ti);
        GIInfoType itype = g_base_info_get_type (iface);

        if (itype == GI_INFO_TYPE_ENUM || itype == GI_INFO_TYPE_FLAGS)
          return enum_text (iface, v->v_int32);
        return g_strdup (v->v_pointer != NULL ? g_base_info_get_name (iface) : "NULL");
      }
    case GI_TYPE_TAG_VOID:
      return g_strdup (v->v_pointer != NULL ? "pointer" : "NULL");
    default:
      return fz_int_name (get_int_arg (v, tag));
    }
}

/* Whether a GError-taking call said it succeeded, from its return value:
 * a gboolean, or a pointer; other types carry no status. */
static gboolean
return_success (GITypeInfo *ti,
                GIArgument *v,
                gboolean    has_error)
{
  GITypeTag tag = g_type_info_get_tag (ti);

  if (tag == GI_TYPE_TAG_BOOLEAN)
    return v->v_boolean;
  if (tag == GI_TYPE_TAG_INTERFACE)
    {
      FzAutoInfo iface = g_type_info_get_interface (ti);
      GIInfoType itype = g_base_info_get_type (iface);

      if (itype == GI_INFO_TYPE_ENUM || itype == GI_INFO_TYPE_FLAGS)
        return !has_error;
      return v->v_pointer != NULL;
    }
  if (tag == GI_TYPE_TAG_UTF8 || tag == GI_TYPE_TAG_ARRAY ||
      (tag == GI_TYPE_TAG_VOID && g_type_info_is_pointer (ti)))
    return v->v_pointer != NULL;
  return !has_error;
}

void
fz_call_run (FzCtx        *ctx,
             const FzCase *k)
{
  const Callable *c = (const Callable *) k->callable;
  FzAutoInfo rti = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(GError) invoke_error = NULL;
  g_autoptr(GPtrArray) strings = g_ptr_array_new_with_free_func (g_free);
  GIArgument ret = { 0 };
  gboolean null_passed = FALSE, accepted, invoked;
  Frame fr;
  guint i;

  if (!c->supported)
    {
      fz_skip (ctx, "not built by the suite");
      return;
    }
  memset (&fr, 0, sizeof fr);
  g_assert (c->n_params < 30);
  ctx->self_name = k->self;

  if (c->pub.is_method)
    {
      gpointer self = NULL;

      if (k->self != NULL && (self = fz_get (ctx, k->self, &error)) == NULL)
        {
          fz_skip (ctx, "could not make the instance: %s", error->message);
          return;
        }
      fr.in[fr.n_in++].v_pointer = self;
      null_passed |= self == NULL;
    }

  for (i = 0; i < c->n_params; i++)
    {
      const FzParam *p = &c->params[i];
      const FzArg *a = &k->args[i];

      fr.in_of[i] = fr.out_of[i] = -1;
      if (p->dir == GI_DIRECTION_OUT)
        {
          fr.out_of[i] = fr.n_out;
          fr.out[fr.n_out].v_pointer = a->kind == FZ_ARG_OUT_NULL ? NULL : &fr.out_store[fr.n_out];
          fr.n_out++;
          continue;
        }
      fr.in_of[i] = fr.n_in++;
    }

  for (i = 0; i < c->n_params; i++)
    {
      const FzParam *p = &c->params[i];
      const FzArg *a = &k->args[i];
      GIArgument *arg;

      if (fr.in_of[i] < 0)
        continue;
      arg = &fr.in[fr.in_of[i]];
      switch (a->kind)
        {
        case FZ_ARG_INT:
          if (p->kind == P_ENUM || p->kind == P_FLAGS)
            arg->v_int32 = (gint32) a->i;
          else
            set_int_arg (arg, p->tag, a->i);
          break;
        case FZ_ARG_DOUBLE:
          if (p->kind == P_FLOAT)
            arg->v_float = (float) a->d;
          else
            arg->v_double = a->d;
          break;
        case FZ_ARG_BOOL:
          arg->v_boolean = a->i != 0;
          break;
        case FZ_ARG_NULL:
          arg->v_pointer = NULL;
          null_passed |= !p->nullable;
          break;
        case FZ_ARG_FLAVOUR:
          arg->v_pointer = fz_get (ctx, a->flavour, &error);
          if (arg->v_pointer == NULL)
            {
              fz_skip (ctx, "could not make %s: %s", p->name, error->message);
              goto out;
            }
          break;
        case FZ_ARG_STRING:
          {
            char *s = g_str_equal (fz_string_pool[a->i], "long") ? long_string ()
                                                                 : g_strdup (fz_string_pool[a->i]);

            g_ptr_array_add (strings, s);
            arg->v_string = s;
            break;
          }
        case FZ_ARG_ARRAY:
          fr.arrays[i] = make_array (p, a);
          arg->v_pointer = fr.arrays[i];
          if (p->length_arg >= 0 && fr.in_of[p->length_arg] >= 0)
            set_int_arg (&fr.in[fr.in_of[p->length_arg]], c->params[p->length_arg].tag, a->length);
          break;
        case FZ_ARG_LENGTH:
          break;   /* set with its array */
        default:
          arg->v_pointer = NULL;
        }
    }

  fz_call_begin (ctx, null_passed);
  invoked = g_function_info_invoke (c->pub.info, fr.in, fr.n_in, fr.out, fr.n_out, &ret, &invoke_error);
  accepted = fz_call_end (ctx, c->pub.qualname);

  rti = g_callable_info_get_return_type (c->pub.info);
  if (!invoked && invoke_error != NULL && invoke_error->domain == G_INVOKE_ERROR)
    {
      fz_fail (ctx, "harness", "g_function_info_invoke: %s", invoke_error->message);
      goto out;
    }
  /* For a throwing function, the invoke's error is the function's. */
  if (!invoked && invoke_error != NULL)
    error = g_steal_pointer (&invoke_error);

  if (!accepted)
    {
      if (c->pub.throws)
        fz_check_result (ctx, c->pub.qualname, return_success (rti, &ret, error != NULL), error);
      else if (g_type_info_get_tag (rti) != GI_TYPE_TAG_VOID || g_type_info_is_pointer (rti))
        {
          g_autofree char *text = return_text (rti, &ret);

          fz_note (ctx, "returned %s", text);
        }
      else
        fz_note (ctx, "returned");
    }

  if (invoked)
    {
      free_value (ctx, c, rti, g_callable_info_get_caller_owns (c->pub.info), &ret, !accepted);
      for (i = 0; i < c->n_params; i++)
        if (fr.out_of[i] >= 0 && fr.out[fr.out_of[i]].v_pointer != NULL)
          {
            FzAutoInfo ai = g_callable_info_get_arg (c->pub.info, i);
            FzAutoInfo ti = g_arg_info_get_type (ai);

            free_value (ctx, c, ti, c->params[i].transfer, &fr.out_store[fr.out_of[i]], !accepted);
          }
    }

out:
  for (i = 0; i < c->n_params; i++)
    g_free (fr.arrays[i]);
}

/* Properties */

void
fz_properties_run (FzCtx        *ctx,
                   const FzCase *k)
{
  g_autoptr(GError) error = NULL;
  g_autofree GParamSpec **pspecs = NULL;
  GObject *object;
  guint n, i;

  ctx->self_name = k->self;
  object = fz_get (ctx, k->self, &error);
  if (object == NULL)
    {
      fz_skip (ctx, "could not make %s: %s", k->self, error->message);
      return;
    }
  pspecs = g_object_class_list_properties (G_OBJECT_GET_CLASS (object), &n);
  for (i = 0; i < n; i++)
    {
      GValue value = G_VALUE_INIT;
      g_autofree char *what = g_strdup_printf ("get %s", pspecs[i]->name);

      if ((pspecs[i]->flags & G_PARAM_READABLE) == 0)
        continue;
      g_value_init (&value, G_PARAM_SPEC_VALUE_TYPE (pspecs[i]));
      fz_call_begin (ctx, FALSE);
      g_object_get_property (object, pspecs[i]->name, &value);
      fz_call_end (ctx, what);
      g_value_unset (&value);
    }
  for (i = 0; i < n; i++)
    {
      GValue value = G_VALUE_INIT;
      g_autofree char *what = g_strdup_printf ("set %s", pspecs[i]->name);

      if ((pspecs[i]->flags & G_PARAM_WRITABLE) == 0 || (pspecs[i]->flags & G_PARAM_CONSTRUCT_ONLY) != 0)
        continue;
      g_value_init (&value, G_PARAM_SPEC_VALUE_TYPE (pspecs[i]));
      g_object_get_property (object, pspecs[i]->name, &value);
      if (G_VALUE_HOLDS_BOOLEAN (&value))
        g_value_set_boolean (&value, !g_value_get_boolean (&value));
      fz_call_begin (ctx, FALSE);
      g_object_set_property (object, pspecs[i]->name, &value);
      fz_call_end (ctx, what);
      g_value_unset (&value);
    }
  fz_note (ctx, "%u properties", n);
}

/* g_object_new() with a hostile construct property */

void
fz_construct_run (FzCtx        *ctx,
                  const FzCase *k)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GObject) object = NULL;
  GType type = g_type_from_name (k->type);
  g_autofree char *what = g_strdup_printf ("g_initable_init (%s)", k->type);
  gboolean ok;

  g_assert (type != 0);
  fz_call_begin (ctx, FALSE);
  object = fz_new_with_construct_properties (ctx, type, k->prop, k->prop_value);
  fz_call_end (ctx, "g_object_new");
  if (G_IS_INITABLE (object))
    {
      fz_call_begin (ctx, FALSE);
      ok = g_initable_init (G_INITABLE (object), NULL, &error);
      fz_call_end (ctx, what);
      fz_check_result (ctx, what, ok, error);
    }
  else
    fz_note (ctx, "constructed (not a GInitable)");
}
