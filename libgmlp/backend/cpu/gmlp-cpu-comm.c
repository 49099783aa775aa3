/* gmlp-cpu-comm.c: the CPU backend's communicator, across threads and
 * processes
 *
 * The ranks are threads of one process or processes of one machine (each
 * normally with a CPU device of its own, cpu:0, cpu:1, ...), or both. They
 * meet in POSIX shared memory named by the unique id ("/gmlp-" and the
 * id's first 16 bytes in hex), which the first rank to join creates; the
 * ranks of one process share one mapping of it. A group of one rank meets
 * in memory of its own. Once every rank has joined, the name is unlinked:
 * the memory goes with the last mapping, also when ranks die.
 *
 * The segment holds a robust, process-shared mutex and a futex word that
 * is bumped at every change a waiter waits for (never a process-shared
 * condition variable: glibc's can block its signaller for good when a
 * waiting process dies); each rank's posted call; and a staging area per
 * rank. Joining is a barrier (comm_join, after comm_init has taken the
 * rank). A collective is rounds of two barriers: before the first each
 * rank has posted its call and copied its first piece of data into its
 * staging area; after it every rank checks the posts against each other
 * (the same checks on every rank, so all of them agree on an error) and
 * copies what is meant for it out of its peers' staging areas; after the
 * second no one reads a staging area any more, and the next piece goes in.
 * All-reduce adds the ranks' pieces in rank order in double: the same bits
 * on every rank.
 *
 * A rank that does not reach a barrier within the timeout, comm_abort on
 * any rank, a rank leaving, or a rank whose process dies (a waiting rank
 * looks at its peers' processes every LIVENESS_MS; one that dies holding
 * the mutex leaves it to the next owner as EOWNERDEAD) fails the group for
 * good: every waiting and every later call then returns GMLP_ERROR_ABORTED
 * with the reason, as an NCCL communicator must be aborted after an error.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backend/cpu/gmlp-cpu-comm.h"
#include "gmlp-error.h"
#include "gmlp-numeric.h"
#include "gmlp-thread-private.h"

/* The most ranks of one CPU group: each rank's staging area is split
 * between its peers for all-to-all, and the posts hold world² counts. */
#define MAX_WORLD        256
#define SHM_MAGIC        G_GUINT64_CONSTANT (0x314d4f43504c4d47)   /* "GMLPCOM1" */
#define FAILURE_BYTES    400
/* How often a waiting rank looks whether its peers' processes live. */
#define LIVENESS_MS      50
#define NAME_ID_BYTES    16

typedef enum {
  CPU_COLL_ALL_REDUCE,
  CPU_COLL_ALL_GATHER,
  CPU_COLL_ALL_TO_ALL,
} CpuCollKind;

static const char * const coll_names[] = { "all_reduce", "all_gather", "all_to_all" };

/* A call as the caller gives it (this rank's memory). */
typedef struct {
  CpuCollKind   kind;
  gconstpointer send;
  gpointer      recv;
  gsize         count;     /* all_reduce: elements; all_gather: bytes */
  int           dtype;
  int           op;
  const gsize  *send_offsets, *send_bytes, *recv_offsets, *recv_bytes;
} CpuColl;

/* The shared segment: a header, world_size ShmRank, the all-to-all counts
 * (world² sent, world² expected, row p by rank p), then the staging areas
 * (world × staging_bytes, page-aligned). Under the lock: everything but the
 * posts and the staging areas, which the barriers order. */
typedef struct {
  guint64          magic;          /* stored last by the creator */
  gint32           world_size;
  gint32           failed;
  guint64          staging_bytes;  /* per rank */
  guint64          counts_offset;
  guint64          staging_offset;
  guint64          total_bytes;
  pthread_mutex_t  lock;           /* robust, process-shared */
  gint32           lock_owner;     /* the rank holding it, or -1 */
  guint32          wake;           /* futex word: bumped at every change */
  guint64          generation;     /* barriers completed */
  gint32           arrived;        /* at the barrier in progress */
  gint32           pad;
  char             failure[FAILURE_BYTES];   /* why the group failed */
} ShmHeader;

typedef struct {
  /* under the lock */
  gint32   joined;
  gint32   here;          /* at the barrier in progress */
  gint32   pid;
  gint32   pad;
  guint64  pid_ns;        /* the inode of its pid namespace, or 0 */
  /* the post: written before a barrier, read after it */
  gint32   kind, dtype, op, pad2;
  guint64  count;
} ShmRank;

typedef struct {
  GBytes       *key;
  char         *name;        /* NULL for a group of one rank */
  int           refs;        /* under registry_lock */

  guint8       *base;
  gsize         size;
  ShmHeader    *hdr;
  ShmRank      *ranks;
  guint64      *send_counts; /* world²: row p by rank p */
  guint64      *recv_counts; /* world² */
  guint8       *staging;
  gsize         staging_bytes;
  int           world_size;

  /* Under the shared lock (only this process's ranks use them): a pidfd per
   * peer process once looked at, -1 not yet, -2 none (fall back on kill). */
  int          *pidfds;
  guint64       pid_ns;
} CpuRendezvous;

