/* test-launch.c: gmlp-launch and the CPU communicator across processes
 *
 * Runs the launcher ($GMLP_LAUNCH) on launch-rank ($GMLP_LAUNCH_RANK) with
 * --devices cpu: every collective on 2, 3 and 4 processes against
 * references each rank computes from a shared seed; ranks that disagree,
 * abort, stay away past the timeout, leave, exit non-zero, or die by SIGKILL
 * mid-collective (the others get GMLP_ERROR_ABORTED naming it, the
 * launcher names it and exits non-zero, and no shared memory is left), or
 * all exit before joining (the launcher removes the shared memory's name);
 * the launcher's bad usage; and gmlp_communicator_new_from_launcher()
 * outside a launcher. In the gpu suite, every collective and the rank that
 * dies on 2 and 4 GPUs (NCCL), skipped with fewer than two.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "gmlp-test-util.h"

/* The gpu suite (GMLP_TEST_DEVICE=cuda) runs the ranks on GPUs, over NCCL:
 * every collective and the rank that dies, where there are two GPUs. */
static gboolean
on_cuda (void)
{
  const char *spec = g_getenv ("GMLP_TEST_DEVICE");

  return spec != NULL && g_str_has_prefix (spec, "cuda");
}

static const char *
devices (void)
{
  return on_cuda () ? "cuda" : "cpu";
}

/* Tests of the CPU alone skip in the gpu suite; those of both skip there
 * with fewer than n GPUs. */
static gboolean
cpu_only (void)
{
  if (!on_cuda ())
    return FALSE;
  g_test_skip ("the CPU's test (the gpu suite runs collectives and rank-dies)");
  return TRUE;
}

static int
gpus_or_skip (int n)
{
  int count;

  if (!on_cuda ())
    return n;
  count = gmlp_device_get_count (GMLP_DEVICE_KIND_CUDA);
  if (count < 2)
    {
      g_test_skip ("needs two GPUs");
      return 0;
    }
  return MIN (n, count);
}

typedef struct {
  char *out;
  char *err;
  int   status;   /* the launcher's wait status */
} Run;

static void
run_clear (Run *run)
{
  g_clear_pointer (&run->out, g_free);
  g_clear_pointer (&run->err, g_free);
}

/* Runs gmlp-launch with args (NULL-terminated), then launch-rank MODE SEED
 * unless mode is NULL. */
static gboolean
launch (Run         *run,
        const char  *mode,
        ...)
{
  const char *launcher = g_getenv ("GMLP_LAUNCH"), *rank = g_getenv ("GMLP_LAUNCH_RANK");
  g_autoptr(GPtrArray) argv = g_ptr_array_new_with_free_func (g_free);
  g_autoptr(GError) error = NULL;
  const char *arg;
  va_list ap;

  memset (run, 0, sizeof *run);
  if (launcher == NULL || rank == NULL)
    {
      g_test_skip ("GMLP_LAUNCH and GMLP_LAUNCH_RANK name the programs (meson test sets them)");
      return FALSE;
    }
  g_ptr_array_add (argv, g_strdup (launcher));
  va_start (ap, mode);
  while ((arg = va_arg (ap, const char *)) != NULL)
    g_ptr_array_add (argv, g_strdup (arg));
  va_end (ap);
  if (mode != NULL)
    {
      g_ptr_array_add (argv, g_strdup (rank));
      g_ptr_array_add (argv, g_strdup (mode));
      g_ptr_array_add (argv, g_strdup_printf ("%u", g_test_rand_int ()));
    }
  g_ptr_array_add (argv, NULL);

  g_assert_true (g_spawn_sync (NULL, (char **) argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL,
                               &run->out, &run->err, &run->status, &error));
  g_assert_no_error (error);
  g_test_message ("%s %s: status %d\n--- stdout\n%s--- stderr\n%s", launcher, mode ? mode : "",
                  run->status, run->out, run->err);
  return TRUE;
}

