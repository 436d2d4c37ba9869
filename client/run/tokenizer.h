/* tokenizer.h — sentencepiece-style BPE vocabularies with merge scores
 * (llama2.c's tokenizer.bin, GGUF tokenizer.ggml.model "llama"), and the
 * handle over GGUF byte-level BPE ("gpt2", bpe.h).
 *
 * tokenizer.bin format (little-endian): int32 max_token_length, then for
 * each of the model's vocab_size tokens: float32 score, int32 len, len bytes
 * (no NUL).  Token 0 is <unk>, 1 is BOS <s>, 2 is EOS </s>; byte-fallback
 * tokens are spelled "<0xXX>"; spaces are ' '.  Every byte of the file is
 * untrusted: the loader checks lengths against max_token_length and the
 * file size, the scores for finiteness, and that the file holds exactly
 * vocab_size tokens (a tokenizer built for another model is a mismatch,
 * not a silent misread).
 *
 * Both sentencepiece-style sources share one constructor and one encoder
 * (tokenizer.c): the text with a dummy-prefix space, split into UTF-8 code
 * points, then greedy merges — always the adjacent pair whose concatenated
 * text is a token of the highest score, the leftmost among equal scores —
 * on a heap over a linked list (O(n log n)); tests compare it with the
 * quadratic algorithm.  Where llama2.c and sentencepiece / llama.cpp
 * differ, a tokenizer.bin follows llama2.c and a GGUF vocabulary follows
 * llama.cpp's SPM tokenizer (llama-vocab.cpp) and sentencepiece:
 *
 *                     tokenizer.bin (llama2.c)     GGUF "llama"
 *   space             ' ' in tokens and text       U+2581 "\xe2\x96\x81" in
 *                                                  tokens; text spaces become
 *                                                  it (a literal U+2581 in
 *                                                  the text is a space too)
 *   dummy prefix      " " on non-empty text        U+2581 on non-empty text,
 *                                                  when add_space_prefix
 *                                                  (default true)
 *   matching          any token                    normal and user-defined
 *                                                  tokens only (sentencepiece's
 *                                                  pieces; unused ones are
 *                                                  never produced)
 *   unknown code      its bytes' "<0xXX>" tokens   stays one symbol that may
 *   point             at once, which never merge   still merge by text; left
 *                                                  alone, its bytes' byte-typed
 *                                                  "<0xXX>" tokens, or the
 *                                                  unknown token when a byte
 *                                                  has none
 *   missing byte      -EILSEQ                      the unknown token (-EILSEQ
 *   token                                          without one)
 *   code point split  a byte and up to 3           the continuation bytes the
 *                     continuation bytes           lead byte announces (same
 *                                                  on valid UTF-8)
 *   BOS               1, always added on request   bos_token_id (default 1),
 *                                                  added on request when
 *                                                  add_bos_token (default
 *                                                  true)
 *   decode            "<0xXX>" -> the byte; a      normal tokens with U+2581
 *                     token after BOS loses its    -> ' ', byte tokens -> the
 *                     leading space                byte, control / unknown /
 *                                                  unused -> nothing; a normal
 *                                                  token at the start (prev <
 *                                                  0) or after a control token
 *                                                  loses its leading space
 *                                                  (when add_space_prefix)
 * Ties are the leftmost pair in both, as in llama2.c, llama.cpp and
 * sentencepiece (Hugging Face's converted BPE ranks tied merges by the
 * merged token's id instead; real vocabularies have no tied scores).
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

/* Encodes text[0..len) (any bytes, NUL included) as the table above says:
 * an optional BOS, a dummy prefix when the text is not empty, one symbol
 * per UTF-8 code point, greedy merges, byte fallback; an optional EOS.
 * tokens: room for len + 3 ids.  Returns the number of tokens written, or
 * -EILSEQ (a byte with no byte-fallback token), -ENOMEM. */
long tqr_tok_encode(const tqr_tok *t, const char *text, size_t len, int bos, int eos,
		    int *tokens, tqr_error *err);

