/* gmlp-fuzz.h: the pieces of the fuzz suite (see gmlp-fuzz.c for its use)
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <girepository.h>
#include <gmlp.h>

G_BEGIN_DECLS

/* libgirepository 1.74 has no g_autoptr() for its infos, which are all one
 * type: FzAutoInfo declares one that is unreferenced at the end of its
 * scope. */
static inline void
fz_info_clear (GIBaseInfo **info)
{
  g_clear_pointer (info, g_base_info_unref);
}
#define FzAutoInfo __attribute__ ((cleanup (fz_info_clear))) GIBaseInfo *

/* The geometry of the well-made objects, chosen so that a random pick of a
 * layer and a tensor often fits: layers of FZ_GROUPS groups, FZ_K → FZ_O
 * (multiples of 16, as FP8 needs), inputs of FZ_GROUPS members of rows 3 and
 * 5. */
#define FZ_GROUPS 2
#define FZ_K      16
#define FZ_O      32
#define FZ_ROWS0  3
#define FZ_ROWS1  5

typedef enum {
  FZ_PASS,
  FZ_SKIP,
  FZ_FAIL,
} FzVerdict;

/* One case of the child: the device, what the case built (by flavour name),
 * what was logged, and the verdict so far. */
typedef struct {
  GmlpDevice  *device;
  gboolean     cuda;
  GHashTable  *built;        /* flavour name → FzBuilt */
  GPtrArray   *order;        /* FzBuilt, in order of creation */
  const char  *self_name;    /* the flavour of a call's instance, or NULL */
  gboolean     in_call;      /* logs during a call under judgement */
  gboolean     null_passed;  /* that call passed NULL for a non-nullable argument */
  guint        accepted_criticals;
  FzVerdict    verdict;
  GString     *outcome;      /* what happened, for the TAP line */
  GString     *failure;      /* why the case failed or was skipped */
  char        *category;     /* the cause, for grouping failures */
} FzCtx;

/* A value the case built: a GObject, a GBytes or a GVariant. */
typedef enum {
  FZ_VALUE_OBJECT,
  FZ_VALUE_BYTES,
  FZ_VALUE_VARIANT,
} FzValueKind;

typedef struct {
  char        *name;
  FzValueKind  kind;
  gpointer     value;   /* a reference owned by the context */
} FzBuilt;

typedef struct _FzFlavour FzFlavour;
typedef gpointer (*FzBuildFunc) (FzCtx *ctx, const FzFlavour *f, GError **error);

/* A named recipe for a value. */
struct _FzFlavour {
  char         *name;      /* "x:f32", "linear:bf16:bias", "Gmlp.GroupedLinear:bare" ... */
  char         *type;      /* the GType name: "GmlpGroupedTensor", "GBytes", "GVariant" */
  FzValueKind   kind;
  gboolean      special;   /* an instance the method sweep calls every method on */
  FzBuildFunc   build;
  GIBaseInfo   *info;      /* the class, for the flavours every class has */
  int           dtype;
  int           flags;
  int           recipe;
  int           role;
  int           activation;
  int           layout;
  gint64        n;         /* groups of a layer, cols of a tensor, length of bytes ... */
  gboolean      on_cpu;    /* made on the CPU device rather than the test device */
  char         *base;      /* another flavour this one is made from */
};

/* Catalogue (fuzz-values.c) */
void              fz_catalogue_init      (GIRepository *repo, gboolean cuda);
const FzFlavour  *fz_flavour_lookup      (const char *name);
GPtrArray        *fz_flavours_of_type    (const char *type);  /* (element-type FzFlavour) */
const char       *fz_default_flavour     (const char *type);
/* The value of a flavour, built once per case ("@anything" after a name
 * builds another one); NULL with an error when it could not be made. */
gpointer          fz_get                 (FzCtx *ctx, const char *name, GError **error);
void              fz_ctx_clear_built     (FzCtx *ctx);

/* g_object_new() with the construct properties of type at sane values, one
 * of them (hostile_prop, unless NULL) at hostile_value. */
GObject          *fz_new_with_construct_properties (FzCtx *ctx, GType type, const char *hostile_prop,
                                                    gint64 hostile_value);
gboolean          fz_value_set_int64     (GValue *value, gint64 v);
gboolean          fz_pspec_takes         (GParamSpec *pspec, gint64 v);
/* The input (or output gradient) that fits a layer flavour; NULL for
 * others. */
char             *fz_input_for           (const char *layer, gboolean grad);

/* The dtype of an instance flavour's data (the layer's dtype), float32 when
 * it has none. */
GmlpDType         fz_flavour_dtype       (const char *name);
const char       *fz_dtype_short         (GmlpDType dtype);

