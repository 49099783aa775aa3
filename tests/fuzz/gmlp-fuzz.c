/* gmlp-fuzz.c: the fuzz suite of libgmlp (issue 40)
 *
 * Calls every function, constructor and method of the Gmlp namespace, found
 * through GObject-Introspection and invoked with g_function_info_invoke() as a
 * binding would, with hostile arguments: sizes near the 32- and 64-bit
 * limits, zero and huge group counts, short and long buffers, invalid enums,
 * mismatched dtypes, devices, recipes and group counts, unfinished objects
 * (g_object_new() with no properties, or with its construct properties and no
 * g_initable_init()), objects whose init failed, and NULL. Hand-written
 * scenarios add what one call can't: saved activations reused or of another
 * layer, unbalanced offload pops, a second init, inputs changed between
 * forward and backward, ...
 *
 * Each case runs in its own process (the parent never opens a device, so
 * CUDA is initialised in the child only), under a timeout and, on the CPU, a
 * memory limit. A case passes when every call either returned with a GError
 * of the GMLP_ERROR domain (or GIO's), returned normally, or logged a
 * g_return_if_fail() critical because the case passed NULL for an argument
 * that is not nullable. It fails on a signal, a timeout, any other critical
 * or warning, a NULL or FALSE without a GError from a function that takes
 * one, a GError with a success, a device fault found by the final
 * synchronize, or (scenarios) a success where the documentation or issue 40
 * asks for an error.
 *
 * Usage (TAP on stdout; cases are numbered and generated from the seed):
 *
 *   gmlp-fuzz                   every case
 *   gmlp-fuzz --shard 2/4       every fourth case, starting at the second
 *   gmlp-fuzz --list            the cases, one a line, without running them
 *   gmlp-fuzz --case 123        case 123 in this process (for gdb, valgrind)
 *   gmlp-fuzz --seed 7 --cases 5000   other random calls, more of them
 *   gmlp-fuzz --match forward   only the cases whose description contains it
 *
 * Other options: --timeout S (per case, default 20), --mem-limit MiB (address
 * space of a case on the CPU, default 4096; 0: none; never with CUDA, which
 * reserves more than that).
 *
 * Environment: GMLP_TEST_DEVICE=cpu (default) or cuda, as the other suites;
 * GI_TYPELIB_PATH and LD_LIBRARY_PATH must reach the Gmlp typelib and
 * libgmlp-1.0.so (meson test sets both to the build tree). No Python is
 * involved: on a GPU host with only GLib, libgirepository-1.0 and the
 * library, run for example
 *
 *   GI_TYPELIB_PATH=build/libgmlp LD_LIBRARY_PATH=build/libgmlp \
 *   GMLP_BACKEND_DIR=build/libgmlp/backend/cuda GMLP_TEST_DEVICE=cuda \
 *   build/tests/fuzz/gmlp-fuzz
 *
 * On a machine where the device is not usable the run is one skip. The run
 * exits 0 whatever the verdicts (count the "not ok" lines); --case exits 1
 * when its case fails.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <errno.h>
#include <locale.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gmlp-fuzz.h"

#define DEFAULT_SEED 40

static FzCtx *current_ctx;
static guint timeout_s = 20;
static guint64 mem_limit_mib = 4096;

/* Judgement */

static void
set_category (FzCtx      *ctx,
              const char *category)
{
  if (ctx->category == NULL)
    ctx->category = g_strdup (category);
}

/* Appends a formatted text to s, after a "; " if s has some already. */
static void
append_va (GString    *s,
           const char *format,
           va_list     args)
{
  if (s->len > 0)
    g_string_append (s, "; ");
  g_string_append_vprintf (s, format, args);
}

void
fz_fail (FzCtx      *ctx,
         const char *category,
         const char *format,
         ...)
{
  va_list args;

  va_start (args, format);
  append_va (ctx->failure, format, args);
  va_end (args);
  if (ctx->verdict != FZ_FAIL)
    {
      g_clear_pointer (&ctx->category, g_free);
      ctx->verdict = FZ_FAIL;
    }
  set_category (ctx, category);
}

