/* The mixture-of-experts block (blocks.h): the router as catalog ops
 * (linear, softmax in f32, topk, the renormalisation, a cast), then one
 * experts op, so eager and compiled forwards and every device take the
 * same road. */
#include "core/error.h"
#include "models/blocks.h"

#define IN_(...) ((const hr_tensor *const[]){__VA_ARGS__})

/* The activation `name` [b, s, n] of dtype dt. */
static hr_status act_of(hr_fwd *f, const char *name, hr_dtype dt, int64_t n, hr_tensor **out) {
    return hr_scratch_get(f->sc, f->m->dev, name, dt, 3, (int64_t[]){f->b, f->s, n}, out);
}

static hr_status run1(hr_op op, const void *attrs, const hr_tensor *const *in, int n_in, hr_tensor *out) {
    hr_tensor *o[1] = {out};
    return hr_op_run(op, attrs, in, n_in, o, 1);
}

hr_status hr_build_experts(hr_fwd *f, const hr_moe_weights *w, const hr_moe_opts *o, const hr_tensor *h,
                           const hr_tensor *wts, const hr_tensor *topi, hr_tensor *out) {
    const hr_model *m = f->m;
    /* the forward's batch-invariant steps (hubrt serve --deterministic) take the rows one at a time */
    hr_attrs_experts ea = {.act = o->act, .per_expert = m->experts_per_expert, .impl = m->experts_impl,
                           .limit = o->limit, .alpha = o->alpha, .batch_invariant = f->kv[HR_LAYER_FULL].exact};
    hr_tensor *local = NULL;
    if (m->tp.ep) {
        /* this rank's experts [e0, e0 + n): the router's indices shifted to
         * them, another rank's slots outside [0, n), which add nothing */
        hr_tensor *e0 = NULL;
        HR_TRY(hr_scratch_get(f->sc, m->dev, "top_i_local", topi->dtype, topi->ndim, topi->shape, &local));
        HR_TRY(hr_tensor_scalar(m->dev, topi->dtype, (double)m->tp.experts0, &e0));
        hr_status s = run1(HR_OP_sub, NULL, IN_(topi, e0), 2, local);
        hr_tensor_free(e0);
        HR_TRY(s);
        topi = local;
    }
    if (w->gate_up_bias)
        HR_TRY(run1(HR_OP_experts, &ea, IN_(h, wts, topi, w->gate_up, w->down, w->gate_up_bias, w->down_bias), 7, out));
    else
        HR_TRY(run1(HR_OP_experts, &ea, IN_(h, wts, topi, w->gate_up, w->down), 5, out));
    if (!m->tp.ep) return HR_OK;
    /* every token's outputs from every rank's experts */
    hr_attrs_cast c = {.dtype = out->dtype};
    return run1(HR_OP_all_reduce, &c, IN_(out), 1, out);
}

hr_status hr_build_softmax_topk(hr_fwd *f, const hr_tensor *logits, bool norm, hr_tensor **topv,
                                hr_tensor *topi) {
    const hr_model *m = f->m;
    int64_t e = m->cfg.n_experts, k = m->cfg.n_experts_per_tok;
    hr_tensor *lf = NULL, *probs = NULL, *sum = NULL;
    if (m->dtype != HR_F32) {
        HR_TRY(act_of(f, "router_f32", HR_F32, e, &lf));
        HR_TRY(run1(HR_OP_cast, &(hr_attrs_cast){.dtype = HR_F32}, IN_(logits), 1, lf));
    }
    HR_TRY(act_of(f, "router_p", HR_F32, e, &probs));
    HR_TRY(run1(HR_OP_softmax, &(hr_attrs_dim){.dim = -1}, IN_(lf ? lf : logits), 1, probs));
    HR_TRY(act_of(f, "top_w", HR_F32, k, topv));
    hr_attrs_topk ta = {.k = k, .dim = -1, .largest = true, .sorted = true};
    hr_tensor *outs[2] = {*topv, topi};
    HR_TRY(hr_op_run(HR_OP_topk, &ta, IN_(probs), 1, outs, 2));
    if (!norm) return HR_OK;
    HR_TRY(act_of(f, "top_sum", HR_F32, 1, &sum));
    HR_TRY(run1(HR_OP_sum, &(hr_attrs_reduce){.dim = -1, .keepdim = true}, IN_(*topv), 1, sum));
    return run1(HR_OP_div, NULL, IN_(*topv, sum), 2, *topv);
}

hr_status hr_build_moe(hr_fwd *f, const hr_moe_weights *w, const hr_moe_opts *o, const hr_tensor *h, hr_tensor *out) {
    const hr_model *m = f->m;
    int64_t e = m->cfg.n_experts, k = m->cfg.n_experts_per_tok;
    hr_dtype dt = m->dtype;
    hr_tensor *logits = NULL, *topv = NULL, *topi = NULL, *wt = NULL;
    HR_TRY(act_of(f, "router", dt, e, &logits));
    if (w->router_bias)
        HR_TRY(run1(HR_OP_linear, NULL, IN_(h, w->router, w->router_bias), 3, logits));
    else
        HR_TRY(run1(HR_OP_linear, NULL, IN_(h, w->router), 2, logits));
    hr_attrs_topk ta = {.k = k, .dim = -1, .largest = true, .sorted = true};
    HR_TRY(hr_scratch_get(f->sc, m->dev, "top_i", HR_I64, 3, (int64_t[]){f->b, f->s, k}, &topi));
    if (o->router == HR_ROUTER_TOPK_SOFTMAX) {
        /* gpt-oss: top-k of the logits, softmax over them in the model dtype */
        hr_tensor *outs[2] = {NULL, topi};
        HR_TRY(act_of(f, "top_logit", dt, k, &outs[0]));
        HR_TRY(hr_op_run(HR_OP_topk, &ta, IN_(logits), 1, outs, 2));
        HR_TRY(act_of(f, "top_w_dt", dt, k, &wt));
        HR_TRY(run1(HR_OP_softmax, &(hr_attrs_dim){.dim = -1}, IN_(outs[0]), 1, wt));
        return hr_build_experts(f, w, o, h, wt, topi, out);
    }
    /* Qwen3-MoE: softmax(dtype=float) over every expert, then top-k */
    HR_TRY(hr_build_softmax_topk(f, logits, o->norm_topk, &topv, topi));
    if (dt != HR_F32) {
        HR_TRY(act_of(f, "top_w_dt", dt, k, &wt));
        HR_TRY(run1(HR_OP_cast, &(hr_attrs_cast){.dtype = dt}, IN_(topv), 1, wt));
    }
    return hr_build_experts(f, w, o, h, wt ? wt : topv, topi, out);
}
