/* fuzz_bpe — the byte-level BPE encoder (client/run/bpe.c) on arbitrary
 * bytes, with a small built-in vocabulary (no model file): every byte's
 * character, a few merges, control and user-defined tokens.  The first
 * input byte's low bit turns special-token parsing on.  Every byte has a
 * token here, so decode(encode(s)) must give s back exactly, and encode
 * must never write more ids than bytes. */
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "fuzz.h"

static const char *const merges[] = {
	"Ġ t", "h e", "i n", "Ġt he", "Ġ a", "e r", "Ġ Ġ", "ĠĠ ĠĠ", "1 2", "Ã ©", "' s", "Ċ Ċ",
	"ð Ł", "ðŁ ĺ", "a a", "aa aa", "aaaa aaaa",
};

static tqr_bpe *vocab(void)
{
	static tqr_bpe *b;
	static const char *const extra[] = { "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool>" };
	static const int32_t extra_type[] = { TQR_BPE_CONTROL, TQR_BPE_CONTROL, TQR_BPE_CONTROL, TQR_BPE_USER };
	enum { N_MERGE = sizeof(merges) / sizeof(merges[0]), N_MAX = 256 + 4 + N_MERGE };
	static char store[N_MAX][48];
	const char *tok[N_MAX], *mg[N_MERGE];
	size_t tok_len[N_MAX], mg_len[N_MERGE];
	int32_t type[N_MAX];
	int n = 0;

	if (b)
		return b;
	for (int c = 0, k = 0; c < 256; c++) {
		/* GPT-2's byte-to-unicode character, UTF-8 */
		int cp = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE ? c : 256 + k++;
		if (cp < 0x80) {
			store[n][0] = (char)cp;
			tok_len[n] = 1;
		} else {
			store[n][0] = (char)(0xC0 | cp >> 6);
			store[n][1] = (char)(0x80 | (cp & 0x3F));
			tok_len[n] = 2;
		}
		tok[n] = store[n];
		type[n++] = TQR_BPE_NORMAL;
	}
	for (int i = 0; i < 4; i++) {
		tok[n] = extra[i];
		tok_len[n] = strlen(extra[i]);
		type[n++] = extra_type[i];
	}
	for (int i = 0; i < N_MERGE; i++) {
		const char *sp = strchr(merges[i], ' ');
		size_t l = (size_t)(sp - merges[i]);
		mg[i] = merges[i];
		mg_len[i] = strlen(merges[i]);
		memcpy(store[n], merges[i], l);
		strcpy(store[n] + l, sp + 1);
		tok[n] = store[n];
		tok_len[n] = strlen(store[n]);
		type[n++] = TQR_BPE_NORMAL;
	}
	if (tqr_bpe_new(&b, tok, tok_len, type, n, mg, mg_len, N_MERGE, "smollm", NULL) < 0)
		abort();
	return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const tqr_bpe *b = vocab();
	int32_t *ids;
	char *back;
	size_t o = 0;
	long n;

	if (!size)
		return 0;
	ids = malloc(sizeof(int32_t) * size);
	back = malloc(size);
	if (!ids || !back)
		abort();
	n = tqr_bpe_encode(b, (const char *)data + 1, size - 1, data[0] & 1, ids, size - 1, NULL);
	if (n < 0 || (size_t)n > size - 1)
		abort();
	for (long i = 0; i < n; i++) {
		const char *p;
		size_t k;
		if (tqr_bpe_decode(b, ids[i], 1, &p, &k) < 0 || o + k > size - 1)
			abort();
		memcpy(back + o, p, k);
		o += k;
	}
	if (o != size - 1 || memcmp(back, data + 1, o))
		abort(); /* the bytes did not come back */
	free(ids);
	free(back);
	return 0;
}