struct _GmlpBackendComm
{
  CpuRendezvous *rv;
  int            rank;
  guint          timeout_ms;
  guint64        n_calls;
};

static GMutex registry_lock;
static GHashTable *registry;   /* GBytes id -> CpuRendezvous */

/* A fresh id: GMLP_BACKEND_COMM_ID_BYTES random bytes, so that two groups
 * never meet. */
gboolean
gmlp_cpu_comm_unique_id (GmlpBackendDevice  *device,
                         guint8             *id,
                         GError            **error)
{
  guint i;

  for (i = 0; i < GMLP_BACKEND_COMM_ID_BYTES; i += 4)
    {
      guint32 r = g_random_int ();
      memcpy (id + i, &r, 4);
    }
  return TRUE;
}

static guint64
own_pid_ns (void)
{
  struct stat st;

  return stat ("/proc/self/ns/pid", &st) == 0 ? (guint64) st.st_ino : 0;
}

/* Each rank's staging area: 8 MiB for the group (at most 2 MiB a rank, at
 * least 64 KiB), all of it allocated when the group is made, so that a
 * full /dev/shm is an error then rather than a SIGBUS later. */
static gsize
staging_bytes_for (int world_size)
{
  gsize bytes = (gsize) 8 * 1024 * 1024 / world_size;

  return CLAMP (bytes, 64 * 1024, 2 * 1024 * 1024) & ~(gsize) 4095;
}

static void
layout_init (ShmHeader *hdr,
             int        world_size)
{
  gsize page = 4096, at;

  hdr->world_size = world_size;
  hdr->staging_bytes = staging_bytes_for (world_size);
  at = sizeof (ShmHeader) + (gsize) world_size * sizeof (ShmRank);
  hdr->counts_offset = (at + 63) & ~(gsize) 63;
  at = hdr->counts_offset + (gsize) 2 * world_size * world_size * sizeof (guint64);
  hdr->staging_offset = (at + page - 1) & ~(page - 1);
  hdr->total_bytes = hdr->staging_offset + (gsize) world_size * hdr->staging_bytes;
}

/* Points rv into its mapped segment, whose header is set. */
static gboolean
layout_attach (CpuRendezvous  *rv,
               GError        **error)
{
  ShmHeader *hdr = rv->hdr;
  int w = hdr->world_size;

  if (w < 1 || w > MAX_WORLD || hdr->total_bytes > rv->size)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_BACKEND,
                   "The communicator's shared memory %s is not one of libgmlp's", rv->name);
      return FALSE;
    }
  rv->world_size = w;
  rv->ranks = (ShmRank *) (hdr + 1);
  rv->send_counts = (guint64 *) (rv->base + hdr->counts_offset);
  rv->recv_counts = rv->send_counts + (gsize) w * w;
  rv->staging = rv->base + hdr->staging_offset;
  rv->staging_bytes = hdr->staging_bytes;
  rv->pidfds = g_new (int, w);
  for (int p = 0; p < w; p++)
    rv->pidfds[p] = -1;
  rv->pid_ns = own_pid_ns ();
  return TRUE;
}