void
fz_skip (FzCtx      *ctx,
         const char *format,
         ...)
{
  va_list args;

  if (ctx->verdict != FZ_PASS)
    return;
  ctx->verdict = FZ_SKIP;
  va_start (args, format);
  append_va (ctx->failure, format, args);
  va_end (args);
}

void
fz_note (FzCtx      *ctx,
         const char *format,
         ...)
{
  va_list args;

  va_start (args, format);
  append_va (ctx->outcome, format, args);
  va_end (args);
}

const char *
fz_error_name (const GError *error)
{
  static char buf[128];

  if (error->domain == GMLP_ERROR)
    {
      g_autoptr(GEnumClass) klass = g_type_class_ref (GMLP_TYPE_ERROR);
      GEnumValue *v = g_enum_get_value (klass, error->code);

      if (v != NULL)
        return v->value_name;
    }
  g_snprintf (buf, sizeof buf, "%s:%d", g_quark_to_string (error->domain), error->code);
  return buf;
}

void
fz_call_begin (FzCtx    *ctx,
               gboolean  null_passed)
{
  ctx->in_call = TRUE;
  ctx->null_passed = null_passed;
  ctx->accepted_criticals = 0;
}

gboolean
fz_call_end (FzCtx      *ctx,
             const char *what)
{
  gboolean accepted = ctx->accepted_criticals > 0;

  ctx->in_call = FALSE;
  ctx->null_passed = FALSE;
  if (accepted)
    fz_note (ctx, "%s: critical on NULL", what);
  return accepted;
}

void
fz_check_result (FzCtx        *ctx,
                 const char   *what,
                 gboolean      success,
                 const GError *error)
{
  if (error != NULL && success)
    {
      fz_fail (ctx, "GError with success", "%s returned success with a GError set (%s: %s)",
               what, fz_error_name (error), error->message);
      return;
    }
  if (error == NULL && !success)
    {
      fz_fail (ctx, "NULL/FALSE without GError", "%s returned NULL/FALSE without a GError", what);
      return;
    }
  if (error == NULL)
    {
      fz_note (ctx, "%s: ok", what);
      return;
    }

  if (error->domain == GMLP_ERROR)
    {
      g_autoptr(GEnumClass) klass = g_type_class_ref (GMLP_TYPE_ERROR);

      if (g_enum_get_value (klass, error->code) == NULL)
        fz_fail (ctx, "bad GError", "%s: GMLP_ERROR code %d is not a GmlpError", what, error->code);
    }
  else if (error->domain != G_IO_ERROR)
    fz_fail (ctx, "bad GError", "%s: GError of the undocumented domain %s (%d): %s", what,
             g_quark_to_string (error->domain), error->code, error->message);

  if (error->message == NULL || error->message[0] == '\0' ||
      !g_utf8_validate (error->message, -1, NULL))
    fz_fail (ctx, "bad GError", "%s: GError without a valid UTF-8 message", what);
  else
    fz_note (ctx, "%s: %s", what, fz_error_name (error));
}

gboolean
fz_ok_ptr (FzCtx      *ctx,
           const char *what,
           gpointer    result,
           GError     *error)
{
  fz_check_result (ctx, what, result != NULL, error);
  return result != NULL && error == NULL;
}

gboolean
fz_ok_bool (FzCtx      *ctx,
            const char *what,
            gboolean    result,
            GError     *error)
{
  fz_check_result (ctx, what, result, error);
  return result && error == NULL;
}

void
fz_expect_error (FzCtx        *ctx,
                 const char   *what,
                 gboolean      success,
                 const GError *error,
                 int           code,
                 const char   *why)
{
  fz_check_result (ctx, what, success, error);
  if (error == NULL && success)
    fz_fail (ctx, "success where an error is due", "%s succeeded; %s", what, why);
  else if (error != NULL && code >= 0 && !g_error_matches (error, GMLP_ERROR, code))
    {
      g_autoptr(GEnumClass) klass = g_type_class_ref (GMLP_TYPE_ERROR);
      GEnumValue *v = g_enum_get_value (klass, code);

      fz_fail (ctx, "other GError than documented", "%s: %s, documented: %s (%s)", what,
               fz_error_name (error), v != NULL ? v->value_name : "?", why);
    }
}

