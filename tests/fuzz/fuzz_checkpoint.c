/* fuzz_checkpoint — tqkv-run's llama2.c checkpoint loader (client/run/model.c):
 * any bytes load or fail with a message; a loaded model's configuration is
 * consistent. */
#include <stdlib.h>
#include <unistd.h>

#include "fuzz.h"
#include "model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[64];
	int fd = fuzz_as_file(data, size, path, sizeof(path));
	tqr_model *m = NULL;
	tqr_error err;

	if (fd < 0)
		return 0;
	if (tqr_model_load(&m, path, &err) == 0) {
		const struct tqr_config *c = tqr_model_config(m);
		if (c->dim <= 0 || c->n_heads <= 0 || c->dim % c->n_heads || c->n_kv_heads <= 0 ||
		    c->n_heads % c->n_kv_heads || c->vocab_size <= 0 || c->seq_len <= 0)
			abort();
		tqr_model_free(m);
	}
	close(fd);
	return 0;
}
