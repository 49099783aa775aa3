/* kernel-timeline: every kernel's, memcpy's and memset's start and end on
 * the device, for any CUDA program, through CUPTI's activity records: the
 * GPU host has no Nsight Systems. Build here, carry, run there:
 *
 *   gcc -O2 -shared -fPIC -I/usr/local/cuda/include -o .run/kt.so scripts/dev/kernel-timeline.c \
 *       -L/usr/local/cuda/lib64 -lcupti
 *   CUDA_INJECTION64_PATH=$PWD/.run/kt.so KT_OUT=$OUT/kt.txt PROGRAM ...
 *   python3 scripts/dev/kernel-timeline-summary.py $OUT/kt.txt
 *
 * One line per record: "K start end stream gridX gridY gridZ name",
 * "C start end stream bytes kind" or "S start end stream bytes" (ns).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *out;

static void CUPTIAPI
buffer_requested (uint8_t **buffer, size_t *size, size_t *max_records)
{
  *size = 8 << 20;
  *buffer = aligned_alloc (8, *size);
  *max_records = 0;
}

static void CUPTIAPI
buffer_completed (CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
  CUpti_Activity *record = NULL;

  while (cuptiActivityGetNextRecord (buffer, valid, &record) == CUPTI_SUCCESS)
    {
      switch (record->kind)
        {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL:
          {
            CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *) record;
            fprintf (out, "K %llu %llu %u %d %d %d %.80s\n", (unsigned long long) k->start,
                     (unsigned long long) k->end, k->streamId, k->gridX, k->gridY, k->gridZ, k->name);
            break;
          }
        case CUPTI_ACTIVITY_KIND_MEMCPY:
          {
            CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *) record;
            fprintf (out, "C %llu %llu %u %llu %d\n", (unsigned long long) m->start, (unsigned long long) m->end,
                     m->streamId, (unsigned long long) m->bytes, m->copyKind);
            break;
          }
        case CUPTI_ACTIVITY_KIND_MEMSET:
          {
            CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *) record;
            fprintf (out, "S %llu %llu %u %llu\n", (unsigned long long) m->start, (unsigned long long) m->end,
                     m->streamId, (unsigned long long) m->bytes);
            break;
          }
        default:
          break;
        }
    }
  free (buffer);
}

static void
at_exit (void)
{
  cuptiActivityFlushAll (1);
  fflush (out);
}

int
InitializeInjection (void)
{
  const char *path = getenv ("KT_OUT");

  out = fopen (path ? path : "/tmp/kt.txt", "w");
  cuptiActivityRegisterCallbacks (buffer_requested, buffer_completed);
  cuptiActivityEnable (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable (CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable (CUPTI_ACTIVITY_KIND_MEMSET);
  atexit (at_exit);
  return 1;
}