static int
exit_code (const Run *run)
{
  g_assert_true (WIFEXITED (run->status));
  return WEXITSTATUS (run->status);
}

/* The lines of out that start with prefix. */
static guint
count_lines (const char *out,
             const char *prefix)
{
  g_auto(GStrv) lines = g_strsplit (out, "\n", -1);
  guint n = 0;

  for (guint i = 0; lines[i] != NULL; i++)
    n += g_str_has_prefix (lines[i], prefix);
  return n;
}

static void
assert_no_failure (const Run *run)
{
  if (strstr (run->out, "FAILED") != NULL)
    g_error ("a rank failed:\n%s%s", run->out, run->err);
}

/* The group's shared memory is gone: its name is /gmlp- and the backend's
 * id (after the 16 bytes that name the backend), whose first 16 bytes a
 * rank printed after marker ("rank 0: id " and the id in hex). */
static void
assert_no_shm_named_after (const Run  *run,
                           const char *marker)
{
  const char *at = strstr (run->out, marker);
  g_autofree char *hex = NULL, *path = NULL;

  g_assert_nonnull (at);
  hex = g_strndup (at + strlen (marker) + 32, 32);
  g_assert_cmpuint (strlen (hex), ==, 32);
  path = g_strdup_printf ("/dev/shm/gmlp-%s", hex);
  g_assert_false (g_file_test (path, G_FILE_TEST_EXISTS));
}

static void
assert_no_shm_left (const Run *run)
{
  assert_no_shm_named_after (run, "rank 0: id ");
}

static void
test_collectives (void)
{
  int most = gpus_or_skip (4);

  for (int n = 2; n <= most; n++)
    {
      g_autofree char *np = g_strdup_printf ("%d", n);
      Run run;

      if (on_cuda () && n == 3)
        continue;   /* 2 and 4 GPUs */
      if (!launch (&run, "collectives", "-n", np, "--devices", devices (), "--tag", NULL))
        return;
      assert_no_failure (&run);
      g_assert_cmpint (exit_code (&run), ==, 0);
      for (int r = 0; r < n; r++)
        {
          g_autofree char *prefix = g_strdup_printf ("[%d] rank %d: ok ", r, r);

          /* every check of run_collectives() */
          g_assert_cmpuint (count_lines (run.out, prefix), ==, 8);
        }
      if (!on_cuda ())
        assert_no_shm_left (&run);
      run_clear (&run);
    }
}

static void
test_faults (void)
{
  Run run;

  if (cpu_only ())
    return;
  if (!launch (&run, "faults", "-n", "3", "--devices", "cpu", "--tag", "--timeout-ms", "20000", NULL))
    return;
  assert_no_failure (&run);
  g_assert_cmpint (exit_code (&run), ==, 0);
  for (int r = 0; r < 3; r++)
    {
      g_autofree char *mismatch = g_strdup_printf ("[%d] rank %d: ok shape mismatch", r, r);
      g_autofree char *aborted = g_strdup_printf ("[%d] rank %d: ok ABORTED", r, r);

      g_assert_cmpuint (count_lines (run.out, mismatch), ==, 1);
      g_assert_cmpuint (count_lines (run.out, aborted), ==, r < 2 ? 1 : 0);
    }
  run_clear (&run);
}

static void
test_timeout (void)
{
  Run run;

  if (cpu_only ())
    return;
  if (!launch (&run, "timeout", "-n", "2", "--devices", "cpu", "--tag", "--timeout-ms", "300", NULL))
    return;
  assert_no_failure (&run);
  g_assert_cmpint (exit_code (&run), ==, 0);
  g_assert_cmpuint (count_lines (run.out, "[0] rank 0: ok ABORTED"), ==, 1);
  g_assert_nonnull (strstr (run.out, "waited 300 ms"));
  run_clear (&run);
}

/* A rank that leaves (its communicator dropped, its process gone with 0):
 * the others get ABORTED naming it at once; the launcher exits with 0. */
