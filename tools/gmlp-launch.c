/* gmlp-launch: start the N ranks of a group, one process each
 *
 *   gmlp-launch -n N [--devices auto|cuda|cpu] [--timeout-ms T] [--grace-ms G]
 *               [--tag] PROGRAM [ARGS...]
 *
 * Makes the group's unique id (gmlp_communicator_new_unique_id() on rank
 * 0's device; on a GPU NCCL's, whose meeting point then lives in this
 * process, which stays until the ranks are done) and starts PROGRAM N times
 * with, for rank R, these variables (what
 * gmlp_communicator_new_from_launcher() reads):
 *
 *   GMLP_RANK=R  GMLP_WORLD_SIZE=N  GMLP_UNIQUE_ID=<the id in hex>
 *   GMLP_DEVICE=cuda:R or cpu:R      (also gmlp_device_get_default()'s)
 *   GMLP_TIMEOUT_MS=T                (with --timeout-ms)
 *
 * Each rank runs in a process group of its own with stdin from /dev/null;
 * its output goes where the launcher's goes, each line prefixed by "[R] "
 * with --tag. The launcher waits for all; when one exits with a non-zero
 * status or dies by a signal, it names that rank and its status, sends the
 * others SIGTERM, and SIGKILL after the grace period. SIGINT, SIGTERM and
 * SIGHUP are forwarded to the ranks (a second SIGINT kills them). The exit
 * status is 0 when every rank exited with 0; else the first failing rank's
 * status (128 + the signal for one killed by a signal). On the CPU, the
 * group's shared memory is gone once the ranks are, also when they all
 * died before the group was complete.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <gio/gio.h>
#include <glib-unix.h>
#include <gmlp.h>

static int n_ranks = 0;
static char *devices_opt = NULL;
static int timeout_ms = 0;
static int grace_ms = 5000;
static gboolean tag = FALSE;

static const GOptionEntry entries[] = {
  { "nproc", 'n', 0, G_OPTION_ARG_INT, &n_ranks, "Number of ranks (processes) to start", "N" },
  { "devices", 'd', 0, G_OPTION_ARG_STRING, &devices_opt,
    "The ranks' devices: cuda (rank R on cuda:R), cpu (cpu:R) or auto (cuda where a GPU is usable, "
    "the default)", "KIND" },
  { "timeout-ms", 't', 0, G_OPTION_ARG_INT, &timeout_ms,
    "The communicators' timeout (GMLP_TIMEOUT_MS; default: the library's, ten minutes)", "T" },
  { "grace-ms", 0, 0, G_OPTION_ARG_INT, &grace_ms,
    "After a rank fails, how long the others have between SIGTERM and SIGKILL (default 5000)", "G" },
  { "tag", 0, 0, G_OPTION_ARG_NONE, &tag, "Prefix each line of a rank's output with \"[RANK] \"", NULL },
  { NULL }
};

typedef struct {
  int            rank;
  GSubprocess   *process;
  char          *pid;     /* its process id, which GSubprocess forgets at its exit */
  gboolean       done;
} Rank;

typedef struct {
  GMainLoop     *loop;
  Rank          *ranks;
  int            n_running;
  int            n_streams;     /* --tag: output streams not yet at their end */
  int            failed_rank;   /* the first rank that failed, or -1 */
  int            exit_status;
  gboolean       stopping;      /* the ranks were told to stop */
  int            n_interrupts;
  guint          grace_id;
  guint          drain_id;
} Launch;

#define DRAIN_MS 2000

/* Signals the ranks still running, each with its process group (what it
 * started itself too, as a Ctrl-C at a terminal would). */
static void
signal_ranks (Launch *launch,
              int     signum)
{
  for (int r = 0; r < n_ranks; r++)
    {
      Rank *rank = &launch->ranks[r];
      pid_t pid;

      if (rank->process == NULL || rank->done)
        continue;
      /* 0 for a rank that had exited when it started: kill (0, …) would
       * signal the launcher's own group. */
      pid = (pid_t) g_ascii_strtoll (rank->pid, NULL, 10);
      if (pid <= 0 || kill (-pid, signum) != 0)
        g_subprocess_send_signal (rank->process, signum);
    }
}

static gboolean
on_grace_over (gpointer data)
{
  Launch *launch = data;

  launch->grace_id = 0;
  signal_ranks (launch, SIGKILL);
  return G_SOURCE_REMOVE;
}

