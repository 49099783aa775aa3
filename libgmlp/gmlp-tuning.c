/* gmlp-tuning.c: the keys of a device's tuning (gmlp-tuning-private.h)
 *
 * One table: each key names an int field of GmlpBackendTuning and the
 * values it takes, "auto" (0) first; sm90-grid takes a number instead.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "gmlp-error.h"
#include "gmlp-tuning-private.h"

typedef struct {
  const char *name;
  int         value;
} TuningValue;

typedef struct {
  const char        *key;
  gsize              offset;   /* of an int in GmlpBackendTuning */
  const TuningValue *values;   /* "auto" first, NULL-terminated; NULL: a count of CTAs */
} TuningKey;

#define CHOICES(...) ((const TuningValue[]) { { "auto", 0 }, __VA_ARGS__, { NULL, 0 } })
#define SWITCH CHOICES ({ "off", GMLP_TUNING_NEVER }, { "on", GMLP_TUNING_ALWAYS })

static const TuningKey tuning_keys[] = {
  { "host-gemm", G_STRUCT_OFFSET (GmlpBackendTuning, host_gemm), CHOICES ({ "cublas", 1 }, { "sm90", 2 }) },
  { "device-gemm", G_STRUCT_OFFSET (GmlpBackendTuning, device_gemm), CHOICES ({ "portable", 1 }) },
  { "loop-streams", G_STRUCT_OFFSET (GmlpBackendTuning, loop_streams), CHOICES ({ "1", 1 }) },
  { "row-tiles", G_STRUCT_OFFSET (GmlpBackendTuning, row_tiles), CHOICES ({ "off", 1 }) },
  { "batched", G_STRUCT_OFFSET (GmlpBackendTuning, batched), CHOICES ({ "off", 1 }) },
  { "sm90-schedule", G_STRUCT_OFFSET (GmlpBackendTuning, sm90_direct), CHOICES ({ "plan", GMLP_TUNING_NEVER }) },
  { "sm90-fp8-tiles", G_STRUCT_OFFSET (GmlpBackendTuning, sm90_fp8_tile_n), CHOICES ({ "128", 128 }, { "192", 192 }) },
  { "sm90-short-tiles", G_STRUCT_OFFSET (GmlpBackendTuning, sm90_short_tiles),
    CHOICES ({ "off", GMLP_TUNING_NEVER }, { "all", GMLP_TUNING_ALWAYS }) },
  { "sm90-pairs", G_STRUCT_OFFSET (GmlpBackendTuning, sm90_pairs), SWITCH },
  { "sm90-even-waves", G_STRUCT_OFFSET (GmlpBackendTuning, sm90_even_waves), SWITCH },
  { "sm90-stream-k", G_STRUCT_OFFSET (GmlpBackendTuning, sm90_stream_k), SWITCH },
  { "sm90-grid", G_STRUCT_OFFSET (GmlpBackendTuning, sm90_max_ctas), NULL },
  { "block-cache", G_STRUCT_OFFSET (GmlpBackendTuning, block_cache), CHOICES ({ "off", GMLP_TUNING_NEVER }) },
};

/* A grid of CTAs is at most this many (more than any GPU has SMs). */
#define MAX_GRID 65536

G_STATIC_ASSERT (sizeof (GmlpTuningChoice) == sizeof (int));

static const TuningKey *
find_key (const char  *key,
          GError     **error)
{
  for (gsize i = 0; i < G_N_ELEMENTS (tuning_keys); i++)
    if (g_strcmp0 (tuning_keys[i].key, key) == 0)
      return &tuning_keys[i];
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
               "Unknown tuning key '%s'", key != NULL ? key : "(null)");
  return NULL;
}

static int *
field_of (GmlpBackendTuning *tuning,
          const TuningKey   *k)
{
  return G_STRUCT_MEMBER_P (tuning, k->offset);
}

gboolean
gmlp_tuning_set (GmlpBackendTuning  *tuning,
                 const char         *key,
                 const char         *value,
                 GError            **error)
{
  const TuningKey *k;
  g_autoptr(GString) allowed = NULL;

  g_return_val_if_fail (tuning != NULL, FALSE);

  k = find_key (key, error);
  if (k == NULL)
    return FALSE;
  if (value == NULL)
    value = "";
  if (k->values == NULL)
    {
      guint64 n = 0;

      if (g_str_equal (value, "auto"))
        {
          *field_of (tuning, k) = 0;
          return TRUE;
        }
      if (!g_ascii_string_to_unsigned (value, 10, 2, MAX_GRID, &n, NULL) || n % 2 != 0)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "Tuning key '%s' takes auto or an even number of CTAs from 2 to %d, not '%s'",
                       key, MAX_GRID, value);
          return FALSE;
        }
      *field_of (tuning, k) = (int) n;
      return TRUE;
    }

  allowed = g_string_new (NULL);
  for (const TuningValue *v = k->values; v->name != NULL; v++)
    {
      if (g_str_equal (v->name, value))
        {
          *field_of (tuning, k) = v->value;
          return TRUE;
        }
      g_string_append_printf (allowed, "%s%s", v == k->values ? "" : ", ", v->name);
    }
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
               "Tuning key '%s' takes %s, not '%s'", key, allowed->str, value);
  return FALSE;
}

char *
gmlp_tuning_get (const GmlpBackendTuning  *tuning,
                 const char               *key,
                 GError                  **error)
{
  const TuningKey *k;
  int value;

  g_return_val_if_fail (tuning != NULL, NULL);

  k = find_key (key, error);
  if (k == NULL)
    return NULL;
  value = *field_of ((GmlpBackendTuning *) tuning, k);
  if (value == 0)
    return g_strdup ("auto");
  if (k->values == NULL)
    return g_strdup_printf ("%d", value);
  for (const TuningValue *v = k->values; v->name != NULL; v++)
    if (v->value == value)
      return g_strdup (v->name);
  g_return_val_if_reached (NULL);
}

gboolean
gmlp_tuning_parse (GmlpBackendTuning  *tuning,
                   const char         *spec,
                   GError            **error)
{
  g_auto(GStrv) items = NULL;
  GmlpBackendTuning parsed;

  g_return_val_if_fail (tuning != NULL, FALSE);

  if (spec == NULL)
    return TRUE;
  parsed = *tuning;
  items = g_strsplit (spec, ",", -1);
  for (guint i = 0; items[i] != NULL; i++)
    {
      char *item = g_strstrip (items[i]);
      char *equals = strchr (item, '=');

      if (item[0] == '\0')
        continue;
      if (equals == NULL)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                       "Tuning '%s': '%s' is not key=value", spec, item);
          return FALSE;
        }
      *equals = '\0';
      if (!gmlp_tuning_set (&parsed, g_strstrip (item), g_strstrip (equals + 1), error))
        return FALSE;
    }
  *tuning = parsed;
  return TRUE;
}

const char * const *
gmlp_tuning_list_keys (void)
{
  static const char *keys[G_N_ELEMENTS (tuning_keys) + 1];
  static gsize once = 0;

  if (g_once_init_enter (&once))
    {
      for (gsize i = 0; i < G_N_ELEMENTS (tuning_keys); i++)
        keys[i] = tuning_keys[i].key;
      g_once_init_leave (&once, 1);
    }
  return keys;
}
