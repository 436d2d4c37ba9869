/* devsim.h — a device-memory tier simulated on the CPU, for testing the
 * daemon's GPU-tier plumbing (backend.h's optional operations) where
 * there is no GPU.
 *
 * The region the pool hands out is mapped PROT_NONE, like device memory is
 * to the CPU: host code that touches a page without going through the
 * backend (copy, append, attend) faults at once.  The bytes live in a second
 * mapping of the same memfd; the backend's operations translate page
 * pointers into it and run the CPU kernels there (tq_encode, tq_attend), so
 * results are the host tier's bits and every path the GPU tier takes —
 * kernels through the hooks, spill through staging copies, persistence
 * through pool_copy, client arenas registered — is exercised for real.
 * The real GPU kernels are tested by test_cuda (when a GPU is there).
 */
#ifndef TQKVD_TEST_DEVSIM_H
#define TQKVD_TEST_DEVSIM_H

#include <stdint.h>

#include "backend.h"

extern const struct backend_ops backend_devsim;

struct devsim_stats {
	uint64_t copies_to_dev, copies_from_dev, copy_bytes;
	uint64_t appends, attends;   /* append_attend counts in both, and in: */
	uint64_t append_attends;
	int64_t registered;          /* host_register minus host_unregister */
	uint64_t registers;
};
void devsim_stats(struct devsim_stats *out);
/* Make the nth copy from now on (1 = the next) fail with -EIO; 0: none. */
void devsim_fail_copy(uint64_t nth);
/* Make the nth attention from now on (1 = the next) fail with -EIO, as a
 * kernel's launch might; 0: none. */
void devsim_fail_attend(uint64_t nth);
/* 1: every host_register fails (-ENOMEM, as a memlock limit would); 0: none. */
void devsim_fail_register(int on);
/* The device fails for good, as a CUDA context lost to a sticky error
 * (tqc_device_lost): from now on lost() says why, and append, attend,
 * copy and host_register fail with -ENOTRECOVERABLE and that reason;
 * NULL: it works again (the next test's pool). */
void devsim_lose(const char *why);

#endif