static void
test_rank_leaves (void)
{
  Run run;

  if (cpu_only ())
    return;
  if (!launch (&run, "leaves", "-n", "3", "--devices", "cpu", "--tag", "--timeout-ms", "60000", NULL))
    return;
  assert_no_failure (&run);
  g_assert_cmpint (exit_code (&run), ==, 0);
  g_assert_cmpuint (count_lines (run.out, "[0] rank 0: ok ABORTED"), ==, 1);
  g_assert_cmpuint (count_lines (run.out, "[1] rank 1: ok ABORTED"), ==, 1);
  g_assert_cmpuint (count_lines (run.out, "[2] rank 2: ok left"), ==, 1);
  run_clear (&run);
}

/* A rank killed mid-collective: the others get ABORTED (on the CPU at
 * once; on GPUs when the watchdog's timeout has passed), then the
 * launcher's SIGTERM (ignored: they report and leave), and the launcher
 * exits with 128 + 9 naming the rank. */
static void
test_rank_dies (void)
{
  int n = gpus_or_skip (3);
  g_autofree char *np = g_strdup_printf ("%d", n);
  g_autofree char *named = g_strdup_printf ("gmlp-launch: rank %d ", n - 1);
  Run run;

  if (n == 0 || !launch (&run, "dies", "-n", np, "--devices", devices (), "--tag", "--timeout-ms",
                         on_cuda () ? "5000" : "60000", "--grace-ms", "30000", NULL))
    return;
  assert_no_failure (&run);
  g_assert_cmpint (exit_code (&run), ==, 128 + 9);
  g_assert_nonnull (strstr (run.err, named));
  g_assert_nonnull (strstr (run.err, "killed by signal 9"));
  for (int r = 0; r < n - 1; r++)
    {
      g_autofree char *aborted = g_strdup_printf ("[%d] rank %d: ok ABORTED", r, r);

      g_assert_cmpuint (count_lines (run.out, aborted), ==, 1);
    }
  if (!on_cuda ())
    assert_no_shm_left (&run);
  run_clear (&run);
}

/* A rank that exits with 3: the launcher stops the others (SIGTERM) and
 * exits with 3 naming it. Without --tag the lines are the ranks' own. */
static void
test_rank_fails (void)
{
  Run run;

  if (cpu_only ())
    return;
  if (!launch (&run, "fails", "-n", "2", "--devices", "cpu", "--grace-ms", "2000", NULL))
    return;
  g_assert_cmpint (exit_code (&run), ==, 3);
  g_assert_nonnull (strstr (run.err, "gmlp-launch: rank 1 "));
  g_assert_nonnull (strstr (run.err, "exited with status 3"));
  g_assert_cmpuint (count_lines (run.out, "rank 1: ok exiting with 3"), ==, 1);
  g_assert_null (strstr (run.out, "[1]"));
  run_clear (&run);
}

/* Ranks that exit with 1 once they have taken their place in the group,
 * before joining it (so no rank unlinks the shared memory's name): the
 * launcher names one, exits with 1, and removes the name itself. */
static void
test_rank_quits (void)
{
  Run run;

  if (cpu_only ())
    return;
  if (!launch (&run, "quits", "-n", "3", "--devices", "cpu", "--tag", "--grace-ms", "20000", NULL))
    return;
  assert_no_failure (&run);
  g_assert_cmpint (exit_code (&run), ==, 1);
  g_assert_nonnull (strstr (run.err, "exited with status 1"));
  /* The first rank to exit had seen the shared memory's name (the others
   * may have died of the launcher's SIGTERM first). */
  assert_no_shm_named_after (&run, "ok quitting before the join, id ");
  run_clear (&run);
}

/* Ctrl-C: the launcher forwards SIGINT to the ranks, which die of it, and
 * exits with 128 + 2; no rank is named as failing. */
