/* gmlp-test-group.h: a group of ranks as threads of the test, for the
 * suites of GmlpCommunicator and of what runs on it
 *
 * Rank r of a group of W runs in a thread of its own on a device of its
 * own: cpu:r on the CPU (the in-process communicator), cuda:r when
 * GMLP_TEST_DEVICE is cuda (NCCL).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <gmlp.h>

G_BEGIN_DECLS

#define GMLP_TEST_MAX_WORLD 4

typedef struct _GmlpTestGroup GmlpTestGroup;
/* What each rank runs, in its thread, with its communicator. */
typedef void (*GmlpTestRankFunc) (GmlpTestGroup    *group,
                                  int               rank,
                                  GmlpCommunicator *comm,
                                  gpointer          data);

struct _GmlpTestGroup {
  int               world;
  guint             timeout_ms;
  GBytes           *uid;
  GmlpDevice       *devices[GMLP_TEST_MAX_WORLD];
  GmlpTestRankFunc  func;
  gpointer          data;
};

/* Whether the suite runs on GPUs (GMLP_TEST_DEVICE=cuda...). */
gboolean gmlp_test_on_cuda      (void);
/* The devices of a group of @world ranks and its id, or FALSE when there
 * are too few GPUs (the test is skipped where not even two ranks can run,
 * else only this group is: every test starts with the smallest groups) or
 * no NCCL (skipped). */
gboolean gmlp_test_group_init   (GmlpTestGroup    *group,
                                 int               world,
                                 guint             timeout_ms);
void     gmlp_test_group_clear  (GmlpTestGroup    *group);
/* Runs @func on every rank, each in a thread with its communicator (made
 * with the group's timeout), and waits for them all. */
void     gmlp_test_group_run    (GmlpTestGroup    *group,
                                 GmlpTestRankFunc  func,
                                 gpointer          data);

G_END_DECLS
