/* fuzz_tokenizer — tqkv-run's tokenizer.bin loader (client/run/tokenizer.c):
 * any bytes load or fail with a message; a loaded vocabulary then encodes
 * and decodes text without reading out of bounds. */
#include <stdlib.h>
#include <unistd.h>

#include "fuzz.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char text[] = "Once upon a time, \xc3\xa9t\xc3\xa9 \xff\xfe 42!";
	char path[64];
	int fd = fuzz_as_file(data, size, path, sizeof(path)), toks[sizeof(text) + 3];
	tqr_tok *t = NULL;
	tqr_error err;

	if (fd < 0)
		return 0;
	/* a small vocabulary keeps each input cheap */
	if (tqr_tok_load(&t, path, 32, &err) == 0) {
		long n = tqr_tok_encode(t, text, sizeof(text) - 1, 1, 1, toks, &err);
		for (long i = 0; i < n; i++) {
			const char *piece;
			size_t len;
			if (tqr_tok_decode(t, i ? toks[i - 1] : 1, toks[i], &piece, &len) < 0)
				abort(); /* encode produced an id decode refuses */
		}
		tqr_tok_free(t);
	}
	close(fd);
	return 0;
}
