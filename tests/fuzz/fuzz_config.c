/* fuzz_config — the config file parser (daemon/config.c via libinih): any
 * bytes either load into a configuration that validates, or fail with
 * file:line messages; never a crash. */
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct config *c = malloc(sizeof(*c));
	char *text = malloc(size + 1);
	char err[CONFIG_ERR_MAX];

	if (!c || !text)
		goto out;
	memcpy(text, data, size);
	text[size] = '\0';
	if (config_load_string(c, "fuzz.conf", text, err, sizeof(err)) == 0) {
		if (config_validate(c, err, sizeof(err)) != 0)
			abort(); /* a loaded config must be valid */
	} else if (!err[0]) {
		abort(); /* a failure always says why */
	}
out:
	free(c);
	free(text);
	return 0;
}
