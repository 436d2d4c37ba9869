/* tokenizer.h — llama2.c's tokenizer.bin: a sentencepiece-style BPE vocabulary
 * with merge scores.
 *
 * File format (little-endian): int32 max_token_length, then for each of the
 * model's vocab_size tokens: float32 score, int32 len, len bytes (no NUL).
 * Token 0 is <unk>, 1 is BOS <s>, 2 is EOS </s>; byte-fallback tokens are
 * spelled "<0xXX>".  Every byte of the file is untrusted: the loader checks
 * lengths against max_token_length and the file size, the scores for
 * finiteness, and that the file holds exactly vocab_size tokens (a
 * tokenizer built for another model is a mismatch, not a silent misread).
 *
 * A tqr_tok is immutable after loading and may be shared between threads.
 */
#ifndef TQR_TOKENIZER_H
#define TQR_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "tqr_util.h"

#define TQR_TOK_UNK 0
#define TQR_TOK_BOS 1
#define TQR_TOK_EOS 2
#define TQR_TOK_LEN_MAX 4096 /* upper bound of max_token_length we accept */

typedef struct tqr_tok tqr_tok;

/* Loads `path`, which must hold exactly `vocab_size` tokens (>= 3).
 * -ENOENT/-EACCES/-EIO (open/read), -EINVAL (malformed or mismatched), -ENOMEM. */
int tqr_tok_load(tqr_tok **out, const char *path, int vocab_size, tqr_error *err);
void tqr_tok_free(tqr_tok *t);

int tqr_tok_vocab_size(const tqr_tok *t);

/* Encodes text[0..len) (any bytes, NUL included) the way llama2.c does: an
 * optional BOS, a dummy-prefix " " when the text is not empty, one token per
 * UTF-8 code point (byte-fallback tokens for code points not in the
 * vocabulary), then greedy BPE merges — always the pair whose merged token
 * has the highest score, the leftmost among equal scores.  The merges run
 * on a heap over a linked list (O(n log n)); tests compare them against the
 * quadratic algorithm.
 * tokens: room for len + 3 ids.  Returns the number of tokens written, or
 * -EILSEQ (a byte with no byte-fallback token), -ENOMEM. */
long tqr_tok_encode(const tqr_tok *t, const char *text, size_t len, int bos, int eos,
		    int *tokens, tqr_error *err);

/* The bytes token `id` stands for when it follows `prev`: "<0xXX>" decodes to
 * that byte, and the leading space of a token right after BOS is dropped
 * (sentencepiece's dummy prefix).  *n receives the length; the bytes stay
 * valid while t lives.  -EINVAL for an id out of range. */
int tqr_tok_decode(const tqr_tok *t, int prev, int id, const char **piece, size_t *n);

/* The raw vocabulary entry (no byte or prefix handling) and its score. */
const char *tqr_tok_str(const tqr_tok *t, int id, size_t *n);
float tqr_tok_score(const tqr_tok *t, int id);
/* The id of an exact vocabulary string, or -1. */
int tqr_tok_lookup(const tqr_tok *t, const char *s, size_t n);

#endif /* TQR_TOKENIZER_H */