static void
header_init (ShmHeader *hdr,
             int        world_size)
{
  pthread_mutexattr_t attr;

  layout_init (hdr, world_size);
  pthread_mutexattr_init (&attr);
  pthread_mutexattr_setpshared (&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust (&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init (&hdr->lock, &attr);
  pthread_mutexattr_destroy (&attr);
  hdr->lock_owner = -1;
  __atomic_store_n (&hdr->magic, SHM_MAGIC, __ATOMIC_RELEASE);
}

static gboolean
set_errno_error (GError     **error,
                 const char  *call,
                 const char  *name,
                 int          errsv)
{
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_BACKEND,
               "The CPU communicator's shared memory: %s (%s) failed: %s",
               call, name, g_strerror (errsv));
  return FALSE;
}

/* Creates the named segment, or opens the one another rank created and
 * waits (at most timeout_ms: its creator sets it up at once) until it is
 * set up. */
static gboolean
shm_open_segment (CpuRendezvous  *rv,
                  int             world_size,
                  guint           timeout_ms,
                  GError        **error)
{
  gint64 deadline = g_get_monotonic_time () + (gint64) timeout_ms * G_TIME_SPAN_MILLISECOND;
  ShmHeader probe = { 0 };
  guint64 total;
  int fd;

  layout_init (&probe, world_size);
  for (;;)
    {
      struct stat st;

      fd = shm_open (rv->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd >= 0)
        {
          int errsv = posix_fallocate (fd, 0, probe.total_bytes);

          if (errsv != 0)
            {
              close (fd);
              shm_unlink (rv->name);
              return set_errno_error (error, "posix_fallocate", rv->name, errsv);
            }
          rv->size = probe.total_bytes;
          rv->base = mmap (NULL, rv->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
          close (fd);
          if (rv->base == MAP_FAILED)
            {
              errsv = errno;
              rv->base = NULL;
              shm_unlink (rv->name);
              return set_errno_error (error, "mmap", rv->name, errsv);
            }
          rv->hdr = (ShmHeader *) rv->base;
          header_init (rv->hdr, world_size);
          return layout_attach (rv, error);
        }
      if (errno != EEXIST)
        return set_errno_error (error, "shm_open", rv->name, errno);

      fd = shm_open (rv->name, O_RDWR | O_CLOEXEC, 0600);
      if (fd < 0 && errno == ENOENT)
        continue;   /* unlinked meanwhile: make it anew */
      if (fd < 0)
        return set_errno_error (error, "shm_open", rv->name, errno);
      /* Its creator sizes it right after making it, then sets its header
       * up: the header is read first, then the whole is mapped. */
      while (fstat (fd, &st) == 0 && (gsize) st.st_size < sizeof (ShmHeader) &&
             g_get_monotonic_time () < deadline)
        g_usleep (1000);
      if (fstat (fd, &st) == 0 && (gsize) st.st_size >= sizeof (ShmHeader))
        {
          rv->size = sizeof (ShmHeader);
          rv->base = mmap (NULL, rv->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        }
      if (rv->base == MAP_FAILED)
        {
          int errsv = errno;

          rv->base = NULL;
          close (fd);
          return set_errno_error (error, "mmap", rv->name, errsv);
        }
      while (rv->base != NULL &&
             __atomic_load_n (&((ShmHeader *) rv->base)->magic, __ATOMIC_ACQUIRE) != SHM_MAGIC &&
             g_get_monotonic_time () < deadline)
        g_usleep (1000);
      if (rv->base == NULL ||
          __atomic_load_n (&((ShmHeader *) rv->base)->magic, __ATOMIC_ACQUIRE) != SHM_MAGIC)
        {
          close (fd);
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_ABORTED,
                       "The communicator's group has failed: its shared memory %s "
                       "was not set up within %u ms", rv->name, timeout_ms);
          return FALSE;
        }
      total = ((ShmHeader *) rv->base)->total_bytes;
      munmap (rv->base, rv->size);
      rv->base = NULL;
      if (fstat (fd, &st) != 0 || (guint64) st.st_size < total)
        {
          close (fd);
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_BACKEND,
                       "The communicator's shared memory %s is not one of libgmlp's", rv->name);
          return FALSE;
        }
      rv->size = total;
      rv->base = mmap (NULL, rv->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close (fd);
      if (rv->base == MAP_FAILED)
        {
          rv->base = NULL;
          return set_errno_error (error, "mmap", rv->name, errno);
        }
      rv->hdr = (ShmHeader *) rv->base;
      return layout_attach (rv, error);
    }
}

/* A group of one rank: the same segment in memory of its own. */
static gboolean
private_segment (CpuRendezvous  *rv,
                 GError        **error)
{
  ShmHeader probe = { 0 };

  layout_init (&probe, 1);
  rv->size = probe.total_bytes;
  rv->base = mmap (NULL, rv->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (rv->base == MAP_FAILED)
    {
      rv->base = NULL;
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_OUT_OF_MEMORY,
                   "The CPU communicator's memory: mmap failed: %s", g_strerror (errno));
      return FALSE;
    }
  rv->hdr = (ShmHeader *) rv->base;
  header_init (rv->hdr, 1);
  return layout_attach (rv, error);
}

static void
rendezvous_unref_locked (CpuRendezvous *rv)
{
  if (--rv->refs > 0)
    return;
  if (g_hash_table_lookup (registry, rv->key) == rv)
    g_hash_table_remove (registry, rv->key);
  if (rv->pidfds != NULL)
    for (int p = 0; p < rv->world_size; p++)
      if (rv->pidfds[p] >= 0)
        close (rv->pidfds[p]);
  g_free (rv->pidfds);
  /* Never pthread_mutex_destroy(): other processes may still use it. */
  if (rv->base != NULL)
    munmap (rv->base, rv->size);
  g_bytes_unref (rv->key);
  g_free (rv->name);
  g_free (rv);
}

static void
rendezvous_release (CpuRendezvous *rv)
{
  gmlp_mutex_lock (&registry_lock);
  rendezvous_unref_locked (rv);
  gmlp_mutex_unlock (&registry_lock);
}

static CpuRendezvous *
rendezvous_get (const guint8  *id,
                int            world_size,
                guint          timeout_ms,
                GError       **error)
{
  g_autoptr(GBytes) key = g_bytes_new (id, GMLP_BACKEND_COMM_ID_BYTES);
  CpuRendezvous *rv;
  gboolean ok;

  gmlp_mutex_lock (&registry_lock);
  if (registry == NULL)
    registry = g_hash_table_new (g_bytes_hash, g_bytes_equal);
  rv = g_hash_table_lookup (registry, key);
  if (rv != NULL)
    {
      rv->refs++;
      gmlp_mutex_unlock (&registry_lock);
      return rv;
    }

  rv = g_new0 (CpuRendezvous, 1);
  rv->key = g_bytes_ref (key);
  rv->refs = 1;
  if (world_size == 1)
    ok = private_segment (rv, error);
  else
    {
      GString *name = g_string_new ("/gmlp-");

      for (int i = 0; i < NAME_ID_BYTES; i++)
        g_string_append_printf (name, "%02x", id[i]);
      rv->name = g_string_free (name, FALSE);
      ok = shm_open_segment (rv, world_size, timeout_ms, error);
    }
  if (ok)
    g_hash_table_insert (registry, rv->key, rv);
  else
    {
      rendezvous_unref_locked (rv);
      rv = NULL;
    }
  gmlp_mutex_unlock (&registry_lock);
  return rv;
}

static void
rendezvous_unlink (CpuRendezvous *rv)
{
  if (rv->name != NULL)
    shm_unlink (rv->name);   /* the first rank to get here does */
}

static void
wake_all (CpuRendezvous *rv)
{
  __atomic_add_fetch (&rv->hdr->wake, 1, __ATOMIC_SEQ_CST);
  syscall (SYS_futex, &rv->hdr->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Fails the group (the lock held); the first reason stays. */
static void
rendezvous_fail (CpuRendezvous *rv,
                 char          *reason)
{
  if (!rv->hdr->failed)
    {
      g_strlcpy (rv->hdr->failure, reason, FAILURE_BYTES);
      rv->hdr->failed = TRUE;
    }
  g_free (reason);
  wake_all (rv);
}

static void
rendezvous_lock (CpuRendezvous *rv,
                 int            rank)
{
  ShmHeader *hdr = rv->hdr;
  int rc = pthread_mutex_lock (&hdr->lock);

  if (rc == EOWNERDEAD)
    {
      /* Its owner's process died within the lock: what it left may be half
       * written, and the group cannot go on. */
      int owner = hdr->lock_owner;

      pthread_mutex_consistent (&hdr->lock);
      hdr->lock_owner = rank;
      if (owner >= 0 && owner < rv->world_size)
        rendezvous_fail (rv, g_strdup_printf ("rank %d (process %d) died", owner,
                                              rv->ranks[owner].pid));
      else
        rendezvous_fail (rv, g_strdup ("a rank died"));
      return;
    }
  g_assert (rc == 0);
  hdr->lock_owner = rank;
}

static void
rendezvous_unlock (CpuRendezvous *rv)
{
  rv->hdr->lock_owner = -1;
  pthread_mutex_unlock (&rv->hdr->lock);
}

static gboolean
set_failed (CpuRendezvous  *rv,
            GError        **error)
{
  g_set_error (error, GMLP_ERROR, GMLP_ERROR_ABORTED,
               "The communicator's group has failed: %s", rv->hdr->failure);
  return FALSE;
}

/* Whether peer p's process has ended (the lock held). A pidfd sees a
 * process that has ended but is not yet reaped; without one, kill() and
 * /proc do. */
static gboolean
peer_died (CpuRendezvous *rv,
           int            p)
{
  pid_t pid = rv->ranks[p].pid;
  g_autofree char *path = NULL, *contents = NULL;
  const char *paren;

  if (rv->pidfds[p] == -1)
    {
#ifdef SYS_pidfd_open
      rv->pidfds[p] = (int) syscall (SYS_pidfd_open, pid, 0);
      if (rv->pidfds[p] < 0)
        rv->pidfds[p] = errno == ESRCH ? -3 : -2;
#else
      rv->pidfds[p] = -2;
#endif
    }
  if (rv->pidfds[p] == -3)
    return TRUE;
  if (rv->pidfds[p] >= 0)
    {
      struct pollfd pfd = { .fd = rv->pidfds[p], .events = POLLIN };

      return poll (&pfd, 1, 0) > 0;
    }
  if (kill (pid, 0) != 0 && errno == ESRCH)
    return TRUE;
  path = g_strdup_printf ("/proc/%d/stat", (int) pid);
  if (!g_file_get_contents (path, &contents, NULL, NULL))
    return FALSE;
  paren = strrchr (contents, ')');
  return paren != NULL && (paren[1] == ' ') && (paren[2] == 'Z' || paren[2] == 'X');
}

/* Fails the group if a peer's process has died (the lock held). The ranks
 * of this process, and those in another pid namespace, are not looked at. */
static void
check_peers (CpuRendezvous *rv)
{
  pid_t self = getpid ();

  for (int p = 0; p < rv->world_size && !rv->hdr->failed; p++)
    {
      ShmRank *peer = &rv->ranks[p];

      if (!peer->joined || peer->pid == self || peer->pid_ns != rv->pid_ns)
        continue;
      if (peer_died (rv, p))
        rendezvous_fail (rv, g_strdup_printf ("rank %d (process %d) died", p, peer->pid));
    }
}

/* Lets go of the lock until something changes, at most until deadline
 * (monotonic µs) and LIVENESS_MS. */
static void
rendezvous_wait (CpuRendezvous *rv,
                 int            rank,
                 gint64         deadline)
{
  guint32 seen = __atomic_load_n (&rv->hdr->wake, __ATOMIC_SEQ_CST);
  gint64 span = MIN (deadline - g_get_monotonic_time (), LIVENESS_MS * G_TIME_SPAN_MILLISECOND);
  struct timespec ts;

  if (span <= 0)
    return;
  ts.tv_sec = span / G_USEC_PER_SEC;
  ts.tv_nsec = (span % G_USEC_PER_SEC) * 1000;
  rendezvous_unlock (rv);
  syscall (SYS_futex, &rv->hdr->wake, FUTEX_WAIT, seen, &ts, NULL, 0);
  rendezvous_lock (rv, rank);
}

/* Waits until every rank has reached this barrier (the lock held), at most
 * timeout_ms; what names the barrier in the failure. */
static gboolean
rendezvous_barrier (CpuRendezvous  *rv,
                    int             rank,
                    guint           timeout_ms,
                    const char     *what,
                    GError        **error)
{
  ShmHeader *hdr = rv->hdr;
  gint64 deadline = g_get_monotonic_time () + (gint64) timeout_ms * G_TIME_SPAN_MILLISECOND;
  guint64 generation = hdr->generation;

  if (hdr->failed)
    return set_failed (rv, error);

  rv->ranks[rank].here = TRUE;
  if (++hdr->arrived == rv->world_size)
    {
      hdr->arrived = 0;
      for (int p = 0; p < rv->world_size; p++)
        rv->ranks[p].here = FALSE;
      hdr->generation++;
      wake_all (rv);
      return TRUE;
    }

  while (hdr->generation == generation && !hdr->failed)
    {
      if (g_get_monotonic_time () >= deadline)
        {
          GString *missing = g_string_new (NULL);
          int n_missing = 0;

          for (int p = 0; p < rv->world_size; p++)
            if (!rv->ranks[p].here)
              g_string_append_printf (missing, "%s%d", n_missing++ ? ", " : "", p);
          rendezvous_fail (rv, g_strdup_printf ("rank %d waited %u ms at %s for %s %s",
                                                rank, timeout_ms, what,
                                                n_missing > 1 ? "ranks" : "rank", missing->str));
          g_string_free (missing, TRUE);
          break;
        }
      check_peers (rv);
      if (!hdr->failed)
        rendezvous_wait (rv, rank, deadline);
    }

  /* A barrier that completed stands, whatever happened since. */
  if (hdr->generation != generation)
    return TRUE;
  return set_failed (rv, error);
}

GmlpBackendComm *
gmlp_cpu_comm_init (GmlpBackendDevice  *device,
                    const guint8       *id,
                    int                 rank,
                    int                 world_size,
                    guint               timeout_ms,
                    GError            **error)
{
  CpuRendezvous *rv;
  GmlpBackendComm *comm;
  gboolean ok, failed = FALSE;

  if (world_size > MAX_WORLD)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "The CPU communicator takes groups of at most %d ranks, not %d",
                   MAX_WORLD, world_size);
      return NULL;
    }
  rv = rendezvous_get (id, world_size, timeout_ms, error);
  if (rv == NULL)
    return NULL;

  rendezvous_lock (rv, rank);
  if (rv->world_size != world_size)
    {
      /* The group can never be complete: fail it for the others too. */
      rendezvous_fail (rv, g_strdup_printf ("rank %d joined a group of %d ranks "
                                            "as one of %d", rank, rv->world_size, world_size));
      ok = set_failed (rv, error);
      failed = TRUE;
    }
  else if (rv->ranks[rank].joined)
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_ARGUMENT,
                   "Rank %d of this unique id has joined already: each rank joins once", rank);
      ok = FALSE;
    }
  else if (rv->hdr->failed)
    {
      ok = set_failed (rv, error);
      failed = TRUE;
    }
  else
    {
      rv->ranks[rank].joined = TRUE;
      rv->ranks[rank].pid = getpid ();
      rv->ranks[rank].pid_ns = rv->pid_ns;
      ok = TRUE;
    }
  rendezvous_unlock (rv);

  if (!ok)
    {
      if (failed)
        rendezvous_unlink (rv);
      rendezvous_release (rv);
      return NULL;
    }

  comm = g_new0 (GmlpBackendComm, 1);
  comm->rv = rv;
  comm->rank = rank;
  comm->timeout_ms = timeout_ms;
  return comm;
}

