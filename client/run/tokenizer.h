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

/* The same, with a vocabulary's special tokens (ChatML's <|im_start|>, ...)
 * recognised in the text; for llama2.c vocabularies it is tqr_tok_encode. */
long tqr_tok_encode_special(const tqr_tok *t, const char *text, size_t len, int bos, int eos,
			    int *tokens, tqr_error *err);

/* GGUF vocabularies (tok_gguf.c).  tokenizer.ggml.model "gpt2": byte-level
 * BPE (bpe.h) with the file's pre-tokenizer, merges, token types and BOS /
 * EOS ids; "llama" (sentencepiece-style, llama2.c's family) is refused by
 * name for now.  `path` is the model file; its vocabulary must hold exactly
 * vocab_size tokens.  A GGUF tokenizer takes the same calls as a
 * tokenizer.bin one: tqr_tok_encode adds BOS only when the file's
 * add_bos_token says so (SmolLM2: no), never a dummy-prefix space, and
 * decodes without the prefix rule. */
int tqr_tok_from_gguf(tqr_tok **out, const char *path, int vocab_size, tqr_error *err);
/* The byte-level BPE of an open GGUF file (test_bpe uses it alone). */
struct tqr_bpe;
struct tqr_gguf;
int tqr_bpe_from_gguf(struct tqr_bpe **out, const struct tqr_gguf *g, int vocab_size, tqr_error *err);
/* Takes b (freed with the tokenizer, or here on failure). */
int tqr_tok_wrap_bpe(tqr_tok **out, struct tqr_bpe *b, int bos_id, int eos_id, int add_bos, tqr_error *err);
/* BOS / EOS ids (llama2.c: 1 / 2), whether encode's bos flag adds one, and
 * whether id is a control token (BOS, EOS, ChatML's markers). */
int tqr_tok_bos(const tqr_tok *t);
int tqr_tok_eos(const tqr_tok *t);
int tqr_tok_adds_bos(const tqr_tok *t);
int tqr_tok_is_control(const tqr_tok *t, int id);

/* The raw vocabulary entry (no byte or prefix handling) and its score. */
const char *tqr_tok_str(const tqr_tok *t, int id, size_t *n);
float tqr_tok_score(const tqr_tok *t, int id);
/* The id of an exact vocabulary string, or -1. */
int tqr_tok_lookup(const tqr_tok *t, const char *s, size_t n);

#endif /* TQR_TOKENIZER_H */
