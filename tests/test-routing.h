/* test-routing.h: what the parts of test-routing share
 *
 * The reference map of a routing, routings and tensors made for the tests,
 * and tensors in the permuted layout read back against the map
 * (test-routing-reference.c), and one routing's steps checked against
 * their references (test-routing-check.c). The tests are in
 * test-routing.c (the numbers, threads), test-routing-errors.c (bad input
 * to the routing and to the backends' entries) and test-routing-64-bit.c
 * (past 2^31 elements, on a GPU); see test-routing.c for the references'
 * definition.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <locale.h>
#include <math.h>
#include <string.h>

#include "gmlp-test-util.h"
#include "gmlp-test-router-ref.h"
/* Host views over tensors with device sizes; the routing's map. */
#include "gmlp-device-private.h"
#include "gmlp-grouped-tensor-private.h"
#include "gmlp-routing-private.h"

static const GmlpDType float_dtypes[] = {
  GMLP_DTYPE_FLOAT32, GMLP_DTYPE_FLOAT16, GMLP_DTYPE_BFLOAT16,
};

GmlpGroupedTensor *upload (GmlpDevice    *device,
                           GmlpDType      dtype,
                           gconstpointer  data,
                           gint64         rows,
                           gint64         cols);
float *random_probs (gint64 n);
gint64 *random_indices (gint64 T,
                        guint  k,
                        guint  E);
GmlpRouting *make_routing (GmlpDevice          *device,
                           const gint64        *idx,
                           const float         *probs,
                           gint64               T,
                           guint                k,
                           guint                E,
                           GmlpGroupedTensor  **indices_out,
                           GmlpGroupedTensor  **probs_out);

/* The map as documented, computed expert by expert (not in the library's
 * one pass): slots of each choice, choices of each slot, padded sizes. */
typedef struct {
  gint64  T;
  guint   k, E;
  gint64  padding, expert_capacity, row_capacity, total;
  gint64 *sizes;
  gint64 *slot_of;    /* T × k, -1: no row */
  gint64 *choice_of;  /* total, -1: padding */
} RefMap;

void ref_map_free (RefMap *m);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (RefMap, ref_map_free)

RefMap *ref_map_new (const gint64 *idx,
                     gint64        T,
                     guint         k,
                     guint         E,
                     guint         padding,
                     double        capacity_factor);
double *download_permuted (GmlpGroupedTensor *t,
                           const RefMap      *m);
void assert_map (GmlpRouting  *routing,
                 const RefMap *m);
GmlpGroupedTensor *random_permuted_full (GmlpGroupedTensor  *like,
                                         GmlpDType           dtype,
                                         gint64              cols,
                                         guint64             seed,
                                         gboolean            oom);
GmlpGroupedTensor *random_permuted (GmlpGroupedTensor *like,
                                    GmlpDType          dtype,
                                    gint64             cols,
                                    guint64            seed);

/* test-routing-check.c */
void check_routing (GmlpDevice   *device,
                    const gint64 *idx,
                    gint64        T,
                    guint         k,
                    guint         E,
                    gint64        H,
                    guint         padding,
                    double        capacity_factor,
                    GmlpDType     dtype,
                    GmlpDType     y_dtype);

/* test-routing-errors.c */
void test_bad_input (void);
void test_backend_checks (void);

/* test-routing-64-bit.c */
void test_64_bit (void);