/* Tells the ranks still running to stop: signum now, SIGKILL after the
 * grace period. */
static void
stop_ranks (Launch *launch,
            int     signum)
{
  signal_ranks (launch, signum);
  if (!launch->stopping)
    {
      launch->stopping = TRUE;
      launch->grace_id = g_timeout_add (MAX (grace_ms, 0), on_grace_over, launch);
    }
}

static gboolean
on_drain_over (gpointer data)
{
  Launch *launch = data;

  launch->drain_id = 0;
  g_main_loop_quit (launch->loop);
  return G_SOURCE_REMOVE;
}

/* Quits once every rank has exited and its output is read; a process a
 * rank left behind that holds its output open is not waited for more than
 * DRAIN_MS. */
static void
maybe_quit (Launch *launch)
{
  if (launch->n_running == 0 && launch->n_streams == 0)
    g_main_loop_quit (launch->loop);
  else if (launch->n_running == 0 && launch->drain_id == 0)
    launch->drain_id = g_timeout_add (DRAIN_MS, on_drain_over, launch);
}

static void
on_rank_exited (GObject      *source,
                GAsyncResult *result,
                gpointer      data)
{
  Rank *rank = data;
  Launch *launch = g_object_get_data (source, "gmlp-launch");
  GSubprocess *process = G_SUBPROCESS (source);
  g_autoptr(GError) error = NULL;

  g_subprocess_wait_finish (process, result, &error);
  rank->done = TRUE;
  launch->n_running--;

  if (!g_subprocess_get_successful (process) && launch->failed_rank < 0 && !launch->stopping)
    {
      launch->failed_rank = rank->rank;
      if (g_subprocess_get_if_signaled (process))
        {
          int sig = g_subprocess_get_term_sig (process);

          g_printerr ("gmlp-launch: rank %d (process %s) was killed by signal %d (%s); "
                      "stopping the others\n", rank->rank, rank->pid, sig, g_strsignal (sig));
          launch->exit_status = 128 + sig;
        }
      else
        {
          int status = g_subprocess_get_exit_status (process);

          g_printerr ("gmlp-launch: rank %d (process %s) exited with status %d; "
                      "stopping the others\n", rank->rank, rank->pid, status);
          launch->exit_status = status;
        }
      stop_ranks (launch, SIGTERM);
    }
  maybe_quit (launch);
}

/* --tag: each line of a rank's stream, prefixed. */
typedef struct {
  Launch            *launch;
  int                rank;
  FILE              *out;
  GDataInputStream  *in;
} Stream;

static void
on_line (GObject      *source,
         GAsyncResult *result,
         gpointer      data)
{
  Stream *stream = data;
  g_autoptr(GError) error = NULL;
  gsize len;
  g_autofree char *line = g_data_input_stream_read_line_finish (stream->in, result, &len, &error);

  if (line == NULL)
    {
      Launch *launch = stream->launch;

      if (error != NULL)
        g_printerr ("gmlp-launch: reading rank %d's output: %s\n", stream->rank, error->message);
      g_object_unref (stream->in);
      g_free (stream);
      launch->n_streams--;
      maybe_quit (launch);
      return;
    }
  fprintf (stream->out, "[%d] ", stream->rank);
  fwrite (line, 1, len, stream->out);
  fputc ('\n', stream->out);
  fflush (stream->out);
  g_data_input_stream_read_line_async (stream->in, G_PRIORITY_DEFAULT, NULL, on_line, stream);
}

static void
read_tagged (Launch        *launch,
             int            rank,
             GInputStream  *pipe,
             FILE          *out)
{
  Stream *stream = g_new0 (Stream, 1);

  stream->launch = launch;
  stream->rank = rank;
  stream->out = out;
  stream->in = g_data_input_stream_new (pipe);
  g_data_input_stream_set_newline_type (stream->in, G_DATA_STREAM_NEWLINE_TYPE_LF);
  launch->n_streams++;
  g_data_input_stream_read_line_async (stream->in, G_PRIORITY_DEFAULT, NULL, on_line, stream);
}

/* SIGINT, SIGTERM, SIGHUP: forwarded (SIGHUP as SIGTERM); a second
 * SIGINT (Ctrl-C) does not wait. */
typedef struct {
  Launch *launch;
  int     signum;
} Forward;

