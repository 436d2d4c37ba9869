/* bpe.h — GPT-2 style byte-level BPE (GGUF tokenizer.ggml.model "gpt2"),
 * built from plain arrays: the vocabulary, its token types and the merges,
 * as a GGUF file (tokenizer.ggml.tokens, .token_type, .merges) holds them.
 *
 * Encoding, the way Hugging Face `tokenizers` and llama.cpp do it:
 *   1. special tokens: with parse_special, control (and unknown) tokens are
 *      cut out of the text as whole strings, leftmost first and the longest
 *      at a position; user-defined tokens always are (llama.cpp's
 *      parse_special; HF's added tokens);
 *   2. pre-tokenization of each stretch between them (bpe.c says how):
 *        "gpt2"    GPT-2's regex  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
 *                  ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *        "smollm"  every \p{N} code point on its own first (HF's
 *                  Digits(individual_digits=True)), then GPT-2's regex
 *   3. each pre-token's bytes start as one symbol per byte (the byte's
 *      GPT-2 byte-to-unicode character, a token of the vocabulary), then
 *      the adjacent pair of lowest merge rank is merged, leftmost first,
 *      until no pair has a merge.
 * Input is arbitrary bytes: an invalid UTF-8 byte is one code point of class
 * "other" to the pre-tokenizer (like U+FFFD) and stays itself in BPE, so
 * decode(encode(s)) == s for every byte string — except for bytes whose
 * byte character is not in the vocabulary (SmolLM2 lacks 0x04 0x06 0x13
 * 0x14 0x16 0x1D 0xC0 0xC1 0xF1 0xF2 0xF5..0xFF): those are dropped, as HF
 * (a BPE without unk_token) and llama.cpp do, and the symbols on either side
 * become neighbours (HF merges across the gap).
 *
 * Token types (GGUF / llama.cpp): 1 normal, 2 unknown, 3 control,
 * 4 user-defined, 5 unused, 6 byte.  Normal and byte tokens are byte-level
 * text (decoded through the byte-to-unicode map; byte tokens are treated
 * as normal ones), the others literal text.  Only normal and byte tokens
 * take part in BPE; unused tokens are never produced.
 *
 * A tqr_bpe is immutable after tqr_bpe_new and may be shared between threads.
 */
#ifndef TQR_BPE_H
#define TQR_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "tqr_util.h"

enum tqr_bpe_type {
	TQR_BPE_NORMAL = 1,
	TQR_BPE_UNKNOWN = 2,
	TQR_BPE_CONTROL = 3,
	TQR_BPE_USER = 4,
	TQR_BPE_UNUSED = 5,
	TQR_BPE_BYTE = 6,
};

#define TQR_BPE_TOKENS_MAX (1 << 24) /* vocabulary sizes we accept */
#define TQR_BPE_TOKEN_LEN_MAX 1024   /* bytes of one vocabulary string */

typedef struct tqr_bpe tqr_bpe;

/* Builds a tokenizer from n_tokens vocabulary strings (tokens[i] of
 * token_lens[i] bytes, not NUL-terminated, any bytes), their types
 * (token_types[i], enum tqr_bpe_type; NULL: all normal) and n_merges merge
 * rules, rank = index, each "left right" (split at the first space after
 * its first byte, as llama.cpp does).  `pre` names the pre-tokenizer (GGUF
 * tokenizer.ggml.pre): "gpt2" or "smollm".  Nothing is kept of the arrays.
 * Every entry is checked: lengths, types, duplicate strings, normal tokens
 * that are not byte-level text, merges without a space, whose parts or
 * result are not in the vocabulary, or that repeat; err names the first bad
 * index.  -EINVAL (bad arrays, unknown pre), -ENOMEM. */
int tqr_bpe_new(tqr_bpe **out, const char *const *tokens, const size_t *token_lens,
		const int32_t *token_types, int n_tokens, const char *const *merges,
		const size_t *merge_lens, int n_merges, const char *pre, tqr_error *err);
void tqr_bpe_free(tqr_bpe *b);

int tqr_bpe_n_tokens(const tqr_bpe *b);

/* Encodes text[0..len) (any bytes) into ids[0..cap).  No BOS or EOS is
 * added (SmolLM2: add_bos_token false); parse_special as above.  At most
 * len ids come out, so cap >= len always suffices.  Returns the number of
 * ids, or -ENOBUFS (more than cap), -ENOMEM. */
long tqr_bpe_encode(const tqr_bpe *b, const char *text, size_t len, int parse_special,
		    int32_t *ids, size_t cap, tqr_error *err);

/* The bytes token `id` stands for: normal and byte tokens through the
 * byte-to-unicode map, user-defined tokens verbatim, control and unknown
 * tokens verbatim when `special` and as nothing otherwise (llama.cpp's
 * token_to_piece), unused tokens as nothing.  *piece stays valid while b
 * lives.  -EINVAL for an id out of range. */
int tqr_bpe_decode(const tqr_bpe *b, int32_t id, int special, const char **piece, size_t *n);

/* The raw vocabulary string of id (byte-level text for normal tokens) and
 * its type; NULL / -EINVAL out of range. */
const char *tqr_bpe_token(const tqr_bpe *b, int32_t id, size_t *n);
int tqr_bpe_type(const tqr_bpe *b, int32_t id);
/* The id of an exact raw vocabulary string, or -1. */
int32_t tqr_bpe_lookup(const tqr_bpe *b, const char *s, size_t n);

#endif /* TQR_BPE_H */