gboolean
gmlp_cpu_comm_join (GmlpBackendComm  *comm,
                    GError          **error)
{
  CpuRendezvous *rv = comm->rv;
  gboolean ok;

  rendezvous_lock (rv, comm->rank);
  ok = rendezvous_barrier (rv, comm->rank, comm->timeout_ms, "joining the group", error);
  rendezvous_unlock (rv);
  /* Every rank has mapped the segment, or the group has failed: the name
   * is not needed any more. */
  rendezvous_unlink (rv);
  return ok;
}

void
gmlp_cpu_comm_abort (GmlpBackendComm *comm)
{
  CpuRendezvous *rv = comm->rv;

  rendezvous_lock (rv, comm->rank);
  rendezvous_fail (rv, g_strdup_printf ("rank %d aborted it", comm->rank));
  rendezvous_unlock (rv);
}

void
gmlp_cpu_comm_free (GmlpBackendComm *comm)
{
  CpuRendezvous *rv = comm->rv;

  /* The others' later collectives need this rank: they fail at once. Its
   * past ones are complete (each ends on a barrier), so nothing of it is
   * read any more. */
  rendezvous_lock (rv, comm->rank);
  rendezvous_fail (rv, g_strdup_printf ("rank %d left it", comm->rank));
  rendezvous_unlock (rv);
  /* A rank that leaves before the group is complete. */
  rendezvous_unlink (rv);
  rendezvous_release (rv);
  g_free (comm);
}

