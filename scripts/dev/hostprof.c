/* hostprof.c: a sampling profiler of the host's time, for LD_PRELOAD
 *
 * Where a GPU host has no perf: a timer samples the main thread's stack
 * every HOSTPROF_US microseconds of wall time (default 20), and the stacks
 * go to HOSTPROF_OUT with a copy of /proc/self/maps, for
 * scripts/dev/hostprof-report.py to name here.
 *
 *   gcc -O2 -shared -fPIC -o hostprof.so scripts/dev/hostprof.c -lrt
 *   HOSTPROF_OUT=prof.txt LD_PRELOAD=$PWD/hostprof.so PROGRAM ARGS
 *
 * Wall time, not CPU time: a call that waits (in the driver, on a lock)
 * counts as much as one that computes, which is what host time means.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define DEPTH 48

/* DEPTH slots per sample: the program's time since the previous handler
 * returned (ns) in slot 0, the depth in slot 1, then the stack. */
static void **samples;
static size_t capacity, taken;
static long long last_exit;
static timer_t timer;
static int running;

static long long
now_ns (void)
{
  struct timespec t;

  clock_gettime (CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Each sample weighs the time the program ran since the last one was
 * taken, not the timer's interval: where unwinding is slow (a large
 * library), the next tick is already due when the handler returns, and
 * counting ticks would pile samples up there. */
static void
on_tick (int sig, siginfo_t *info, void *context)
{
  long long entry = now_ns ();
  void **slot;
  int depth;

  (void) sig;
  (void) info;
  (void) context;
  if (taken >= capacity)
    return;
  slot = samples + taken * DEPTH;
  depth = backtrace (slot + 2, DEPTH - 2);
  slot[0] = (void *) (long) (last_exit ? entry - last_exit : 0);
  slot[1] = (void *) (long) depth;
  taken++;
  last_exit = now_ns ();
}

__attribute__ ((constructor)) static void
hostprof_start (void)
{
  const char *out = getenv ("HOSTPROF_OUT"), *us = getenv ("HOSTPROF_US");
  long interval = us ? atol (us) : 20;
  struct sigaction action;
  struct sigevent event;
  struct itimerspec spec;
  void *warm[4];

  if (out == NULL)
    return;
  capacity = 400000;
  samples = calloc (capacity * DEPTH, sizeof (void *));
  if (samples == NULL)
    return;
  backtrace (warm, 4);   /* loads the unwinder now, not in a handler */

  memset (&action, 0, sizeof action);
  action.sa_sigaction = on_tick;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction (SIGPROF, &action, NULL);

  memset (&event, 0, sizeof event);
  event.sigev_notify = SIGEV_THREAD_ID;
  event.sigev_signo = SIGPROF;
  event._sigev_un._tid = (pid_t) syscall (SYS_gettid);
  if (timer_create (CLOCK_MONOTONIC, &event, &timer) != 0)
    return;
  spec.it_interval.tv_sec = 0;
  spec.it_interval.tv_nsec = interval * 1000;
  spec.it_value = spec.it_interval;
  timer_settime (timer, 0, &spec, NULL);
  running = 1;
}

__attribute__ ((destructor)) static void
hostprof_stop (void)
{
  const char *out = getenv ("HOSTPROF_OUT");
  FILE *file, *maps;
  char line[4096];
  size_t i;
  int j;

  if (!running)
    return;
  timer_delete (timer);
  running = 0;
  file = fopen (out, "w");
  if (file == NULL)
    return;
  maps = fopen ("/proc/self/maps", "r");
  while (maps && fgets (line, sizeof line, maps))
    fprintf (file, "map %s", line);
  if (maps)
    fclose (maps);
  for (i = 0; i < taken; i++)
    {
      void **slot = samples + i * DEPTH;
      int depth = (int) (long) slot[1];

      fprintf (file, "w %ld", (long) slot[0]);
      for (j = 2; j < depth + 2; j++)
        fprintf (file, " %lx", (unsigned long) slot[j]);
      fputs ("\n", file);
    }
  fclose (file);
}
