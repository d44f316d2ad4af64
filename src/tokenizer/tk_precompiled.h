/* SentencePiece's precompiled_charsmap normalizer (tk_precompiled.c). */
#ifndef HR_TOKENIZER_TK_PRECOMPILED_H
#define HR_TOKENIZER_TK_PRECOMPILED_H

#include "tokenizer/tk_internal.h"

typedef struct tk_charsmap tk_charsmap;

/* Parses the base64 charsmap of a "Precompiled" normalizer. */
hr_status tk_charsmap_parse(const char *base64, tk_charsmap **out);
void tk_charsmap_free(tk_charsmap *m);
/* Appends the normalized s[0..n) to out (and alignments when al_out). */
hr_status tk_charsmap_normalize(const tk_charsmap *m, const char *s, const tk_align *al, size_t n, tk_buf *out,
                                tk_aligns *al_out);

#endif