/* The posted calls agree (the same checks on every rank, so every rank
 * gives the same answer). */
static gboolean
posts_agree (CpuRendezvous  *rv,
             GError        **error)
{
  const ShmRank *s0 = &rv->ranks[0];
  int w = rv->world_size;

  for (int p = 1; p < w; p++)
    {
      const ShmRank *s = &rv->ranks[p];

      if (s->kind != s0->kind)
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_INVALID_STATE,
                       "The ranks called different collectives: rank 0 %s, rank %d %s",
                       coll_names[s0->kind], p, coll_names[s->kind]);
          return FALSE;
        }
      if (s->kind != CPU_COLL_ALL_TO_ALL &&
          (s->count != s0->count || s->dtype != s0->dtype || s->op != s0->op))
        {
          g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                       "The ranks' %s disagree: rank 0 gave %" G_GUINT64_FORMAT " %s of dtype %d "
                       "(op %d), rank %d %" G_GUINT64_FORMAT " of dtype %d (op %d)",
                       coll_names[s0->kind], s0->count,
                       s0->kind == CPU_COLL_ALL_REDUCE ? "elements" : "bytes",
                       s0->dtype, s0->op, p, s->count, s->dtype, s->op);
          return FALSE;
        }
    }

  if (s0->kind == CPU_COLL_ALL_TO_ALL)
    for (int p = 0; p < w; p++)
      for (int q = 0; q < w; q++)
        if (rv->send_counts[p * w + q] != rv->recv_counts[q * w + p])
          {
            g_set_error (error, GMLP_ERROR, GMLP_ERROR_SHAPE_MISMATCH,
                         "all_to_all: rank %d sends %" G_GUINT64_FORMAT " bytes to rank %d, "
                         "which expects %" G_GUINT64_FORMAT, p, rv->send_counts[p * w + q], q,
                         rv->recv_counts[q * w + p]);
            return FALSE;
          }
  return TRUE;
}

