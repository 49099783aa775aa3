/* gmlp-test-group.c: a group of ranks as threads of the test
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "gmlp-test-group.h"

gboolean
gmlp_test_on_cuda (void)
{
  const char *spec = g_getenv ("GMLP_TEST_DEVICE");

  return spec != NULL && g_str_has_prefix (spec, "cuda");
}

typedef struct {
  GmlpTestGroup *group;
  int            rank;
} RankArg;

static gpointer
rank_thread (gpointer p)
{
  RankArg *arg = p;
  GmlpTestGroup *group = arg->group;
  g_autoptr(GError) error = NULL;
  g_autoptr(GmlpCommunicator) comm = NULL;

  comm = g_initable_new (GMLP_TYPE_COMMUNICATOR, NULL, &error,
                         "device", group->devices[arg->rank], "unique-id", group->uid,
                         "rank", arg->rank, "world-size", group->world,
                         "timeout-ms", group->timeout_ms, NULL);
  g_assert_no_error (error);
  g_assert_cmpint (gmlp_communicator_get_rank (comm), ==, arg->rank);
  group->func (group, arg->rank, comm, group->data);
  return NULL;
}

gboolean
gmlp_test_group_init (GmlpTestGroup *group,
                      int            world,
                      guint          timeout_ms)
{
  g_autoptr(GError) error = NULL;
  gboolean cuda = gmlp_test_on_cuda ();
  int r;

  g_assert_cmpint (world, >=, 1);
  g_assert_cmpint (world, <=, GMLP_TEST_MAX_WORLD);
  memset (group, 0, sizeof *group);
  group->world = world;
  group->timeout_ms = timeout_ms;
  if (cuda && gmlp_device_get_count (GMLP_DEVICE_KIND_CUDA) < world)
    {
      g_autofree char *msg = g_strdup_printf ("%d ranks need %d GPUs", world, world);

      if (world <= 2)
        g_test_skip (msg);
      else
        g_test_message ("%s: not run", msg);
      return FALSE;
    }
  for (r = 0; r < world; r++)
    {
      g_autofree char *spec = g_strdup_printf ("%s:%d", cuda ? "cuda" : "cpu", r);

      group->devices[r] = gmlp_device_new_from_string (spec, &error);
      g_assert_no_error (error);
    }
  group->uid = gmlp_communicator_new_unique_id (group->devices[0], &error);
  if (group->uid == NULL && cuda)
    {
      g_assert_error (error, GMLP_ERROR, GMLP_ERROR_UNSUPPORTED);
      g_test_skip (error->message);
      for (r = 0; r < world; r++)
        g_clear_object (&group->devices[r]);
      return FALSE;
    }
  g_assert_no_error (error);
  return TRUE;
}

void
gmlp_test_group_clear (GmlpTestGroup *group)
{
  int r;

  for (r = 0; r < group->world; r++)
    g_clear_object (&group->devices[r]);
  g_clear_pointer (&group->uid, g_bytes_unref);
}

void
gmlp_test_group_run (GmlpTestGroup    *group,
                     GmlpTestRankFunc  func,
                     gpointer          data)
{
  GThread *threads[GMLP_TEST_MAX_WORLD];
  RankArg args[GMLP_TEST_MAX_WORLD];
  int r;

  group->func = func;
  group->data = data;
  for (r = 0; r < group->world; r++)
    {
      args[r] = (RankArg) { group, r };
      threads[r] = g_thread_new ("rank", rank_thread, &args[r]);
    }
  for (r = 0; r < group->world; r++)
    g_thread_join (threads[r]);
}