static void
test_interrupt (void)
{
  const char *launcher = g_getenv ("GMLP_LAUNCH"), *rank = g_getenv ("GMLP_LAUNCH_RANK");
  g_autoptr(GSubprocess) process = NULL;
  g_autoptr(GDataInputStream) out = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree char *err = NULL;
  guint n_sleeping = 0;
  gint64 start;

  if (cpu_only ())
    return;
  if (launcher == NULL || rank == NULL)
    {
      g_test_skip ("GMLP_LAUNCH and GMLP_LAUNCH_RANK name the programs (meson test sets them)");
      return;
    }
  process = g_subprocess_new (G_SUBPROCESS_FLAGS_STDOUT_PIPE | G_SUBPROCESS_FLAGS_STDERR_PIPE, &error,
                              launcher, "-n", "2", "--devices", "cpu", "--tag", "--grace-ms", "20000",
                              rank, "sleeps", "1", NULL);
  g_assert_no_error (error);
  out = g_data_input_stream_new (g_subprocess_get_stdout_pipe (process));
  /* Both ranks have joined the group. */
  while (n_sleeping < 2)
    {
      g_autofree char *line = g_data_input_stream_read_line (out, NULL, NULL, &error);

      g_assert_no_error (error);
      g_assert_nonnull (line);
      n_sleeping += strstr (line, ": ok sleeping") != NULL;
    }
  start = g_get_monotonic_time ();
  g_subprocess_send_signal (process, SIGINT);
  g_assert_true (g_subprocess_communicate_utf8 (process, NULL, NULL, NULL, &err, &error));
  g_assert_no_error (error);
  g_test_message ("stderr: %s", err);
  g_assert_true (g_subprocess_get_if_exited (process));
  g_assert_cmpint (g_subprocess_get_exit_status (process), ==, 128 + 2);
  /* far within the grace period: the ranks died of the SIGINT */
  g_assert_cmpint (g_get_monotonic_time () - start, <, 10 * G_USEC_PER_SEC);
  g_assert_null (strstr (err, "gmlp-launch: rank"));
}

static void
test_usage (void)
{
  Run run;

  if (cpu_only ())
    return;
  /* no program */
  if (!launch (&run, NULL, "-n", "2", NULL))
    return;
  g_assert_cmpint (exit_code (&run), ==, 2);
  run_clear (&run);
  /* no -n */
  launch (&run, NULL, "true", NULL);
  g_assert_cmpint (exit_code (&run), ==, 2);
  run_clear (&run);
  /* an unknown kind of device */
  launch (&run, NULL, "-n", "2", "--devices", "tpu", "true", NULL);
  g_assert_cmpint (exit_code (&run), ==, 1);
  g_assert_nonnull (strstr (run.err, "tpu"));
  run_clear (&run);
  /* a program that is not there */
  launch (&run, NULL, "-n", "2", "--devices", "cpu", "/nonexistent/program", NULL);
  g_assert_cmpint (exit_code (&run), ==, 127);
  g_assert_nonnull (strstr (run.err, "rank 0"));
  run_clear (&run);
  /* PROGRAM's own options are its own */
  launch (&run, NULL, "-n", "2", "--devices", "cpu", "sh", "-c", "echo $GMLP_RANK/$GMLP_WORLD_SIZE $GMLP_DEVICE", NULL);
  g_assert_cmpint (exit_code (&run), ==, 0);
  g_assert_cmpuint (count_lines (run.out, "0/2 cpu:0"), ==, 1);
  g_assert_cmpuint (count_lines (run.out, "1/2 cpu:1"), ==, 1);
  run_clear (&run);
}

/* Outside a launcher: INVALID_STATE naming the variable, one at a time. */
static void
expect_state_error (const char *name)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpCommunicator) comm = gmlp_communicator_new_from_launcher (&error);

  g_assert_null (comm);
  g_assert_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE);
  if (strstr (error->message, name) == NULL)
    g_error ("\"%s\" does not name %s", error->message, name);
}