/* Pools (fuzz-pools.c) */
extern const gint64  fz_int_pool[];
extern const guint   fz_n_int_pool;
extern const double  fz_double_pool[];
extern const guint   fz_n_double_pool;
extern const char   *fz_string_pool[];
extern const guint   fz_n_string_pool;
extern const guint   fz_array_lengths[];
extern const guint   fz_n_array_lengths;
extern const gsize   fz_bytes_sizes[];
extern const guint   fz_n_bytes_sizes;
char             *fz_int_name            (gint64 v);
char             *fz_double_name         (double v);

/* Judgement (gmlp-fuzz.c) */
void              fz_fail                (FzCtx *ctx, const char *category, const char *format, ...) G_GNUC_PRINTF (3, 4);
void              fz_skip                (FzCtx *ctx, const char *format, ...) G_GNUC_PRINTF (2, 3);
void              fz_note                (FzCtx *ctx, const char *format, ...) G_GNUC_PRINTF (2, 3);
void              fz_call_begin          (FzCtx *ctx, gboolean null_passed);
/* Ends a call: judges what it logged; returns whether a critical on a NULL
 * (accepted) was among it, in which case its result is not judged. */
gboolean          fz_call_end            (FzCtx *ctx, const char *what);
/* The GError contract of a call with a GError **: success without error, or
 * failure with an error of a documented domain. */
void              fz_check_result        (FzCtx *ctx, const char *what, gboolean success, const GError *error);
const char       *fz_error_name          (const GError *error);

/* Scenario helpers: each runs one library call under judgement. */
gboolean          fz_ok_ptr              (FzCtx *ctx, const char *what, gpointer result, GError *error);
gboolean          fz_ok_bool             (FzCtx *ctx, const char *what, gboolean result, GError *error);
/* The call must fail with a GError of the GMLP_ERROR domain (code -1: any),
 * as the documentation or issue 40 asks; why says which. */
void              fz_expect_error        (FzCtx *ctx, const char *what, gboolean success, const GError *error,
                                          int code, const char *why);

/* Calls (fuzz-calls.c): every function of the Gmlp namespace. */
typedef struct {
  GIFunctionInfo *info;
  char           *qualname;    /* "Gmlp.GroupedTensor.new" */
  const char     *symbol;
  char           *container;   /* GType name of the class, or NULL */
  gboolean        is_method;
  gboolean        throws;
} FzCallable;

typedef enum {
  FZ_ARG_INT,
  FZ_ARG_DOUBLE,
  FZ_ARG_BOOL,
  FZ_ARG_NULL,
  FZ_ARG_FLAVOUR,
  FZ_ARG_STRING,
  FZ_ARG_ARRAY,
  FZ_ARG_LENGTH,
  FZ_ARG_OUT,
  FZ_ARG_OUT_NULL,
} FzArgKind;

typedef struct {
  FzArgKind  kind;
  gint64     i;
  double     d;
  char      *flavour;
  guint      length;     /* FZ_ARG_ARRAY */
  gint64     fill;       /* FZ_ARG_ARRAY: every element */
  gint64     odd;        /* FZ_ARG_ARRAY: the value of the last element */
} FzArg;

typedef enum {
  FZ_CASE_SCENARIO,
  FZ_CASE_PROPERTIES,
  FZ_CASE_CONSTRUCT,
  FZ_CASE_CALL,
} FzCaseKind;

typedef struct _FzScenario FzScenario;

typedef struct {
  guint              index;
  FzCaseKind         kind;
  const FzScenario  *scenario;
  const FzCallable  *callable;
  char              *self;      /* instance flavour (calls, properties), or NULL */
  FzArg             *args;      /* one per GI argument (calls) */
  guint              n_args;
  char              *type;      /* FZ_CASE_CONSTRUCT: the GType name */
  char              *prop;      /* FZ_CASE_CONSTRUCT: the hostile property */
  gint64             prop_value;
  char              *description;
} FzCase;

void              fz_calls_init          (GIRepository *repo);
guint             fz_n_callables         (void);
/* The number of arguments of all functions that a random call can make
 * hostile (instances included). */
guint             fz_n_random_slots      (void);
const FzCallable *fz_callable            (guint i);
/* The cases of the namespace: the property cases, the construction cases,
 * the sweep of special instances over every method, and n_random random
 * calls, appended to cases. */
void              fz_calls_generate      (GPtrArray *cases, guint64 seed, guint n_random);
void              fz_call_run            (FzCtx *ctx, const FzCase *c);
void              fz_properties_run      (FzCtx *ctx, const FzCase *c);
void              fz_construct_run       (FzCtx *ctx, const FzCase *c);

/* Scenarios (fuzz-scenarios.c) */
struct _FzScenario {
  const char *name;
  void      (*run) (FzCtx *ctx);
};
const FzScenario *fz_scenarios           (guint *n);

G_END_DECLS
