/* fuzz-pools.c: the plain values of the fuzz suite
 *
 * The pools that plain arguments are drawn from (integers near the 32- and
 * 64-bit limits, doubles, strings, array lengths, byte lengths) and the
 * names of their values in a case's description. The catalogue of flavours is in fuzz-values.c.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>

#include "gmlp-fuzz.h"

const gint64 fz_int_pool[] = {
  0, 1, -1,
  G_MAXINT32, (gint64) G_MAXINT32 + 1, G_MININT32,
  G_MAXUINT32, (gint64) G_MAXUINT32 + 1,
  65535, 65536,
  (gint64) 1 << 40, (gint64) 1 << 62,
  G_MAXINT64, G_MININT64,
};
const guint fz_n_int_pool = G_N_ELEMENTS (fz_int_pool);

const double fz_double_pool[] = {
  0.0, -0.0, 1.0, -1.0, NAN, INFINITY, -INFINITY, 1e300, -1e300, 1e-300, 3.5e38, -3.5e38,
  5e-324, 65504.0, 1e-45,
};
const guint fz_n_double_pool = G_N_ELEMENTS (fz_double_pool);

const char *fz_string_pool[] = {
  "cpu", "CPU", "cuda", "cuda:0", "cuda:1", "cuda:65535", "cuda:65536", "cuda:-1", "cuda:",
  "cuda:0x1", "cuda:99999999999999999999", "cuda:0 ", "", " cpu", "gpu", "cpu:0",
  "\xff\xfe", "long",  /* "long": 64 KiB of 'a' */
};
const guint fz_n_string_pool = G_N_ELEMENTS (fz_string_pool);

const guint fz_array_lengths[] = { 0, 1, 3, 64, 65535, 65536, 1 << 20 };
const guint fz_n_array_lengths = G_N_ELEMENTS (fz_array_lengths);

const gsize fz_bytes_sizes[] = { 0, 1, 7, 64, 128, 256, 512, 1024, 2048, 4096, 1 << 20 };
const guint fz_n_bytes_sizes = G_N_ELEMENTS (fz_bytes_sizes);

char *
fz_int_name (gint64 v)
{
  switch (v)
    {
    case G_MAXINT32: return g_strdup ("2^31-1");
    case (gint64) G_MAXINT32 + 1: return g_strdup ("2^31");
    case G_MININT32: return g_strdup ("-2^31");
    case G_MAXUINT32: return g_strdup ("2^32-1");
    case (gint64) G_MAXUINT32 + 1: return g_strdup ("2^32");
    case (gint64) 1 << 40: return g_strdup ("2^40");
    case (gint64) 1 << 62: return g_strdup ("2^62");
    case G_MAXINT64: return g_strdup ("INT64_MAX");
    case G_MININT64: return g_strdup ("INT64_MIN");
    default: return g_strdup_printf ("%" G_GINT64_FORMAT, v);
    }
}

char *
fz_double_name (double v)
{
  if (v == 0.0 && signbit (v))
    return g_strdup ("-0");
  return g_strdup_printf ("%g", v);
}
