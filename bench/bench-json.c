/* bench-json.c: the benchmark programs' records, as JSON lines or a table
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench-json.h"

static gboolean as_table = FALSE;
/* The records kept for the table (JsonObject), in order. */
static GPtrArray *kept = NULL;

JsonBuilder *
bench_record_new (const char *bench,
                  const char *device)
{
  JsonBuilder *record = json_builder_new ();

  json_builder_begin_object (record);
  if (bench != NULL)
    bench_record_string (record, "bench", bench);
  if (device != NULL)
    bench_record_string (record, "device", device);
  return record;
}

void
bench_record_int (JsonBuilder *record,
                  const char  *key,
                  gint64       value)
{
  json_builder_set_member_name (record, key);
  json_builder_add_int_value (record, value);
}

void
bench_record_double (JsonBuilder *record,
                     const char  *key,
                     double       value,
                     const char  *format)
{
  char buf[G_ASCII_DTOSTR_BUF_SIZE];

  json_builder_set_member_name (record, key);
  if (!isfinite (value))
    {
      json_builder_add_null_value (record);
      return;
    }
  /* Rounded as format rounds (record_line() writes what that gives). */
  json_builder_add_double_value (record, g_ascii_strtod (g_ascii_formatd (buf, sizeof buf, format, value), NULL));
}

void
bench_record_string (JsonBuilder *record,
                     const char  *key,
                     const char  *value)
{
  json_builder_set_member_name (record, key);
  json_builder_add_string_value (record, value);
}

void
bench_record_bool (JsonBuilder *record,
                   const char  *key,
                   gboolean     value)
{
  json_builder_set_member_name (record, key);
  json_builder_add_boolean_value (record, value);
}

/* The record as one line of JSON. json-glib 1.6 writes every double with
 * 17 digits (6.1719999999999997 for 6.172): json-glib writes the keys and
 * the other values, and doubles are written with the 15 digits that give
 * back the rounded value. */
static char *
record_line (JsonObject *object)
{
  g_autoptr(GString) line = g_string_new ("{");
  g_autoptr(GList) members = json_object_get_members (object);
  GList *l;

  for (l = members; l != NULL; l = l->next)
    {
      JsonNode *value = json_object_get_member (object, l->data);
      g_autoptr(JsonNode) key = json_node_init_string (json_node_alloc (), l->data);
      g_autofree char *key_text = json_to_string (key, FALSE);

      g_string_append_printf (line, "%s%s:", l == members ? "" : ",", key_text);
      if (JSON_NODE_HOLDS_VALUE (value) && json_node_get_value_type (value) == G_TYPE_DOUBLE)
        {
          char buf[G_ASCII_DTOSTR_BUF_SIZE];

          g_string_append (line, g_ascii_formatd (buf, sizeof buf, "%.15g", json_node_get_double (value)));
        }
      else
        {
          g_autofree char *text = json_to_string (value, FALSE);

          g_string_append (line, text);
        }
    }
  g_string_append_c (line, '}');
  return g_string_free (g_steal_pointer (&line), FALSE);
}

void
bench_record_write (JsonBuilder *record,
                    FILE        *file)
{
  g_autoptr(JsonNode) root = NULL;
  g_autofree char *line = NULL;

  json_builder_end_object (record);
  root = json_builder_get_root (record);
  g_object_unref (record);
  line = record_line (json_node_get_object (root));
  /* JSON is UTF-8 whatever the locale: not through g_print, which
   * converts to the locale's charset. */
  fputs (line, file);
  fputc ('\n', file);
  fflush (file);
}

void
bench_record_emit (JsonBuilder *record)
{
  g_autoptr(JsonNode) root = NULL;

  if (!as_table)
    {
      bench_record_write (record, stdout);
      return;
    }
  json_builder_end_object (record);
  root = json_builder_get_root (record);
  g_object_unref (record);
  if (kept == NULL)
    kept = g_ptr_array_new_with_free_func ((GDestroyNotify) json_object_unref);
  g_ptr_array_add (kept, json_object_ref (json_node_get_object (root)));
}

void
bench_output_set_table (gboolean table)
{
  as_table = table;
}

/* A member's value as a table cell. */
static char *
cell_text (JsonNode *node)
{
  char buf[G_ASCII_DTOSTR_BUF_SIZE];

  if (JSON_NODE_HOLDS_NULL (node))
    return g_strdup ("–");
  switch (json_node_get_value_type (node))
    {
    case G_TYPE_INT64:
      return g_strdup_printf ("%" G_GINT64_FORMAT, json_node_get_int (node));
    case G_TYPE_DOUBLE:
      /* The value as bench_record_double() rounded it. */
      return g_strdup (g_ascii_formatd (buf, sizeof buf, "%.15g", json_node_get_double (node)));
    case G_TYPE_BOOLEAN:
      return g_strdup (json_node_get_boolean (node) ? "yes" : "no");
    case G_TYPE_STRING:
      return g_strdup (json_node_get_string (node));
    default:
      return g_strdup ("?");
    }
}

static gboolean
is_number (JsonNode *node)
{
  return JSON_NODE_HOLDS_VALUE (node) &&
         (json_node_get_value_type (node) == G_TYPE_INT64 || json_node_get_value_type (node) == G_TYPE_DOUBLE);
}

/* How many characters of a number's text come from its decimal point on
 * (0 without one). */
static guint
fraction_length (const char *text)
{
  const char *point = strchr (text, '.');

  return point != NULL ? (guint) strlen (point) : 0;
}

