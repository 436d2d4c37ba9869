/* fuzz.h — the fuzz targets' one entry point (libFuzzer's).
 *
 * Each tests/fuzz/fuzz_*.c defines LLVMFuzzerTestOneInput for one parser of
 * untrusted bytes; it must return 0 and never crash, leak or read out of
 * bounds, whatever the input.  Two builds:
 *   make fuzz [FUZZ_SECONDS=60]   clang -fsanitize=fuzzer,address, a timed run
 *                                 per target from its seeds (build/fuzz/)
 *   build/tests/fuzz_*            the same targets linked with runner.c, which
 *                                 replays seed files and deterministic
 *                                 mutations of them (tests/integration/fuzz.sh,
 *                                 in `make test`)
 */
#ifndef TQ_FUZZ_H
#define TQ_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The bytes as a file the loaders can open by path (a memfd): the path is
 * written into `path`; returns the fd to close, or -1. */
int fuzz_as_file(const uint8_t *data, size_t size, char *path, size_t pathlen);

#endif