/* Logging: every warning and critical of a case is judged. */

static const char *
field_string (const GLogField *fields,
              gsize            n_fields,
              const char      *key)
{
  gsize i;

  for (i = 0; i < n_fields; i++)
    if (g_strcmp0 (fields[i].key, key) == 0)
      return fields[i].length < 0 ? fields[i].value : NULL;
  return NULL;
}

static GLogWriterOutput
fuzz_log_writer (GLogLevelFlags   level,
                 const GLogField *fields,
                 gsize            n_fields,
                 gpointer         user_data)
{
  FzCtx *ctx = current_ctx;
  const char *message = field_string (fields, n_fields, "MESSAGE");
  const char *domain = field_string (fields, n_fields, "GLIB_DOMAIN");
  gboolean critical = (level & G_LOG_LEVEL_CRITICAL) != 0;
  gboolean warning = (level & G_LOG_LEVEL_WARNING) != 0;

  if ((level & (G_LOG_LEVEL_ERROR | G_LOG_LEVEL_CRITICAL | G_LOG_LEVEL_WARNING)) == 0)
    {
      if (g_getenv ("G_MESSAGES_DEBUG") != NULL)
        return g_log_writer_standard_streams (level, fields, n_fields, user_data);
      return G_LOG_WRITER_HANDLED;
    }

  g_log_writer_standard_streams (level, fields, n_fields, user_data);
  if (ctx == NULL || message == NULL || (level & G_LOG_LEVEL_ERROR) != 0)
    return G_LOG_WRITER_HANDLED;

  if (critical && ctx->in_call && ctx->null_passed && strstr (message, "assertion") != NULL)
    ctx->accepted_criticals++;
  else if (critical || warning)
    fz_fail (ctx, critical ? "critical" : "warning", "%s%s%s %s%s",
             domain != NULL ? domain : "", domain != NULL ? "-" : "",
             critical ? "CRITICAL" : "WARNING", message,
             ctx->in_call ? "" : " (outside the call under test: building or freeing)");
  return G_LOG_WRITER_HANDLED;
}

/* Running a case */

static void
ctx_init (FzCtx *ctx)
{
  memset (ctx, 0, sizeof *ctx);
  ctx->built = g_hash_table_new (g_str_hash, g_str_equal);
  ctx->order = g_ptr_array_new ();
  ctx->outcome = g_string_new (NULL);
  ctx->failure = g_string_new (NULL);
  ctx->verdict = FZ_PASS;
}

static void
ctx_clear (FzCtx *ctx)
{
  g_hash_table_unref (ctx->built);
  g_ptr_array_unref (ctx->order);
  g_string_free (ctx->outcome, TRUE);
  g_string_free (ctx->failure, TRUE);
  g_free (ctx->category);
}

static const char *
device_spec (void)
{
  const char *spec = g_getenv ("GMLP_TEST_DEVICE");

  return spec != NULL && spec[0] != '\0' ? spec : "cpu";
}

/* Runs the case in this process, into ctx. */
static void
run_case (const FzCase *c,
          FzCtx        *ctx)
{
  g_autoptr(GError) error = NULL;

  current_ctx = ctx;
  ctx->device = gmlp_device_new_from_string (device_spec (), &error);
  if (ctx->device == NULL)
    {
      fz_skip (ctx, "device %s not usable: %s", device_spec (), error->message);
      current_ctx = NULL;
      return;
    }
  ctx->cuda = gmlp_device_get_kind (ctx->device) == GMLP_DEVICE_KIND_CUDA;

  switch (c->kind)
    {
    case FZ_CASE_SCENARIO:
      ctx->in_call = TRUE;
      c->scenario->run (ctx);
      ctx->in_call = FALSE;
      break;
    case FZ_CASE_PROPERTIES:
      fz_properties_run (ctx, c);
      break;
    case FZ_CASE_CONSTRUCT:
      fz_construct_run (ctx, c);
      break;
    case FZ_CASE_CALL:
      fz_call_run (ctx, c);
      break;
    default:
      g_assert_not_reached ();
    }

  /* Everything the case made is freed while logs are still judged, then the
   * device must have no fault pending (an out-of-bounds kernel shows here). */
  fz_ctx_clear_built (ctx);
  /* A case may leave a capture open (begin_capture alone): that is its
   * documented result, and synchronizing needs it ended. */
  if (gmlp_device_is_capturing (ctx->device))
    {
      g_autoptr(GmlpGraph) graph = gmlp_device_end_capture (ctx->device, NULL);
    }
  if (!gmlp_device_synchronize (ctx->device, &error))
    fz_fail (ctx, "device fault", "the device failed after the case: %s", error->message);
  g_clear_object (&ctx->device);
  current_ctx = NULL;
}

