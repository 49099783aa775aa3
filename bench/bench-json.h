/* bench-json.h: the benchmark programs' records, as JSON lines (json-glib)
 * or as a table (gmlp-demo's --json lines too)
 *
 * A record is one JSON object: bench_record_new(), members in order, then
 * bench_record_emit() prints it as one line on stdout, or, after
 * bench_output_set_table (TRUE), keeps it for bench_output_print_table(),
 * which prints the records of each kind ("bench") as a table of aligned
 * columns.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <stdio.h>

#include <json-glib/json-glib.h>

G_BEGIN_DECLS

/* A record whose "bench" member is bench (none when NULL) and "device"
 * member is device (none when NULL). */
JsonBuilder *bench_record_new    (const char  *bench,
                                  const char  *device);
void         bench_record_int    (JsonBuilder *record,
                                  const char  *key,
                                  gint64       value);
/* value rounded as format (a printf format of one double, "%.4f" or
 * "%.4g") prints it; null when it is not finite. */
void         bench_record_double (JsonBuilder *record,
                                  const char  *key,
                                  double       value,
                                  const char  *format);
void         bench_record_string (JsonBuilder *record,
                                  const char  *key,
                                  const char  *value);
void         bench_record_bool   (JsonBuilder *record,
                                  const char  *key,
                                  gboolean     value);
/* Prints or keeps the record, and frees record. */
void         bench_record_emit   (JsonBuilder *record);
/* Writes the record to file as one line, and frees record. */
void         bench_record_write  (JsonBuilder *record,
                                  FILE        *file);

void         bench_output_set_table   (gboolean table);
void         bench_output_print_table (void);

G_END_DECLS