static void
test_no_launcher (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpDevice) device = gmlp_device_new_from_string ("cpu", &error);
  g_autoptr(GBytes) uid = NULL;
  g_autoptr(GmlpCommunicator) comm = NULL;
  GString *hex = g_string_new (NULL);
  const guint8 *id;
  gsize size;
  char saved;

  if (cpu_only ())
    return;
  g_assert_no_error (error);
  g_unsetenv ("GMLP_WORLD_SIZE");
  g_unsetenv ("GMLP_RANK");
  g_unsetenv ("GMLP_UNIQUE_ID");
  g_unsetenv ("GMLP_TIMEOUT_MS");
  expect_state_error ("GMLP_WORLD_SIZE");
  g_setenv ("GMLP_WORLD_SIZE", "one", TRUE);
  expect_state_error ("GMLP_WORLD_SIZE");
  g_setenv ("GMLP_WORLD_SIZE", "1", TRUE);
  expect_state_error ("GMLP_RANK");
  g_setenv ("GMLP_RANK", "1", TRUE);   /* past the world */
  expect_state_error ("GMLP_RANK");
  g_setenv ("GMLP_RANK", "0", TRUE);
  expect_state_error ("GMLP_UNIQUE_ID");
  g_setenv ("GMLP_UNIQUE_ID", "abc", TRUE);
  expect_state_error ("GMLP_UNIQUE_ID");

  uid = gmlp_communicator_new_unique_id (device, &error);
  g_assert_no_error (error);
  id = g_bytes_get_data (uid, &size);
  for (gsize i = 0; i < size; i++)
    g_string_append_printf (hex, "%02x", id[i]);
  saved = hex->str[5];
  hex->str[5] = 'g';
  g_setenv ("GMLP_UNIQUE_ID", hex->str, TRUE);
  expect_state_error ("GMLP_UNIQUE_ID");
  hex->str[5] = saved;
  g_setenv ("GMLP_UNIQUE_ID", hex->str, TRUE);
  g_setenv ("GMLP_DEVICE", "cpu:5", TRUE);
  g_setenv ("GMLP_TIMEOUT_MS", "0", TRUE);
  expect_state_error ("GMLP_TIMEOUT_MS");
  g_setenv ("GMLP_TIMEOUT_MS", "1000", TRUE);

  /* All there: a group of one. */
  comm = gmlp_communicator_new_from_launcher (&error);
  g_assert_no_error (error);
  g_assert_cmpint (gmlp_communicator_get_world_size (comm), ==, 1);
  g_assert_cmpuint (gmlp_communicator_get_timeout_ms (comm), ==, 1000);
  g_assert_cmpint (gmlp_device_get_ordinal (gmlp_communicator_get_device (comm)), ==, 5);
  g_clear_object (&comm);

  g_unsetenv ("GMLP_DEVICE");
  expect_state_error ("GMLP_DEVICE");
  g_string_free (hex, TRUE);
  for (guint i = 0; i < 4; i++)
    g_unsetenv ((const char *[]) { "GMLP_WORLD_SIZE", "GMLP_RANK", "GMLP_UNIQUE_ID", "GMLP_TIMEOUT_MS" }[i]);
}

int
main (int    argc,
      char **argv)
{
  setlocale (LC_ALL, "");
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Gmlp/Launch/no-launcher", test_no_launcher);
  g_test_add_func ("/Gmlp/Launch/usage", test_usage);
  g_test_add_func ("/Gmlp/Launch/collectives", test_collectives);
  g_test_add_func ("/Gmlp/Launch/faults", test_faults);
  g_test_add_func ("/Gmlp/Launch/timeout", test_timeout);
  g_test_add_func ("/Gmlp/Launch/rank-fails", test_rank_fails);
  g_test_add_func ("/Gmlp/Launch/rank-leaves", test_rank_leaves);
  g_test_add_func ("/Gmlp/Launch/rank-dies", test_rank_dies);
  g_test_add_func ("/Gmlp/Launch/rank-quits", test_rank_quits);
  g_test_add_func ("/Gmlp/Launch/interrupt", test_interrupt);

  return g_test_run ();
}