/* A piece of a collective: bytes [first, first + len) of a whole. */
static gsize
piece (guint64  total,
       gsize    chunk,
       guint64  round,
       gsize   *first)
{
  *first = (gsize) (round * chunk);
  return total > *first ? (gsize) MIN ((guint64) chunk, total - *first) : 0;
}

/* The bytes of a piece: for all-reduce whole elements; for all-to-all the
 * staging area is split between the peers. */
static gsize
chunk_bytes (CpuRendezvous *rv)
{
  const ShmRank *s0 = &rv->ranks[0];

  switch (s0->kind)
    {
    case CPU_COLL_ALL_REDUCE:
      {
        gsize size = gmlp_num_dtype_size (s0->dtype);

        return rv->staging_bytes / size * size;
      }
    case CPU_COLL_ALL_GATHER:
      return rv->staging_bytes;
    case CPU_COLL_ALL_TO_ALL:
      return rv->staging_bytes / rv->world_size;
    default:
      g_assert_not_reached ();
    }
}

/* How many rounds the agreed collective takes: the same on every rank. */
static guint64
n_rounds (CpuRendezvous *rv)
{
  const ShmRank *s0 = &rv->ranks[0];
  gsize chunk = chunk_bytes (rv);
  guint64 most = 0;
  int w = rv->world_size;

  switch (s0->kind)
    {
    case CPU_COLL_ALL_REDUCE:
      most = s0->count * gmlp_num_dtype_size (s0->dtype);
      break;
    case CPU_COLL_ALL_GATHER:
      most = s0->count;
      break;
    case CPU_COLL_ALL_TO_ALL:
      for (int i = 0; i < w * w; i++)
        most = MAX (most, rv->send_counts[i]);
      break;
    default:
      g_assert_not_reached ();
    }
  return (most + chunk - 1) / chunk;
}

