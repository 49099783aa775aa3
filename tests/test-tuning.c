/* test-tuning.c: a device's tuning (libgmlp/gmlp-tuning-private.h)
 *
 * Its keys take their values and refuse others with a GError, leaving the
 * tuning as it was; a device keeps what is set; and no source of the
 * library or the kernels reads an environment variable but GMLP_DEVICE and
 * GMLP_BACKEND_DIR (and GMLP_DEBUG, debug keys like G_DEBUG's), nor names
 * one of the variables that steered routes and schedules or filled memory
 * before. GMLP_DEBUG=poison fills fresh memory with 0xff bytes,
 * GMLP_DEBUG=no-block-cache opens devices with the tuning's block-cache
 * off, and GMLP_DEBUG=help lists the keys.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-device-private.h"
#include "gmlp-tuning-private.h"

/* Every key: "auto" when fresh, and each value it takes read back. */
static void
test_keys (void)
{
  static const char * const values[][4] = {
    { "host-gemm", "cublas", "sm90", NULL },
    { "device-gemm", "portable", NULL },
    { "loop-streams", "1", NULL },
    { "row-tiles", "off", NULL },
    { "batched", "off", NULL },
    { "sm90-schedule", "plan", NULL },
    { "sm90-fp8-tiles", "128", "192", NULL },
    { "sm90-short-tiles", "off", "all", NULL },
    { "sm90-pairs", "off", "on", NULL },
    { "sm90-even-waves", "off", "on", NULL },
    { "sm90-stream-k", "off", "on", NULL },
    { "sm90-grid", "2", "6", "132" },
    { "block-cache", "off", NULL },
  };
  const char * const *keys = gmlp_tuning_list_keys ();
  GmlpBackendTuning tuning = { 0 }, zero = { 0 };
  g_autoptr(GError) error = NULL;

  g_assert_cmpuint (g_strv_length ((char **) keys), ==, G_N_ELEMENTS (values));
  for (gsize i = 0; i < G_N_ELEMENTS (values); i++)
    {
      const char *key = values[i][0];
      g_autofree char *fresh = gmlp_tuning_get (&tuning, key, &error);

      g_assert_no_error (error);
      g_assert_true (g_strv_contains (keys, key));
      g_assert_cmpstr (fresh, ==, "auto");
      for (gsize j = 1; j < G_N_ELEMENTS (values[i]) && values[i][j] != NULL; j++)
        {
          g_autofree char *read = NULL;

          g_assert_true (gmlp_tuning_set (&tuning, key, values[i][j], &error));
          g_assert_no_error (error);
          read = gmlp_tuning_get (&tuning, key, &error);
          g_assert_no_error (error);
          g_assert_cmpstr (read, ==, values[i][j]);
        }
      g_assert_true (gmlp_tuning_set (&tuning, key, "auto", &error));
      g_assert_no_error (error);
    }
  g_assert_cmpmem (&tuning, sizeof tuning, &zero, sizeof zero);

  /* The fields that the CUDA backend reads. */
  g_assert_true (gmlp_tuning_parse (&tuning, "host-gemm=sm90, sm90-schedule=plan,sm90-fp8-tiles=192,"
                                    "sm90-pairs=on,sm90-short-tiles=off,sm90-grid=6,", &error));
  g_assert_no_error (error);
  g_assert_cmpint (tuning.host_gemm, ==, 2);
  g_assert_cmpint (tuning.sm90_direct, ==, GMLP_TUNING_NEVER);
  g_assert_cmpint (tuning.sm90_fp8_tile_n, ==, 192);
  g_assert_cmpint (tuning.sm90_pairs, ==, GMLP_TUNING_ALWAYS);
  g_assert_cmpint (tuning.sm90_short_tiles, ==, GMLP_TUNING_NEVER);
  g_assert_cmpint (tuning.sm90_max_ctas, ==, 6);
  g_assert_cmpint (tuning.sm90_even_waves, ==, GMLP_TUNING_AUTO);
}