/* Under LeakSanitizer (the ASan build of scripts/run-sanitizers.sh) a case
 * that leaked fails: the child leaves by _exit(), past LSan's own check at
 * exit. Elsewhere the symbol is absent and nothing is checked. */
int __lsan_do_recoverable_leak_check (void) __attribute__ ((weak));

static void
check_leaks (FzCtx *ctx)
{
  if (__lsan_do_recoverable_leak_check != NULL && __lsan_do_recoverable_leak_check () != 0)
    fz_fail (ctx, "leak", "LeakSanitizer found memory the case lost (its report is on stderr)");
}

/* One line of text for TAP: no newline, no '#' (which starts a directive). */
static char *
tap_text (const char *s,
          gsize       max)
{
  GString *out = g_string_new (NULL);
  const char *p;

  for (p = s; *p != '\0' && out->len < max; p++)
    {
      if (*p == '\n' || *p == '\t' || *p == '\r')
        g_string_append_c (out, ' ');
      else if (*p == '#')
        g_string_append (out, "No.");
      else
        g_string_append_c (out, *p);
    }
  if (*p != '\0')
    g_string_append (out, "...");
  return g_string_free (out, FALSE);
}

typedef struct {
  double     seconds;
  FzVerdict  verdict;
  char      *category;
  char      *outcome;
  char      *failure;
  char      *log_tail;
} FzResult;

static void
result_clear (FzResult *r)
{
  g_free (r->category);
  g_free (r->outcome);
  g_free (r->failure);
  g_free (r->log_tail);
}

static void
child_main (const FzCase *c,
            int           fd)
{
  FzCtx ctx;
  g_autofree char *record = NULL;
  g_autofree char *category = NULL, *outcome = NULL, *failure = NULL;
  gsize len, done = 0;

  alarm (timeout_s);
  if (mem_limit_mib > 0 && g_strcmp0 (device_spec (), "cpu") == 0)
    {
      struct rlimit limit = { mem_limit_mib << 20, mem_limit_mib << 20 };

      setrlimit (RLIMIT_AS, &limit);
    }

  ctx_init (&ctx);
  run_case (c, &ctx);
  check_leaks (&ctx);

  category = tap_text (ctx.category != NULL ? ctx.category : "", 200);
  outcome = tap_text (ctx.outcome->str, 400);
  failure = tap_text (ctx.failure->str, 2000);
  record = g_strdup_printf ("%d\t%s\t%s\t%s\n", ctx.verdict, category, outcome, failure);
  len = strlen (record);
  while (done < len)
    {
      ssize_t n = write (fd, record + done, len - done);

      if (n <= 0)
        break;
      done += n;
    }
  _exit (0);
}

static char *
read_tail (int    fd,
           gsize  max_lines)
{
  g_autoptr(GString) all = g_string_new (NULL);
  g_auto(GStrv) lines = NULL;
  char buf[4096];
  ssize_t n;
  guint n_lines, i;
  GString *out = g_string_new (NULL);

  lseek (fd, 0, SEEK_SET);
  while ((n = read (fd, buf, sizeof buf)) > 0)
    g_string_append_len (all, buf, n);
  lines = g_strsplit (all->str, "\n", -1);
  n_lines = g_strv_length (lines);
  for (i = n_lines > max_lines ? n_lines - max_lines : 0; i < n_lines; i++)
    if (lines[i][0] != '\0')
      g_string_append_printf (out, "#   %s\n", lines[i]);
  return g_string_free (out, FALSE);
}