/* Copies this rank's piece of round k into its staging area. The pieces
 * follow the call's own sizes, so that before the posts are checked
 * nothing is written but this rank's staging area. */
static void
put_piece (CpuRendezvous  *rv,
           int             rank,
           const CpuColl  *c,
           guint64         k)
{
  guint8 *mine = rv->staging + (gsize) rank * rv->staging_bytes;
  gsize first, len;

  switch (c->kind)
    {
    case CPU_COLL_ALL_REDUCE:
      {
        gsize size = gmlp_num_dtype_size (c->dtype);

        len = piece ((guint64) c->count * size, rv->staging_bytes / size * size, k, &first);
        if (len > 0)
          memcpy (mine, (const guint8 *) c->send + first, len);
        break;
      }
    case CPU_COLL_ALL_GATHER:
      len = piece (c->count, rv->staging_bytes, k, &first);
      if (len > 0)
        memcpy (mine, (const guint8 *) c->send + first, len);
      break;
    case CPU_COLL_ALL_TO_ALL:
      {
        gsize share = rv->staging_bytes / rv->world_size;

        for (int q = 0; q < rv->world_size; q++)
          {
            len = piece (c->send_bytes[q], share, k, &first);
            if (len > 0)
              memcpy (mine + q * share, (const guint8 *) c->send + c->send_offsets[q] + first, len);
          }
        break;
      }
    default:
      g_assert_not_reached ();
    }
}

/* Takes what round k brought this rank out of the staging areas: the sum
 * (or average) of the ranks' pieces, in rank order, in double (or 64-bit
 * integers), rounded once, into scratch; the peers' pieces into recv. */
static void
take_piece (CpuRendezvous  *rv,
            int             rank,
            const CpuColl  *c,
            guint64         k,
            gpointer        scratch)
{
  int w = rv->world_size;
  gsize first, len;

  switch (c->kind)
    {
    case CPU_COLL_ALL_REDUCE:
      {
        gsize size = gmlp_num_dtype_size (c->dtype), i0, n;

        len = piece ((guint64) c->count * size, rv->staging_bytes / size * size, k, &first);
        i0 = first / size;
        n = len / size;
        for (gsize i = 0; i < n; i++)
          {
            if (c->dtype == GMLP_NUM_INT64 || c->dtype == GMLP_NUM_INT32)
              {
                guint64 acc = 0;   /* wraps as two's complement, as NCCL's does */

                for (int p = 0; p < w; p++)
                  {
                    const guint8 *in = rv->staging + (gsize) p * rv->staging_bytes;

                    acc += c->dtype == GMLP_NUM_INT64 ? (guint64) ((const gint64 *) in)[i]
                                                      : (guint64) (gint64) ((const gint32 *) in)[i];
                  }
                if (c->dtype == GMLP_NUM_INT64)
                  ((gint64 *) scratch)[i0 + i] = (gint64) acc;
                else
                  ((gint32 *) scratch)[i0 + i] = (gint32) (guint32) acc;
              }
            else
              {
                double acc = 0;

                for (int p = 0; p < w; p++)
                  acc += gmlp_num_load_float (rv->staging + (gsize) p * rv->staging_bytes, c->dtype, i);
                if (c->op == GMLP_COMM_AVERAGE)
                  acc /= w;
                gmlp_num_store_float (scratch, c->dtype, i0 + i, (float) acc);
              }
          }
        break;
      }
    case CPU_COLL_ALL_GATHER:
      len = piece (c->count, rv->staging_bytes, k, &first);
      for (int p = 0; p < w && len > 0; p++)
        memcpy ((guint8 *) c->recv + p * c->count + first,
                rv->staging + (gsize) p * rv->staging_bytes, len);
      break;
    case CPU_COLL_ALL_TO_ALL:
      {
        gsize share = rv->staging_bytes / w;

        for (int p = 0; p < w; p++)
          {
            len = piece (c->recv_bytes[p], share, k, &first);
            if (len > 0)
              memcpy ((guint8 *) c->recv + c->recv_offsets[p] + first,
                      rv->staging + (gsize) p * rv->staging_bytes + rank * share, len);
          }
        break;
      }
    default:
      g_assert_not_reached ();
    }
}