static gboolean
on_signal (gpointer data)
{
  Forward *forward = data;
  Launch *launch = forward->launch;

  if (forward->signum == SIGINT && ++launch->n_interrupts > 1)
    signal_ranks (launch, SIGKILL);
  else
    stop_ranks (launch, forward->signum == SIGINT ? SIGINT : SIGTERM);
  if (launch->failed_rank < 0)
    launch->exit_status = 128 + forward->signum;
  return G_SOURCE_CONTINUE;
}

/* Each rank its own process group: a Ctrl-C at the terminal reaches the
 * launcher alone, which forwards it once. A rank outlives no launcher. */
static void
child_setup (gpointer data)
{
  setpgid (0, 0);
  prctl (PR_SET_PDEATHSIG, SIGKILL);
}

/* The CPU communicator's shared memory is named by the group's id: "/gmlp-"
 * and the first 16 bytes of the backend's id in hex, which follows the 16
 * bytes that name the backend (libgmlp/backend/cpu/gmlp-cpu-comm.c). The
 * ranks unlink the name once all of them have joined; when none got that
 * far (every rank died or exited while the group was joining), the
 * launcher does, once they are gone. */
static void
unlink_cpu_group (const char *hex)
{
  g_autofree char *name = NULL;

  if (strlen (hex) < 64)
    return;
  name = g_strdup_printf ("/gmlp-%.32s", hex + 32);
  (void) shm_unlink (name);   /* ENOENT: the ranks did */
}

/* The kind of device the ranks use, and rank 0's device. */
static GmlpDevice *
pick_device (const char  **kind,
             GError      **error)
{
  const char *want = devices_opt != NULL ? devices_opt : "auto";
  int n_gpus = gmlp_device_get_count (GMLP_DEVICE_KIND_CUDA);
  g_autofree char *spec = NULL;

  if (g_str_equal (want, "auto"))
    want = n_gpus > 0 ? "cuda" : "cpu";
  if (g_str_equal (want, "cuda"))
    {
      if (n_gpus < n_ranks)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_NO_DEVICE,
                       "%d ranks on GPUs need %d GPUs; %d usable here (--devices cpu runs them "
                       "on the CPU)", n_ranks, n_ranks, n_gpus);
          return NULL;
        }
    }
  else if (!g_str_equal (want, "cpu"))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "--devices takes cuda, cpu or auto, not \"%s\"", want);
      return NULL;
    }
  *kind = want;
  spec = g_strdup_printf ("%s:0", want);
  return gmlp_device_new_from_string (spec, error);
}