static const char *
signal_name (int sig)
{
  switch (sig)
    {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGKILL: return "SIGKILL";
    default: return "signal";
    }
}

static void
run_forked (const FzCase *c,
            FzResult     *r)
{
  g_autoptr(GString) record = g_string_new (NULL);
  char log_template[] = "/tmp/gmlp-fuzz-XXXXXX";
  int fds[2], log_fd, status = 0;
  gboolean killed = FALSE;
  gint64 deadline, start;
  pid_t pid;

  memset (r, 0, sizeof *r);
  log_fd = mkstemp (log_template);
  if (log_fd < 0 || pipe (fds) != 0)
    g_error ("gmlp-fuzz: %s", g_strerror (errno));
  unlink (log_template);

  fflush (stdout);
  fflush (stderr);
  start = g_get_monotonic_time ();
  pid = fork ();
  if (pid < 0)
    g_error ("gmlp-fuzz: fork: %s", g_strerror (errno));
  if (pid == 0)
    {
      close (fds[0]);
      dup2 (log_fd, STDOUT_FILENO);
      dup2 (log_fd, STDERR_FILENO);
      child_main (c, fds[1]);
    }

  close (fds[1]);
  deadline = g_get_monotonic_time () + (gint64) (timeout_s + 10) * G_USEC_PER_SEC;
  for (;;)
    {
      struct pollfd pfd = { fds[0], POLLIN, 0 };
      char buf[4096];
      ssize_t n;
      int left = (int) ((deadline - g_get_monotonic_time ()) / 1000);

      if (left <= 0)
        {
          /* alarm() should have ended it; a child that blocks SIGALRM
           * does not get to hang the suite. */
          kill (pid, SIGKILL);
          killed = TRUE;
          break;
        }
      if (poll (&pfd, 1, left) <= 0)
        continue;
      n = read (fds[0], buf, sizeof buf);
      if (n <= 0)
        break;
      g_string_append_len (record, buf, n);
    }
  close (fds[0]);
  while (waitpid (pid, &status, 0) < 0 && errno == EINTR)
    ;
  r->seconds = (g_get_monotonic_time () - start) / (double) G_USEC_PER_SEC;

  r->log_tail = read_tail (log_fd, 25);
  close (log_fd);

  if (killed || (WIFSIGNALED (status) && WTERMSIG (status) == SIGALRM))
    {
      r->verdict = FZ_FAIL;
      r->category = g_strdup ("timeout");
      r->failure = g_strdup_printf ("no result after %u s", timeout_s);
    }
  else if (WIFSIGNALED (status))
    {
      r->verdict = FZ_FAIL;
      r->category = g_strdup (signal_name (WTERMSIG (status)));
      r->failure = g_strdup_printf ("killed by signal %d (%s)", WTERMSIG (status),
                                    g_strsignal (WTERMSIG (status)));
    }
  else
    {
      g_auto(GStrv) parts = g_strsplit (record->str, "\t", 4);

      if (g_strv_length (parts) == 4 && WIFEXITED (status) && WEXITSTATUS (status) == 0)
        {
          r->verdict = (FzVerdict) atoi (parts[0]);
          r->category = g_strdup (parts[1]);
          r->outcome = g_strdup (parts[2]);
          r->failure = g_strchomp (g_strdup (parts[3]));
        }
      else
        {
          r->verdict = FZ_FAIL;
          r->category = g_strdup ("exit");
          r->failure = g_strdup_printf ("the case exited with status %d without a result",
                                        WIFEXITED (status) ? WEXITSTATUS (status) : -1);
        }
    }
}