/* Pads text (UTF-8) to width characters, on the left for numbers. */
static void
print_cell (GString *out, const char *text, guint width, gboolean right)
{
  glong n = g_utf8_strlen (text, -1);
  guint pad = width > (guint) n ? width - (guint) n : 0;

  if (right)
    g_string_append_printf (out, "%*s%s", pad, "", text);
  else
    g_string_append_printf (out, "%s%*s", text, pad, "");
}

/* The records whose "bench" and "device" are those of records[first], as
 * one table: a column per member (in the order they first appear),
 * "bench" and "device" in the heading. */
static void
print_one_table (GPtrArray *records, const char *bench, const char *device)
{
  g_autoptr(GPtrArray) columns = g_ptr_array_new ();
  g_autoptr(GString) out = g_string_new (NULL);
  g_autofree guint *widths = NULL, *fractions = NULL;
  g_autofree gboolean *numeric = NULL;
  guint r, c, i;

  for (r = 0; r < records->len; r++)
    {
      g_autoptr(GList) members = json_object_get_members (records->pdata[r]);
      GList *l;

      for (l = members; l != NULL; l = l->next)
        if (strcmp (l->data, "bench") != 0 && strcmp (l->data, "device") != 0 &&
            !g_ptr_array_find_with_equal_func (columns, l->data, g_str_equal, NULL))
          g_ptr_array_add (columns, l->data);
    }
  /* Numbers are aligned on their decimal points: a column's numbers are
   * padded on the right to its longest fraction. */
  widths = g_new0 (guint, columns->len);
  fractions = g_new0 (guint, columns->len);
  numeric = g_new0 (gboolean, columns->len);
  for (c = 0; c < columns->len; c++)
    {
      guint integers = 0;

      numeric[c] = TRUE;
      for (r = 0; r < records->len; r++)
        {
          JsonNode *node = json_object_get_member (records->pdata[r], columns->pdata[c]);
          g_autofree char *text = node != NULL ? cell_text (node) : g_strdup ("");
          guint fraction = node != NULL && is_number (node) ? fraction_length (text) : 0;

          fractions[c] = MAX (fractions[c], fraction);
          integers = MAX (integers, (guint) g_utf8_strlen (text, -1) - fraction);
          if (node != NULL && !is_number (node) && !JSON_NODE_HOLDS_NULL (node))
            numeric[c] = FALSE;
        }
      if (!numeric[c])
        fractions[c] = 0;
      widths[c] = MAX ((guint) g_utf8_strlen (columns->pdata[c], -1), integers + fractions[c]);
    }

  g_string_append_printf (out, "%s%s%s\n\n", bench ? bench : "records", device ? " on " : "", device ? device : "");
  for (c = 0; c < columns->len; c++)
    {
      print_cell (out, columns->pdata[c], widths[c], numeric[c]);
      g_string_append (out, c + 1 < columns->len ? "  " : "\n");
    }
  for (c = 0; c < columns->len; c++)
    {
      for (i = 0; i < widths[c]; i++)
        g_string_append_c (out, '-');
      g_string_append (out, c + 1 < columns->len ? "  " : "\n");
    }
  for (r = 0; r < records->len; r++)
    for (c = 0; c < columns->len; c++)
      {
        JsonNode *node = json_object_get_member (records->pdata[r], columns->pdata[c]);
        g_autofree char *text = node != NULL ? cell_text (node) : g_strdup ("");
        guint fraction = node != NULL && is_number (node) ? fraction_length (text) : 0;

        if (numeric[c])
          {
            char *padded = g_strdup_printf ("%s%*s", text, (int) (fractions[c] - fraction), "");

            g_free (text);
            text = padded;
          }
        print_cell (out, text, widths[c], numeric[c]);
        g_string_append (out, c + 1 < columns->len ? "  " : "\n");
      }
  /* A table is for people: in the locale's charset. */
  g_print ("%s\n", out->str);
}

void
bench_output_print_table (void)
{
  g_autoptr(GPtrArray) order = g_ptr_array_new_with_free_func (g_free);
  guint i, r;

  if (kept == NULL)
    return;
  /* One table per kind of record and device, in the order they came. */
  for (r = 0; r < kept->len; r++)
    {
      JsonObject *o = kept->pdata[r];
      g_autofree char *key = g_strdup_printf ("%s\n%s", json_object_get_string_member_with_default (o, "bench", ""),
                                              json_object_get_string_member_with_default (o, "device", ""));

      if (!g_ptr_array_find_with_equal_func (order, key, g_str_equal, NULL))
        g_ptr_array_add (order, g_steal_pointer (&key));
    }
  for (i = 0; i < order->len; i++)
    {
      g_autoptr(GPtrArray) records = g_ptr_array_new ();
      g_auto(GStrv) parts = g_strsplit (order->pdata[i], "\n", 2);

      for (r = 0; r < kept->len; r++)
        {
          JsonObject *o = kept->pdata[r];

          if (g_strcmp0 (json_object_get_string_member_with_default (o, "bench", ""), parts[0]) == 0 &&
              g_strcmp0 (json_object_get_string_member_with_default (o, "device", ""), parts[1]) == 0)
            g_ptr_array_add (records, o);
        }
      print_one_table (records, *parts[0] ? parts[0] : NULL, *parts[1] ? parts[1] : NULL);
    }
  g_clear_pointer (&kept, g_ptr_array_unref);
}
