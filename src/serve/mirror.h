/* The engine's model and cache calls, mirrored on every rank of a split
 * model (tensor or expert parallel): rank 0's engine sends each call (a
 * command and its arrays) to the other ranks before it makes it, and
 * their follower loop (hr_mirror_follow) makes the same call on caches of
 * their own, so that every collective of a step meets its partners. Only
 * rank 0 serves HTTP and samples. */
#ifndef HR_SERVE_MIRROR_H
#define HR_SERVE_MIRROR_H

#include "hubrt/model.h"

typedef enum hr_mirror_op {
    HR_MIR_STOP = 0,
    HR_MIR_STEP,    /* hr_model_step on a cache */
    HR_MIR_SHIFT,   /* hr_kv_cache_shift(cache, a) */
    HR_MIR_RESET,   /* hr_kv_cache_reset(cache) */
    HR_MIR_COPY,    /* hr_kv_cache_copy(cache, a, b, cache c, d, e, f) */
    HR_MIR_SET_LEN, /* hr_kv_cache_set_len(cache, a) */
} hr_mirror_op;

/* Which cache: the batch's, the prefill scratch, or the batch's first b
 * rows (HR_MIR_ROWS + b). */
enum { HR_MIR_KV = 0, HR_MIR_SCRATCH = 1, HR_MIR_ROWS = 2 };

typedef struct hr_mirror_cmd {
    int64_t op, cache;
    int64_t a, b, c, d, e, f;
    /* HR_MIR_STEP: the step's arrays ([batch seq], [batch seq], [batch
     * mask_cols] or NULL) and flags */
    int64_t batch, seq, mask_cols;
    bool compiled, batch_invariant;
    const int64_t *ids, *pos, *mask;
} hr_mirror_cmd;

/* The caches a command names, and the model it steps. */
typedef struct hr_mirror_caches {
    hr_model *m;
    hr_kv_cache *kv, *scratch;
    hr_kv_cache **rows; /* [B + 1], made on first use */
    int64_t B;
} hr_mirror_caches;

/* Makes the call c on cs (a step's logits into *logits). */
hr_status hr_mirror_apply(hr_mirror_caches *cs, const hr_mirror_cmd *c, hr_tensor **logits);
/* Sends c to the other ranks (rank 0; nothing in a group of one). */
hr_status hr_mirror_send(const hr_mirror_cmd *c);
/* A follower rank: caches of B rows of C cells, then every command rank 0
 * sends, until HR_MIR_STOP; waiting for the next one has no deadline and
 * sleeps (an idle server sends none). A command that fails here ends every rank: the
 * ranks no longer hold the same caches. */
hr_status hr_mirror_follow(hr_model *m, int64_t B, int64_t C);

#endif