/* The bytes token `id` stands for when it follows `prev` (-1: the first
 * token of a text), as the table above says.  *n receives the length; the
 * bytes stay valid while t lives.  -EINVAL for an id out of range. */
int tqr_tok_decode(const tqr_tok *t, int prev, int id, const char **piece, size_t *n);

/* The same, with a vocabulary's special tokens (ChatML's <|im_start|>, ...)
 * recognised in the text.  For the sentencepiece-style vocabularies it is
 * tqr_tok_encode for now: "<s>" in the text stays text (llama.cpp's
 * parse_special would make it a token and put a prefix space after it). */
long tqr_tok_encode_special(const tqr_tok *t, const char *text, size_t len, int bos, int eos,
			    int *tokens, tqr_error *err);

/* GGUF vocabularies (tok_gguf.c).  tokenizer.ggml.model "gpt2": byte-level
 * BPE (bpe.h) with the file's pre-tokenizer, merges, token types and BOS /
 * EOS ids; "llama": the sentencepiece-style vocabulary above, from
 * tokenizer.ggml.tokens, .scores, .token_type, .bos_token_id,
 * .eos_token_id, .unknown_token_id, .add_bos_token and .add_space_prefix
 * (tqr_tok_new_spm).  `path` is the model file; its vocabulary must hold
 * exactly vocab_size tokens.  A GGUF tokenizer takes the same calls as a
 * tokenizer.bin one: tqr_tok_encode adds BOS only when the file's
 * add_bos_token says so (SmolLM2: no; llama: yes unless the file says no);
 * a gpt2 vocabulary adds no dummy-prefix space and decodes without the
 * prefix rule. */
int tqr_tok_from_gguf(tqr_tok **out, const char *path, int vocab_size, tqr_error *err);
/* The byte-level BPE of an open GGUF file (test_bpe uses it alone). */
struct tqr_bpe;
struct tqr_gguf;
int tqr_bpe_from_gguf(struct tqr_bpe **out, const struct tqr_gguf *g, int vocab_size, tqr_error *err);
/* The tqr_tok of an open GGUF file's metadata, any model ("gpt2" or
 * "llama"); tqr_tok_from_gguf opens the file and calls it. */
int tqr_tok_from_gguf_meta(tqr_tok **out, const struct tqr_gguf *g, int vocab_size, tqr_error *err);

/* A sentencepiece-style vocabulary from memory (GGUF "llama"): n tokens
 * (tokens[i] of lens[i] bytes, any bytes, spaces spelled U+2581), their
 * scores and their GGUF types (enum tqr_bpe_type: 1 normal, 2 unknown,
 * 3 control, 4 user-defined, 5 unused, 6 byte).  Checked: n in [1,
 * TQR_BPE_TOKENS_MAX], lengths <= TQR_TOK_LEN_MAX, finite scores, types in
 * 1..6, byte tokens spelled "<0xXX>", no two normal / user-defined / byte
 * tokens spelled alike, a normal U+2581 token (the space: every
 * sentencepiece vocabulary has one), ids in range (-1: none), add_bos only
 * with a BOS.  Nothing is kept of the arrays.  -EINVAL, -ENOMEM. */
struct tqr_spm_spec {
	int bos_id, eos_id, unk_id; /* -1: none                        */
	int add_bos;                /* encode's bos flag adds BOS       */
	int add_space_prefix;       /* the dummy prefix                 */
};
int tqr_tok_new_spm(tqr_tok **out, const char *const *tokens, const size_t *lens, const float *scores,
		    const int32_t *types, int n, const struct tqr_spm_spec *spec, tqr_error *err);

/* Takes b (freed with the tokenizer, or here on failure). */
int tqr_tok_wrap_bpe(tqr_tok **out, struct tqr_bpe *b, int bos_id, int eos_id, int add_bos, tqr_error *err);
/* BOS / EOS ids (llama2.c: 1 / 2), whether encode's bos flag adds one, and
 * whether id is a control token (llama2.c: BOS, EOS; GGUF: type 3, e.g.
 * ChatML's markers). */
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
