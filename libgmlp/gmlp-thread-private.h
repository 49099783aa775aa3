/* gmlp-thread-private.h: locks that ThreadSanitizer sees
 *
 * On Linux GLib's GMutex and GRecMutex are futexes inside libglib, which is
 * not built with -fsanitize=thread: ThreadSanitizer sees neither the lock
 * nor the order it puts between critical sections, and reports races on
 * the data they protect. libgmlp's own locks go through these wrappers,
 * which under ThreadSanitizer also tell it that an unlock happens before
 * the next lock of the same mutex; otherwise they are GLib's calls. Use
 * g_atomic_int_* (macros over the compiler's atomics, which it sees) rather
 * than gatomicrefcount (functions of libglib) for reference counts that
 * guard memory.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib-object.h>

G_BEGIN_DECLS

#if defined(__SANITIZE_THREAD__)
# define GMLP_THREAD_SANITIZER 1
#elif defined(__has_feature)
# if __has_feature(thread_sanitizer)
#  define GMLP_THREAD_SANITIZER 1
# endif
#endif

#ifdef GMLP_THREAD_SANITIZER
void __tsan_acquire (void *addr);
void __tsan_release (void *addr);
# define gmlp_tsan_acquire(addr) __tsan_acquire ((void *) (addr))
# define gmlp_tsan_release(addr) __tsan_release ((void *) (addr))
#else
# define gmlp_tsan_acquire(addr) G_STMT_START { (void) (addr); } G_STMT_END
# define gmlp_tsan_release(addr) G_STMT_START { (void) (addr); } G_STMT_END
#endif

static inline void
gmlp_mutex_lock (GMutex *mutex)
{
  g_mutex_lock (mutex);
  gmlp_tsan_acquire (mutex);
}

static inline void
gmlp_mutex_unlock (GMutex *mutex)
{
  gmlp_tsan_release (mutex);
  g_mutex_unlock (mutex);
}

static inline void
gmlp_rec_mutex_lock (GRecMutex *mutex)
{
  g_rec_mutex_lock (mutex);
  gmlp_tsan_acquire (mutex);
}

static inline void
gmlp_rec_mutex_unlock (GRecMutex *mutex)
{
  gmlp_tsan_release (mutex);
  g_rec_mutex_unlock (mutex);
}

/* Drops a reference to an object that another thread may hold too, and
 * may drop last: the use of it on this thread happens before its
 * finalize, which GObject's reference count ensures inside libgobject,
 * unseen. Its class's finalize calls gmlp_tsan_acquire (self). */
static inline void
gmlp_object_unref_shared (gpointer object)
{
  gmlp_tsan_release (object);
  g_object_unref (object);
}

/* G_DEFINE_QUARK, with the quark kept in an atomic: errors are raised on
 * several threads at once, and the plain static of GLib's macro is a data
 * race to ThreadSanitizer (a benign one: every thread stores the same
 * value). */
#define GMLP_DEFINE_QUARK(QN, q_n) \
GQuark \
q_n##_quark (void) \
{ \
  static int q_n##_quark_value; \
  GQuark quark = (GQuark) g_atomic_int_get (&q_n##_quark_value); \
  \
  if (G_UNLIKELY (quark == 0)) \
    { \
      quark = g_quark_from_static_string (#QN); \
      g_atomic_int_set (&q_n##_quark_value, (int) quark); \
    } \
  return quark; \
}

/* g_autoptr() lockers, as GMutexLocker and GRecMutexLocker. */
typedef GMutex GmlpMutexLocker;
typedef GRecMutex GmlpRecMutexLocker;

static inline GmlpMutexLocker *
gmlp_mutex_locker_new (GMutex *mutex)
{
  gmlp_mutex_lock (mutex);
  return (GmlpMutexLocker *) mutex;
}

static inline void
gmlp_mutex_locker_free (GmlpMutexLocker *locker)
{
  gmlp_mutex_unlock (locker);
}

static inline GmlpRecMutexLocker *
gmlp_rec_mutex_locker_new (GRecMutex *mutex)
{
  gmlp_rec_mutex_lock (mutex);
  return (GmlpRecMutexLocker *) mutex;
}

static inline void
gmlp_rec_mutex_locker_free (GmlpRecMutexLocker *locker)
{
  gmlp_rec_mutex_unlock (locker);
}

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GmlpMutexLocker, gmlp_mutex_locker_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GmlpRecMutexLocker, gmlp_rec_mutex_locker_free)

G_END_DECLS
