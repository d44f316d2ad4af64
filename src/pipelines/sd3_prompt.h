/* SD3's prompt encoding with its three text encoders (sd3_prompt.c). */
#ifndef HR_PIPELINES_SD3_PROMPT_H
#define HR_PIPELINES_SD3_PROMPT_H

#include "hubrt/diffusion.h"

typedef struct hr_sd3_prompts {
    const char *prompt, *prompt_2, *prompt_3; /* _2, _3 NULL: prompt */
    const char *negative_prompt, *negative_prompt_2, *negative_prompt_3; /* NULL: "" (and negative_prompt) */
    bool negative;               /* encode the negatives too (guidance) */
    int64_t max_sequence_length; /* T5's; 0: 256 */
    bool skip_t5;                /* zeros in its place, T5 not loaded */
} hr_sd3_prompts;

/* Loads dir's tokenizers and text encoders, encodes, frees them: out =
 * prompt_embeds [1, 77 + max_sequence_length, joint], pooled [1, pooled], and the
 * negatives' two when p->negative (else NULL), in dtype dt. */
hr_status hr_sd3_encode_prompts(const char *dir, const hr_component_options *opts, const hr_sd3_prompts *p,
                                int64_t joint, hr_dtype dt, hr_tensor *out[4]);

#endif
