/* gmlp-tuning-private.h: forcing the backends' choices, for tests and benchmarks
 *
 * Which kernel or library runs a product, and the Hopper kernel's schedule,
 * are chosen by heuristics from the product and the device. A device's
 * tuning forces some of those choices one way, so that tests reach every
 * route and schedule with small problems and benchmarks compare them. It is
 * not API (nothing here is exported from libgmlp.so, nor in the GIR): the
 * tests and gmlp-bench link the static library. No environment variable
 * sets it; a test suite reads its own (GMLP_TEST_TUNING, tests/meson.build)
 * and calls gmlp_device_apply_tuning().
 *
 * Every key takes "auto", the heuristics' choice and what a device opens
 * with, or one of its forced values (GmlpBackendTuning in
 * backend/gmlp-backend.h says what each does on the CUDA backend):
 *
 *   host-gemm         cublas, sm90      host sizes: the vendor libraries,
 *                                       or libgmlp's Hopper kernel
 *   device-gemm       portable          device sizes: the portable kernel
 *   loop-streams      1                 cuBLAS's loop on one stream
 *   row-tiles         off               no row tiles in cuBLAS's grouped path
 *   batched           off               no batched cuBLAS call
 *   sm90-schedule     plan              no direct schedule
 *   sm90-fp8-tiles    128, 192          the FP8 output tiles' width
 *   sm90-short-tiles  off, all
 *   sm90-pairs        off, on           paired CTAs
 *   sm90-even-waves   off, on
 *   sm90-stream-k     off, on           the tail split
 *   sm90-grid         an even N >= 2    at most N CTAs
 *   block-cache       off               no freed block kept for reuse
 *                                       (GMLP_DEBUG=no-block-cache: a
 *                                       device opens with it)
 *
 * A backend ignores the keys it has no such choice for (the CPU all).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "gmlp-device.h"
#include "backend/gmlp-backend.h"

G_BEGIN_DECLS

/* Sets @key of @tuning from @value; GMLP_ERROR_INVALID_ARGUMENT, @tuning
 * untouched, for an unknown key or a value it does not take. */
gboolean     gmlp_tuning_set          (GmlpBackendTuning        *tuning,
                                       const char               *key,
                                       const char               *value,
                                       GError                  **error);
/* @key's value in @tuning, as gmlp_tuning_set() takes it; NULL with
 * GMLP_ERROR_INVALID_ARGUMENT for an unknown key. */
char        *gmlp_tuning_get          (const GmlpBackendTuning  *tuning,
                                       const char               *key,
                                       GError                  **error);
/* Applies "key=value,key=value…" (spaces around the items ignored; "" or
 * NULL: nothing) in order; on an error @tuning is untouched. */
gboolean     gmlp_tuning_parse        (GmlpBackendTuning        *tuning,
                                       const char               *spec,
                                       GError                  **error);
/* The keys, NULL-terminated. */
const char * const *gmlp_tuning_list_keys (void);

/* The same on a device's tuning, which from then on steers the products it
 * enqueues (those already enqueued keep theirs). */
gboolean     gmlp_device_set_tuning   (GmlpDevice               *device,
                                       const char               *key,
                                       const char               *value,
                                       GError                  **error);
char        *gmlp_device_get_tuning   (GmlpDevice               *device,
                                       const char               *key,
                                       GError                  **error);
gboolean     gmlp_device_apply_tuning (GmlpDevice               *device,
                                       const char               *spec,
                                       GError                  **error);

G_END_DECLS