static void
print_tap (guint         number,
           const FzCase *c,
           FzResult     *r)
{
  g_autofree char *desc = tap_text (c->description, 600);

  switch (r->verdict)
    {
    case FZ_PASS:
      printf ("ok %u - [%u] %s → %s\n", number, c->index, desc, r->outcome);
      break;
    case FZ_SKIP:
      printf ("ok %u - [%u] %s # SKIP %s\n", number, c->index, desc, r->failure);
      break;
    case FZ_FAIL:
    default:
      printf ("not ok %u - [%u] %s → %s: %s\n", number, c->index, desc, r->category, r->failure);
      if (r->log_tail != NULL && r->log_tail[0] != '\0')
        printf ("#   replay: gmlp-fuzz --case %u; the case's log:\n%s", c->index, r->log_tail);
      break;
    }
  if (r->seconds > 2.0)
    printf ("#   case %u took %.1f s\n", c->index, r->seconds);
  fflush (stdout);
}

/* Cases */

static GPtrArray *
make_cases (guint64 seed,
            guint   n_random)
{
  GPtrArray *cases = g_ptr_array_new ();
  const FzScenario *scenarios;
  guint n_scenarios, i;

  scenarios = fz_scenarios (&n_scenarios);
  for (i = 0; i < n_scenarios; i++)
    {
      FzCase *c = g_new0 (FzCase, 1);

      c->kind = FZ_CASE_SCENARIO;
      c->scenario = &scenarios[i];
      c->description = g_strdup_printf ("scenario %s", scenarios[i].name);
      g_ptr_array_add (cases, c);
    }
  fz_calls_generate (cases, seed, n_random);
  for (i = 0; i < cases->len; i++)
    ((FzCase *) cases->pdata[i])->index = i;
  return cases;
}

/* Whether the device can be opened, found out in a child. */
static gboolean
device_usable (char **why)
{
  int fds[2], status = 0;
  char buf[1024] = "";
  ssize_t n;
  pid_t pid;

  if (pipe (fds) != 0)
    return FALSE;
  fflush (stdout);
  pid = fork ();
  if (pid == 0)
    {
      g_autoptr(GError) error = NULL;
      g_autoptr(GmlpDevice) device = NULL;

      close (fds[0]);
      alarm (timeout_s * 3);
      device = gmlp_device_new_from_string (device_spec (), &error);
      if (device == NULL)
        {
          if (write (fds[1], error->message, strlen (error->message)) < 0)
            _exit (2);
          _exit (1);
        }
      _exit (0);
    }
  close (fds[1]);
  n = read (fds[0], buf, sizeof buf - 1);
  buf[MAX (n, 0)] = '\0';
  close (fds[0]);
  waitpid (pid, &status, 0);
  if (WIFEXITED (status) && WEXITSTATUS (status) == 0)
    return TRUE;
  *why = g_strdup_printf ("device %s not usable: %s", device_spec (),
                          buf[0] != '\0' ? buf : "the probe crashed");
  return FALSE;
}