int
main (int   argc,
      char *argv[])
{
  g_autoptr(GOptionContext) context = g_option_context_new ("PROGRAM [ARGS...] - run PROGRAM as N ranks of a group");
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpDevice) device = NULL;
  g_autoptr(GBytes) uid = NULL;
  g_autoptr(GSubprocessLauncher) launcher = NULL;
  g_autofree char *hex = NULL;
  g_autofree char *world = NULL;
  const char *kind = NULL;
  Launch launch = { .failed_rank = -1 };
  Forward forwards[] = { { NULL, SIGINT }, { NULL, SIGTERM }, { NULL, SIGHUP } };
  const guint8 *id;
  gsize id_size;
  int r;

  setlocale (LC_ALL, "");
  g_option_context_add_main_entries (context, entries, NULL);
  /* Options after PROGRAM are PROGRAM's. */
  g_option_context_set_strict_posix (context, TRUE);
  g_option_context_set_description (context,
    "Each rank gets GMLP_RANK, GMLP_WORLD_SIZE, GMLP_UNIQUE_ID, GMLP_DEVICE (cuda:R or cpu:R)\n"
    "and, with --timeout-ms, GMLP_TIMEOUT_MS: gmlp_communicator_new_from_launcher() joins with them.");
  if (!g_option_context_parse (context, &argc, &argv, &error))
    {
      g_printerr ("gmlp-launch: %s\n", error->message);
      return 2;
    }
  if (argc > 1 && g_str_equal (argv[1], "--"))
    {
      argv++;
      argc--;
    }
  if (argc < 2 || n_ranks < 1 || timeout_ms < 0)
    {
      g_autofree char *help = g_option_context_get_help (context, TRUE, NULL);

      g_printerr ("gmlp-launch: %s\n%s", argc < 2 ? "no PROGRAM given" : "-n takes a number of ranks, at least 1",
                  help);
      return 2;
    }

  device = pick_device (&kind, &error);
  if (device != NULL)
    uid = gmlp_communicator_new_unique_id (device, &error);
  if (uid == NULL)
    {
      g_printerr ("gmlp-launch: %s\n", error->message);
      return 1;
    }
  id = g_bytes_get_data (uid, &id_size);
  {
    GString *s = g_string_sized_new (2 * id_size);

    for (gsize i = 0; i < id_size; i++)
      g_string_append_printf (s, "%02x", id[i]);
    hex = g_string_free (s, FALSE);
  }
  world = g_strdup_printf ("%d", n_ranks);

  launch.loop = g_main_loop_new (NULL, FALSE);
  launch.ranks = g_new0 (Rank, n_ranks);
  for (guint i = 0; i < G_N_ELEMENTS (forwards); i++)
    {
      forwards[i].launch = &launch;
      g_unix_signal_add (forwards[i].signum, on_signal, &forwards[i]);
    }

  launcher = g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDIN_INHERIT);
  g_subprocess_launcher_set_flags (launcher, tag ? G_SUBPROCESS_FLAGS_STDOUT_PIPE |
                                                   G_SUBPROCESS_FLAGS_STDERR_PIPE : 0);
  g_subprocess_launcher_set_stdin_file_path (launcher, "/dev/null");
  g_subprocess_launcher_set_child_setup (launcher, child_setup, NULL, NULL);
  g_subprocess_launcher_setenv (launcher, "GMLP_WORLD_SIZE", world, TRUE);
  g_subprocess_launcher_setenv (launcher, "GMLP_UNIQUE_ID", hex, TRUE);
  if (timeout_ms > 0)
    {
      g_autofree char *t = g_strdup_printf ("%d", timeout_ms);

      g_subprocess_launcher_setenv (launcher, "GMLP_TIMEOUT_MS", t, TRUE);
    }
  else
    g_subprocess_launcher_unsetenv (launcher, "GMLP_TIMEOUT_MS");

  for (r = 0; r < n_ranks; r++)
    {
      g_autofree char *rank = g_strdup_printf ("%d", r);
      g_autofree char *dev = g_strdup_printf ("%s:%d", kind, r);
      Rank *rk = &launch.ranks[r];
      const char *identifier;

      g_subprocess_launcher_setenv (launcher, "GMLP_RANK", rank, TRUE);
      g_subprocess_launcher_setenv (launcher, "GMLP_DEVICE", dev, TRUE);
      rk->rank = r;
      rk->process = g_subprocess_launcher_spawnv (launcher, (const char * const *) argv + 1, &error);
      if (rk->process == NULL)
        {
          g_printerr ("gmlp-launch: cannot start rank %d: %s\n", r, error->message);
          launch.failed_rank = r;
          launch.exit_status = 127;
          stop_ranks (&launch, SIGTERM);
          break;
        }
      /* No identifier: the rank has already exited (and been reaped). */
      identifier = g_subprocess_get_identifier (rk->process);
      rk->pid = g_strdup (identifier != NULL ? identifier : "gone");
      /* as child_setup() does: whichever comes first */
      if (identifier != NULL)
        setpgid ((pid_t) g_ascii_strtoll (identifier, NULL, 10), 0);
      launch.n_running++;
      g_object_set_data (G_OBJECT (rk->process), "gmlp-launch", &launch);
      g_subprocess_wait_async (rk->process, NULL, on_rank_exited, rk);
      if (tag)
        {
          read_tagged (&launch, r, g_subprocess_get_stdout_pipe (rk->process), stdout);
          read_tagged (&launch, r, g_subprocess_get_stderr_pipe (rk->process), stderr);
        }
    }

  if (launch.n_running > 0 || launch.n_streams > 0)
    g_main_loop_run (launch.loop);
  /* Every rank has exited, whatever happened. */
  if (g_str_equal (kind, "cpu"))
    unlink_cpu_group (hex);

  if (launch.grace_id != 0)
    g_source_remove (launch.grace_id);
  if (launch.drain_id != 0)
    g_source_remove (launch.drain_id);
  for (r = 0; r < n_ranks; r++)
    {
      g_clear_object (&launch.ranks[r].process);
      g_free (launch.ranks[r].pid);
    }
  g_free (launch.ranks);
  g_main_loop_unref (launch.loop);
  g_free (devices_opt);
  return launch.exit_status;
}
