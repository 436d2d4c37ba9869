/* fuzz_hello — the data socket's handshake (daemon/ring.c): the hello a
 * client sends on data.sock (ring_hello_check) and the checks on the memfd
 * passed with it (ring_memfd_check: file type, size, seals).  Proves, for
 * any bytes: no crash; a refusal always says why; an accepted hello has
 * magic and major version right, flags and reserved words zero, queue
 * sizes that are powers of two within the ABI's bounds, an arena of 1 byte
 * to 4 GiB, and a layout (the one the daemon maps) whose header, SQ, CQ
 * and page-aligned arena lie in order, without overlap, inside
 * total_bytes, which is what the client declared; an accepted memfd is a
 * regular file of exactly total_bytes sealed against shrinking and growing.
 *
 * Input: 16 bytes of what came with the message, then the message itself
 * (whatever its length: only 64 bytes is a hello):
 *   [0] bits 0-2: fds passed, bit 3: control data cut (MSG_CTRUNC),
 *       bits 4-5: the fd's type (regular, directory, fifo, socket)
 *   [1] seals (bit 7: F_GET_SEALS failed)   [2] bit 0: the fd's size is
 *       [8..15] (le64) rather than the hello's total_bytes */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "ring.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint32_t modes[4] = { S_IFREG | 0600, S_IFDIR | 0700, S_IFIFO | 0600, S_IFSOCK | 0600 };
	struct tqkv_hello h;
	struct tqkv_ring_layout lay;
	char why[160] = "";
	uint64_t fsize;
	int seals, r;

	if (size < 16)
		return 0;
	memset(&h, 0, sizeof(h));
	memcpy(&h, data + 16, size - 16 < sizeof(h) ? size - 16 : sizeof(h));
	r = ring_hello_check(&h, size - 16, data[0] & 7, (data[0] & 8) != 0, &lay, why, sizeof(why));
	if (r < 0) {
		if (!why[0])
			abort();
		return 0;
	}
	if (size - 16 != sizeof(h) || (data[0] & 7) > 1 || (data[0] & 8))
		abort();
	if (h.magic != TQKV_RING_MAGIC || h.version >> 16 != TQKV_RING_VERSION_MAJOR || h.flags ||
	    h.reserved[0] || h.reserved[1] || h.reserved[2])
		abort();
	if (!tqkv_is_pow2(h.sq_entries) || h.sq_entries > TQKV_SQ_ENTRIES_MAX || !tqkv_is_pow2(h.cq_entries) ||
	    h.cq_entries > TQKV_CQ_ENTRIES_MAX || h.cq_entries < h.sq_entries || h.arena_bytes == 0 ||
	    h.arena_bytes > TQKV_ARENA_BYTES_MAX)
		abort();
	if (lay.sq_off < TQKV_RING_HDR_BYTES || lay.sq_off + (uint64_t)h.sq_entries * sizeof(struct tqkv_sqe) > lay.cq_off ||
	    lay.cq_off + (uint64_t)h.cq_entries * sizeof(struct tqkv_cqe) > lay.arena_off ||
	    lay.arena_off % TQKV_RING_ALIGN || lay.arena_off + h.arena_bytes > lay.total_bytes ||
	    lay.total_bytes != h.total_bytes)
		abort();

	/* the memfd that came with it */
	seals = data[1] & 0x80 ? -1 : 0;
	if (!(data[1] & 0x80)) {
		static const int bits[5] = { F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_WRITE, F_SEAL_FUTURE_WRITE };
		for (int i = 0; i < 5; i++)
			if (data[1] & (1u << i))
				seals |= bits[i];
	}
	fsize = h.total_bytes;
	if (data[2] & 1)
		memcpy(&fsize, data + 8, 8);
	why[0] = '\0';
	r = ring_memfd_check(modes[(data[0] >> 4) & 3], fsize, seals, h.total_bytes, why, sizeof(why));
	if (r < 0) {
		if (!why[0])
			abort();
		return 0;
	}
	if (((data[0] >> 4) & 3) != 0 || seals < 0 || !(seals & F_SEAL_SHRINK) || !(seals & F_SEAL_GROW) ||
	    fsize != h.total_bytes)
		abort();
	return 0;
}