int
main (int    argc,
      char **argv)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) options = NULL;
  g_autoptr(GPtrArray) cases = NULL;
  g_autofree char *shard = NULL, *match = NULL;
  gboolean list = FALSE;
  gint64 one_case = -1, n_cases = -1;
  gint64 seed = DEFAULT_SEED;
  int timeout = 20, mem_limit = 4096;
  guint shard_k = 1, shard_n = 1, n_run = 0, n_failed = 0, n_default_random, i, number;
  GIRepository *repo;
  GOptionEntry entries[] = {
    { "list", 0, 0, G_OPTION_ARG_NONE, &list, "List the cases", NULL },
    { "case", 0, 0, G_OPTION_ARG_INT64, &one_case, "Run case N in this process", "N" },
    { "seed", 0, 0, G_OPTION_ARG_INT64, &seed, "Seed of the random calls", "S" },
    { "cases", 0, 0, G_OPTION_ARG_INT64, &n_cases, "Number of cases in all", "N" },
    { "shard", 0, 0, G_OPTION_ARG_STRING, &shard, "Run slice K of N", "K/N" },
    { "match", 0, 0, G_OPTION_ARG_STRING, &match, "Only cases whose description contains it", "TEXT" },
    { "timeout", 0, 0, G_OPTION_ARG_INT, &timeout, "Seconds per case", "S" },
    { "mem-limit", 0, 0, G_OPTION_ARG_INT, &mem_limit, "Address space of a CPU case in MiB", "MIB" },
    { NULL }
  };

  setlocale (LC_ALL, "");
  options = g_option_context_new ("- fuzz the Gmlp API through introspection");
  g_option_context_add_main_entries (options, entries, NULL);
  if (!g_option_context_parse (options, &argc, &argv, &error))
    {
      g_printerr ("%s\n", error->message);
      return 2;
    }
  timeout_s = MAX (timeout, 1);
  mem_limit_mib = MAX (mem_limit, 0);
  if (shard != NULL &&
      (sscanf (shard, "%u/%u", &shard_k, &shard_n) != 2 || shard_n == 0 || shard_k == 0 ||
       shard_k > shard_n))
    {
      g_printerr ("--shard takes K/N with 1 <= K <= N\n");
      return 2;
    }

  /* Criticals and warnings are judged, not fatal (G_DEBUG may make them
   * so); errors stay fatal. */
  g_log_set_always_fatal (G_LOG_FATAL_MASK);
  g_log_set_writer_func (fuzz_log_writer, NULL, NULL);

  repo = g_irepository_get_default ();
  if (g_irepository_require (repo, "Gmlp", "1.0", 0, &error) == NULL)
    {
      printf ("Bail out! no Gmlp typelib: %s\n", error->message);
      return 1;
    }
  fz_catalogue_init (repo, g_str_has_prefix (device_spec (), "cuda"));
  fz_calls_init (repo);

  /* By default six random calls per argument of every function, on top
   * of the sweep. */
  n_default_random = 6 * fz_n_random_slots ();
  cases = make_cases ((guint64) seed, n_default_random);
  if (n_cases >= 0)
    {
      guint structured = cases->len - n_default_random;

      if ((guint64) n_cases > structured)
        cases = make_cases ((guint64) seed, (guint) n_cases - structured);
      else
        g_ptr_array_set_size (cases, (guint) n_cases);
    }

  if (list)
    {
      for (i = 0; i < cases->len; i++)
        {
          const FzCase *c = cases->pdata[i];

          printf ("%u %s\n", c->index, c->description);
        }
      return 0;
    }

  if (one_case >= 0)
    {
      FzCtx ctx;
      int rc;

      if ((guint64) one_case >= cases->len)
        {
          g_printerr ("No case %" G_GINT64_FORMAT ": there are %u\n", one_case, cases->len);
          return 2;
        }
      printf ("case %" G_GINT64_FORMAT ": %s\n", one_case,
              ((FzCase *) cases->pdata[one_case])->description);
      ctx_init (&ctx);
      run_case (cases->pdata[one_case], &ctx);
      printf ("%s%s%s\n  outcome: %s\n  %s\n",
              ctx.verdict == FZ_PASS ? "PASS" : ctx.verdict == FZ_SKIP ? "SKIP" : "FAIL",
              ctx.category != NULL ? ": " : "", ctx.category != NULL ? ctx.category : "",
              ctx.outcome->str, ctx.failure->str);
      rc = ctx.verdict == FZ_FAIL ? 1 : 0;
      ctx_clear (&ctx);
      return rc;
    }

  {
    g_autofree char *why = NULL;

    if (!device_usable (&why))
      {
        printf ("1..0 # SKIP %s\n", why);
        return 0;
      }
  }

  for (i = 0; i < cases->len; i++)
    {
      const FzCase *c = cases->pdata[i];

      if (i % shard_n == shard_k - 1 && (match == NULL || strstr (c->description, match) != NULL))
        n_run++;
    }
  printf ("1..%u\n", n_run);
  number = 0;
  for (i = 0; i < cases->len; i++)
    {
      const FzCase *c = cases->pdata[i];
      FzResult r;

      if (i % shard_n != shard_k - 1 || (match != NULL && strstr (c->description, match) == NULL))
        continue;
      run_forked (c, &r);
      print_tap (++number, c, &r);
      if (r.verdict == FZ_FAIL)
        n_failed++;
      result_clear (&r);
    }
  printf ("# %u of %u cases failed\n", n_failed, n_run);
  /* The TAP lines carry the verdicts: meson counts a test that exits with
   * an error as an error, not as failed cases. */
  return 0;
}
