/* fuzz_spillhdr — a spilled page as the disk hands it back (daemon/spill.c,
 * spill_hdr_check: magic, format, header size, layout id, payload size,
 * crc32c over header and payload, then session, layer, page index and
 * generation against what the reader expects).  Proves, for any bytes: no
 * crash or read beyond the header and payload; a refusal always says why;
 * an accepted page has every field as spill_hdr_seal writes it and names
 * exactly the page expected; and one flipped bit anywhere in an accepted
 * page (header or payload) makes it fail.
 *
 * Input: [0] bit 0: seal the header first (spill_hdr_seal, so the checks
 * after the crc's are reached), bits 1-4: which of session, layer, page,
 * generation the reader expects one off; [1..2] the bit to flip, modulo
 * the page's bits; then the 80-byte header and the payload (the rest). */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "spill.h"
#include "tq_page.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const size_t hb = sizeof(struct spill_page_hdr);
	struct spill_page_hdr h, e;
	uint8_t *page;
	uint32_t pb;
	char why[512] = "";

	if (size < 3 + hb || size - 3 - hb > (1u << 20))
		return 0;
	pb = (uint32_t)(size - 3 - hb);
	/* header and payload in one exact-size buffer: ASan sees any overread */
	if (!(page = malloc(hb + pb)))
		return 0;
	memcpy(page, data + 3, hb + pb);
	memcpy(&h, page, hb);
	if (data[0] & 1) {
		spill_hdr_seal(&h, page + hb, pb);
		memcpy(page, &h, hb);
	}
	e = h;
	e.session_id ^= (data[0] >> 1) & 1;
	e.layer ^= (data[0] >> 2) & 1;
	e.page_index ^= (data[0] >> 3) & 1;
	e.generation ^= (data[0] >> 4) & 1;
	if (spill_hdr_check(page, page + hb, pb, &e, why, sizeof(why)) < 0) {
		if (!why[0])
			abort();
		free(page);
		return 0;
	}
	if (h.magic != SPILL_MAGIC || h.format != SPILL_FORMAT || h.hdr_bytes != SPILL_HDR_BYTES ||
	    h.layout_id != TQ_PAGE_LAYOUT_ID || h.payload_bytes != pb || h.session_id != e.session_id ||
	    h.layer != e.layer || h.page_index != e.page_index || h.generation != e.generation)
		abort();
	struct spill_page_hdr s = h;
	spill_hdr_seal(&s, page + hb, pb);
	if (memcmp(&s, &h, hb))
		abort(); /* what passes is what the writer seals */
	size_t bit = ((size_t)data[1] | (size_t)data[2] << 8) % ((hb + pb) * 8);
	page[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	if (spill_hdr_check(page, page + hb, pb, &e, why, sizeof(why)) == 0)
		abort(); /* crc32c catches every single-bit error */
	free(page);
	return 0;
}
