/* runner.c — replay inputs through a fuzz target without libFuzzer.
 *
 *   fuzz_X FILE|DIR ...   every file as is, then 64 deterministic mutations
 *                         of each (truncations, byte flips, insertions)
 * Exit 0 when every input was handled (a crash or a sanitizer report is the
 * failure).  Prints how many inputs ran. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static unsigned long runs;

static void mutate_and_run(const uint8_t *data, size_t size, uint32_t seed)
{
	uint8_t *buf = malloc(size + 16);

	if (!buf)
		return;
	for (int m = 0; m < 64; m++) {
		size_t n = size;
		memcpy(buf, data, size);
		seed = seed * 1664525u + 1013904223u;
		switch (m % 4) {
		case 0: /* truncate */
			n = size ? (seed >> 8) % size : 0;
			break;
		case 1: /* flip a few bytes */
			for (int k = 0; k < 1 + m % 5 && size; k++) {
				seed = seed * 1664525u + 1013904223u;
				buf[(seed >> 8) % size] ^= (uint8_t)(1u << (seed % 8));
			}
			break;
		case 2: /* overwrite a word with an extreme value */
			if (size >= 4) {
				static const uint32_t ext[] = { 0, 0xffffffffu, 0x7fffffffu, 0x80000000u, 0x7f800000u };
				size_t at = ((seed >> 8) % (size / 4)) * 4;
				memcpy(buf + at, &ext[seed % 5], 4);
			}
			break;
		default: /* insert bytes in the middle */
			if (size) {
				size_t at = (seed >> 8) % size;
				memmove(buf + at + 8, buf + at, size - at);
				memset(buf + at, (int)(seed & 0xff), 8);
				n = size + 8;
			}
			break;
		}
		LLVMFuzzerTestOneInput(buf, n);
		runs++;
	}
	free(buf);
}

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	uint8_t *data;

	if (!f || fstat(fileno(f), &st) < 0) {
		fprintf(stderr, "fuzz runner: cannot read %s\n", path);
		if (f)
			fclose(f);
		return -1;
	}
	data = malloc((size_t)st.st_size + 1);
	if (!data || fread(data, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
		fclose(f);
		free(data);
		return -1;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(data, (size_t)st.st_size);
	runs++;
	mutate_and_run(data, (size_t)st.st_size, (uint32_t)st.st_size);
	free(data);
	return 0;
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) < 0) {
			fprintf(stderr, "fuzz runner: %s: no such file\n", argv[i]);
			return 2;
		}
		if (S_ISDIR(st.st_mode)) {
			DIR *d = opendir(argv[i]);
			struct dirent *e;
			while (d && (e = readdir(d))) {
				char p[4096];
				if (e->d_name[0] == '.')
					continue;
				snprintf(p, sizeof(p), "%s/%s", argv[i], e->d_name);
				if (run_file(p) < 0)
					return 2;
			}
			if (d)
				closedir(d);
		} else if (run_file(argv[i]) < 0) {
			return 2;
		}
	}
	printf("%lu inputs ran\n", runs);
	return 0;
}