static gboolean
collective (GmlpBackendComm  *comm,
            const CpuColl    *c,
            GError          **error)
{
  CpuRendezvous *rv = comm->rv;
  ShmRank *mine = &rv->ranks[comm->rank];
  g_autofree char *what = NULL, *end = NULL;
  g_autofree guint8 *scratch = NULL;
  GError *mismatch = NULL;
  guint64 rounds = 0, k;
  gboolean ok;
  int w = rv->world_size;

  comm->n_calls++;
  what = g_strdup_printf ("%s (collective %" G_GUINT64_FORMAT ")", coll_names[c->kind], comm->n_calls);
  end = g_strdup_printf ("the end of %s", what);
  /* All-reduce is in place: the result waits here until the group is done. */
  if (c->kind == CPU_COLL_ALL_REDUCE)
    scratch = g_malloc (MAX (c->count, 1) * gmlp_num_dtype_size (c->dtype));

  /* Every rank has passed the previous collective's last barrier: no one
   * reads the posts or the staging areas now. */
  mine->kind = c->kind;
  mine->dtype = c->dtype;
  mine->op = c->op;
  mine->count = c->count;
  if (c->kind == CPU_COLL_ALL_TO_ALL)
    for (int q = 0; q < w; q++)
      {
        rv->send_counts[comm->rank * w + q] = c->send_bytes[q];
        rv->recv_counts[comm->rank * w + q] = c->recv_bytes[q];
      }
  put_piece (rv, comm->rank, c, 0);

  rendezvous_lock (rv, comm->rank);
  ok = rendezvous_barrier (rv, comm->rank, comm->timeout_ms, what, error);
  rendezvous_unlock (rv);
  if (!ok)
    return FALSE;

  if (posts_agree (rv, &mismatch))
    rounds = n_rounds (rv);
  for (k = 0; ; k++)
    {
      gboolean last = k + 1 >= rounds;

      if (k < rounds)
        take_piece (rv, comm->rank, c, k, scratch);
      rendezvous_lock (rv, comm->rank);
      ok = rendezvous_barrier (rv, comm->rank, comm->timeout_ms, last ? end : what,
                               mismatch ? NULL : error);
      rendezvous_unlock (rv);
      if (!ok || last)
        break;
      put_piece (rv, comm->rank, c, k + 1);
      rendezvous_lock (rv, comm->rank);
      ok = rendezvous_barrier (rv, comm->rank, comm->timeout_ms, what, error);
      rendezvous_unlock (rv);
      if (!ok)
        break;
    }

  if (mismatch != NULL)
    {
      g_propagate_error (error, mismatch);
      return FALSE;
    }
  if (!ok)
    return FALSE;
  if (c->kind == CPU_COLL_ALL_REDUCE && c->count > 0)
    memcpy (c->recv, scratch, c->count * gmlp_num_dtype_size (c->dtype));
  return TRUE;
}

gboolean
gmlp_cpu_comm_all_reduce (GmlpBackendComm  *comm,
                          gpointer          data,
                          gsize             count,
                          int               dtype,
                          int               op,
                          GError          **error)
{
  CpuColl c = { .kind = CPU_COLL_ALL_REDUCE, .send = data, .recv = data,
                .count = count, .dtype = dtype, .op = op };

  if (dtype != GMLP_NUM_FLOAT32 && dtype != GMLP_NUM_FLOAT16 && dtype != GMLP_NUM_BFLOAT16 &&
      ((dtype != GMLP_NUM_INT32 && dtype != GMLP_NUM_INT64) || op != GMLP_COMM_SUM))
    {
      g_set_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED,
                   "all_reduce takes float32, float16 and bfloat16, and int32 and int64 "
                   "for sums, not dtype %d with op %d", dtype, op);
      return FALSE;
    }
  return collective (comm, &c, error);
}

gboolean
gmlp_cpu_comm_all_gather (GmlpBackendComm  *comm,
                          gconstpointer     send,
                          gpointer          recv,
                          gsize             nbytes,
                          GError          **error)
{
  CpuColl c = { .kind = CPU_COLL_ALL_GATHER, .send = send, .recv = recv, .count = nbytes };

  return collective (comm, &c, error);
}

gboolean
gmlp_cpu_comm_all_to_all (GmlpBackendComm  *comm,
                          gconstpointer     send,
                          const gsize      *send_offsets,
                          const gsize      *send_bytes,
                          gpointer          recv,
                          const gsize      *recv_offsets,
                          const gsize      *recv_bytes,
                          GmlpBackendEvent **done,
                          GError          **error)
{
  CpuColl c = { .kind = CPU_COLL_ALL_TO_ALL, .send = send, .recv = recv,
                .send_offsets = send_offsets, .send_bytes = send_bytes,
                .recv_offsets = recv_offsets, .recv_bytes = recv_bytes };

  /* Done on return, on the calling thread: nothing for the caller to wait
   * for. */
  if (done != NULL)
    *done = NULL;
  return collective (comm, &c, error);
}