/* Unknown keys, values a key does not take and malformed lists: a GError
 * that names them, the tuning untouched. */
static void
test_refuses (void)
{
  static const char * const bad[][2] = {
    { "no-such-key", "auto" },
    { "", "auto" },
    { "HOST-GEMM", "sm90" },
    { "host-gemm", "cuBLAS" },
    { "host-gemm", "" },
    { "host-gemm", NULL },
    { "device-gemm", "sm90" },
    { "sm90-fp8-tiles", "64" },
    { "sm90-pairs", "1" },
    { "sm90-grid", "0" },
    { "sm90-grid", "1" },
    { "sm90-grid", "7" },
    { "sm90-grid", "-6" },
    { "sm90-grid", "6x" },
    { "sm90-grid", "131072" },
  };
  static const char * const bad_specs[] = {
    "host-gemm",
    "host-gemm=sm90,sm90-grid",
    "host-gemm=sm90,sm90-grid=5",
    "host-gemm=sm90,bogus=1",
  };
  GmlpBackendTuning tuning = { 0 }, before;

  g_assert_true (gmlp_tuning_set (&tuning, "sm90-grid", "6", NULL));
  before = tuning;
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_false (gmlp_tuning_set (&tuning, bad[i][0], bad[i][1], &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
      g_assert_nonnull (strstr (error->message, bad[i][0]));
      g_assert_cmpmem (&tuning, sizeof tuning, &before, sizeof before);
    }
  for (gsize i = 0; i < G_N_ELEMENTS (bad_specs); i++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_false (gmlp_tuning_parse (&tuning, bad_specs[i], &error));
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
      g_assert_cmpmem (&tuning, sizeof tuning, &before, sizeof before);
    }
  {
    g_autoptr(GError) error = NULL;

    g_assert_null (gmlp_tuning_get (&tuning, "no-such-key", &error));
    g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  }
}

/* A device keeps its tuning; the CPU's backend has nothing to force and
 * takes every key all the same. A bad key or value leaves it as it was. */
static void
test_device (void)
{
  g_autoptr(GmlpDevice) device = gmlp_test_device_or_skip ();
  g_autoptr(GError) error = NULL;
  g_autofree char *grid = NULL;

  if (device == NULL)
    return;
  g_assert_true (gmlp_device_set_tuning (device, "host-gemm", "sm90", &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_test_tuned (device, "host-gemm", "sm90"));
  g_assert_true (gmlp_device_apply_tuning (device, "sm90-grid=6,sm90-stream-k=on", &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_test_tuned (device, "sm90-stream-k", "on"));

  g_assert_false (gmlp_device_set_tuning (device, "host-gemm", "sm100", &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_false (gmlp_device_apply_tuning (device, "sm90-grid=8,row-tiles=maybe", &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_null (gmlp_device_get_tuning (device, "sm90_grid", &error));
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT);
  g_clear_error (&error);
  g_assert_true (gmlp_test_tuned (device, "host-gemm", "sm90"));
  grid = gmlp_device_get_tuning (device, "sm90-grid", &error);
  g_assert_no_error (error);
  g_assert_cmpstr (grid, ==, "6");

  /* The same object for the same device: what is set stays set. */
  {
    g_autoptr(GmlpDevice) again = gmlp_test_device_or_skip ();

    g_assert_true (again == device);
    g_assert_true (gmlp_test_tuned (again, "sm90-stream-k", "on"));
  }

  for (const char * const *key = gmlp_tuning_list_keys (); *key != NULL; key++)
    {
      g_assert_true (gmlp_device_set_tuning (device, *key, "auto", &error));
      g_assert_no_error (error);
    }
  g_assert_true (gmlp_test_tuned (device, "host-gemm", "auto"));
}

/* The variables that steered routes and schedules before the tuning. */
static const char * const old_variables[] = {
  "GMLP_CUDA_HOST_GEMM", "GMLP_CUDA_DEVICE_GEMM", "GMLP_CUDA_LOOP_STREAMS",
  "GMLP_CUDA_NO_ROW_TILES", "GMLP_CUDA_NO_BATCHED", "GMLP_SM90_SCHEDULE",
  "GMLP_SM90_FP8_TILES", "GMLP_SM90_SHORT_TILES", "GMLP_SM90_PAIRS",
  "GMLP_SM90_EVEN_WAVES", "GMLP_SM90_GRID", "GMLP_SM90_STREAM_K",
  /* now GMLP_DEBUG=poison */
  "GMLP_POISON",
};

/* What the library may read: GMLP_DEBUG's keys are testing aids (poison:
 * fresh memory filled with NaN), no route or schedule. */
static const char * const allowed_variables[] = {
  "GMLP_DEVICE", "GMLP_BACKEND_DIR", "GMLP_DEBUG",
  /* gmlp_communicator_new_from_launcher(): the launcher's contract */
  "GMLP_RANK", "GMLP_WORLD_SIZE", "GMLP_UNIQUE_ID", "GMLP_TIMEOUT_MS", NULL,
};

static void
check_source (const char *path,
              guint      *n_files,
              guint      *n_reads)
{
  g_autoptr(GError) error = NULL;
  g_autofree char *text = NULL;
  g_autoptr(GRegex) getenv = g_regex_new ("getenv\\s*\\(\\s*(\"?)([^\")]*)", 0, 0, &error);
  g_autoptr(GMatchInfo) match = NULL;

  g_assert_no_error (error);
  g_assert_true (g_file_get_contents (path, &text, NULL, &error));
  g_assert_no_error (error);
  (*n_files)++;
  for (gsize i = 0; i < G_N_ELEMENTS (old_variables); i++)
    {
      /* The whole name: GMLP_CUDA_HOST_GEMM_SM90 is an enum value. */
      g_autofree char *pattern = g_strdup_printf ("\\b%s\\b", old_variables[i]);

      if (g_regex_match_simple (pattern, text, 0, 0))
        g_error ("%s still names %s", path, old_variables[i]);
    }
  g_regex_match (getenv, text, 0, &match);
  for (; g_match_info_matches (match); g_match_info_next (match, NULL))
    {
      g_autofree char *quote = g_match_info_fetch (match, 1);
      g_autofree char *name = g_match_info_fetch (match, 2);

      /* A name given as a variable could be anything. */
      if (quote[0] == '\0' || !g_strv_contains (allowed_variables, name))
        g_error ("%s reads the environment variable %s%s", path, name,
                 quote[0] == '\0' ? " (not a literal name)" : "");
      (*n_reads)++;
    }
}

static void
check_tree (const char *dir,
            guint      *n_files,
            guint      *n_reads)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GDir) listing = g_dir_open (dir, 0, &error);
  const char *name;

  g_assert_no_error (error);
  while ((name = g_dir_read_name (listing)) != NULL)
    {
      g_autofree char *path = g_build_filename (dir, name, NULL);

      if (g_file_test (path, G_FILE_TEST_IS_DIR))
        check_tree (path, n_files, n_reads);
      else if (g_str_has_suffix (name, ".c") || g_str_has_suffix (name, ".h") ||
               g_str_has_suffix (name, ".cu") || g_str_has_suffix (name, ".cuh"))
        check_source (path, n_files, n_reads);
    }
}

/* No source of the library (its backends included) or of the kernels
 * reads an environment variable it may not, or names an old one. */
static void
test_no_environment (void)
{
  static const char * const trees[] = { "libgmlp", "kernels" };
  guint n_files = 0, n_reads = 0;

  for (gsize i = 0; i < G_N_ELEMENTS (trees); i++)
    {
      g_autofree char *dir = g_test_build_filename (G_TEST_DIST, "..", trees[i], NULL);

      if (!g_file_test (dir, G_FILE_TEST_IS_DIR))
        {
          g_test_skip ("the sources are not here (G_TEST_SRCDIR)");
          return;
        }
      check_tree (dir, &n_files, &n_reads);
    }
  /* The scan found the sources, and the reads that are allowed. */
  g_assert_cmpuint (n_files, >, 50);
  g_assert_cmpuint (n_reads, >=, 2);
}

/* GMLP_DEBUG=help, read in a fresh process, lists the keys and sets none. */
static void
test_debug_help (void)
{
  if (g_test_subprocess ())
    {
      g_setenv ("GMLP_DEBUG", "help", TRUE);
      g_assert_cmpint (gmlp_debug_flags (), ==, 0);
      return;
    }
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_passed ();
  g_test_trap_assert_stderr ("*poison*");
  g_test_trap_assert_stderr ("*no-block-cache*");
}

/* GMLP_DEBUG=poison, read once in a fresh process: fresh memory holds 0xff
 * bytes, and a later change of the variable is not seen. */
static void
test_debug_poison (void)
{
  g_autoptr(GmlpDevice) device = NULL;
  g_autoptr(GmlpBuffer) buffer = NULL;
  g_autoptr(GError) error = NULL;
  guint8 bytes[100];

  if (!g_test_subprocess ())
    {
      g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
      g_test_trap_assert_passed ();
      return;
    }
  g_setenv ("GMLP_DEBUG", "poison", TRUE);
  g_assert_cmpint (gmlp_debug_flags (), ==, GMLP_DEBUG_POISON);
  g_setenv ("GMLP_DEBUG", "", TRUE);
  g_assert_true (gmlp_test_poisoned ());
  device = gmlp_device_new_from_string ("cpu", &error);
  g_assert_no_error (error);
  buffer = gmlp_buffer_new (device, sizeof bytes, &error);
  g_assert_no_error (error);
  g_assert_true (GMLP_DEVICE_CALL (device, download, bytes, buffer->data, sizeof bytes, &error));
  g_assert_no_error (error);
  for (gsize i = 0; i < sizeof bytes; i++)
    g_assert_cmpuint (bytes[i], ==, 0xff);
}

/* GMLP_DEBUG=no-block-cache, read once in a fresh process: a device opens
 * with its tuning's block-cache off, handed to the backend as any tuning
 * (the CUDA backend then keeps no freed block; the CPU's keeps none
 * anyway), and the key can be set back like any other. */
static void
test_debug_no_block_cache (void)
{
  g_autoptr(GmlpDevice) device = NULL;
  g_autoptr(GmlpDevice) other = NULL;
  g_autoptr(GError) error = NULL;

  if (!g_test_subprocess ())
    {
      g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
      g_test_trap_assert_passed ();
      return;
    }
  g_setenv ("GMLP_DEBUG", "no-block-cache", TRUE);
  g_assert_cmpint (gmlp_debug_flags (), ==, GMLP_DEBUG_NO_BLOCK_CACHE);
  g_setenv ("GMLP_DEBUG", "", TRUE);
  device = gmlp_device_new_from_string ("cpu:3", &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_test_tuned (device, "block-cache", "off"));
  /* Every device, and the other keys left to the heuristics. */
  other = gmlp_device_new_from_string ("cpu:4", &error);
  g_assert_no_error (error);
  g_assert_true (gmlp_test_tuned (other, "block-cache", "off"));
  g_assert_true (gmlp_test_tuned (other, "host-gemm", "auto"));
  g_assert_true (gmlp_device_set_tuning (device, "block-cache", "auto", &error));
  g_assert_no_error (error);
  g_assert_true (gmlp_test_tuned (device, "block-cache", "auto"));
  g_assert_true (gmlp_test_tuned (other, "block-cache", "off"));
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/Tuning/keys", test_keys);
  g_test_add_func ("/Gmlp/Tuning/refuses", test_refuses);
  g_test_add_func ("/Gmlp/Tuning/device", test_device);
  g_test_add_func ("/Gmlp/Tuning/no-environment", test_no_environment);
  g_test_add_func ("/Gmlp/Debug/help", test_debug_help);
  g_test_add_func ("/Gmlp/Debug/poison", test_debug_poison);
  g_test_add_func ("/Gmlp/Debug/no-block-cache", test_debug_no_block_cache);

  return g_test_run ();
}
