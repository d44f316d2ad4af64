/* The CPU's fusion passes over a built plan (plan_passes.h): decode-sized
 * linears with their consumers, and elementwise chains. Every group is
 * made of consecutive running nodes, so no node moves across another:
 * what changes is that one thread-pool pass does the work of several, and
 * intermediates that nothing reads again are never stored. The captured
 * node list stays as it is (what the disk cache stores and the structure
 * hash covers): a group is a substitution the plan runs instead, so a
 * plan loaded from disk is fused again by the same passes. */
#include "backends/cpu/plan_passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "backends/cpu/k_fused.h"

static const hr_tensor *t_in(const hr_plan *p, const hr_plan_node *n, int k) {
    return &p->tensors[n->first_tensor + k];
}

static hr_tensor *t_out(const hr_plan *p, const hr_plan_node *n, int k) {
    return &p->tensors[n->first_tensor + n->n_in + k];
}

static int value_of(const hr_plan *p, const hr_tensor *t) { return hr_plan_value_index(p, t); }

static bool runs(const hr_plan_node *n) { return hr_plan_node_live(n) && !n->absorbed && !n->subst; }

static int next_running(const hr_plan *p, int i) {
    for (i++; i < p->n_nodes && !runs(&p->nodes[i]); i++) continue;
    return i;
}

static bool same_shape(const hr_tensor *a, const hr_tensor *b) {
    return a->dtype == b->dtype && a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

static bool same_layout(const hr_tensor *a, const hr_tensor *b) {
    return same_shape(a, b) && a->buf == b->buf && a->offset == b->offset &&
           !memcmp(a->strides, b->strides, sizeof(int64_t) * (size_t)a->ndim);
}

/* True when nothing reads the bytes t covers after node `after`: the next
 * running node that touches t's value overwrites exactly t's region, or
 * none does and the value is a temporary of the call. */
static bool dead_after(const hr_plan *p, const hr_tensor *t, int after) {
    int v = value_of(p, t);
    if (p->values[v].kind != HR_VALUE_TEMP) return false;
    for (int i = after + 1; i < p->n_nodes; i++) {
        const hr_plan_node *n = &p->nodes[i];
        if (!hr_plan_node_live(n)) continue;
        for (int k = 0; k < n->n_in; k++)
            if (value_of(p, t_in(p, n, k)) == v) return false;
        for (int k = 0; k < n->n_out; k++)
            if (value_of(p, t_out(p, n, k)) == v) return same_layout(t_out(p, n, k), t);
    }
    return true;
}

/* A linear the fused kernel can run; its bias, if any, is [n]. */
static bool fusable_linear(const hr_plan *p, const hr_plan_node *n) {
    if (n->op != HR_OP_linear || !runs(n)) return false;
    const hr_tensor *w = t_in(p, n, 1), *out = t_out(p, n, 0);
    if (!hr_fused_linear_fits(t_in(p, n, 0), w, n->n_in == 3 ? t_in(p, n, 2) : NULL, out)) return false;
    return value_of(p, out) != value_of(p, t_in(p, n, 0));
}

static bool rows_like(const hr_tensor *t, const hr_tensor *like) {
    int64_t r, rs;
    return same_shape(t, like) && hr_fused_rows(t, &r, &rs);
}

/* silu_mul(out0, out1) at node k, both products dead after it. */
static bool gated_epilogue(const hr_plan *p, const hr_plan_node *k, int ki, const hr_tensor *o0, const hr_tensor *o1) {
    if (k->op != HR_OP_silu_mul || !same_layout(t_in(p, k, 0), o0) || !same_layout(t_in(p, k, 1), o1)) return false;
    return rows_like(t_out(p, k, 0), o0) && dead_after(p, o0, ki) && dead_after(p, o1, ki);
}

/* add(y, r) or add(r, y) at node k, y dead after it; the sum may overwrite
 * r only element for element. Returns r, or NULL. */
static const hr_tensor *residual_epilogue(const hr_plan *p, const hr_plan_node *k, int ki, const hr_tensor *y) {
    if (k->op != HR_OP_add) return NULL;
    int yi = same_layout(t_in(p, k, 0), y) ? 0 : same_layout(t_in(p, k, 1), y) ? 1 : -1;
    if (yi < 0) return NULL;
    const hr_tensor *r = t_in(p, k, 1 - yi), *z = t_out(p, k, 0);
    if (!rows_like(r, y) || !rows_like(z, y) || value_of(p, r) == value_of(p, y)) return NULL;
    if (value_of(p, z) == value_of(p, r) && !same_layout(z, r)) return NULL;
    return dead_after(p, y, ki) ? r : NULL;
}

static hr_status run_fused_linear(void *ctx) { return hr_cpu_fused_linear(ctx); }
static hr_status run_chain(void *ctx) { return hr_cpu_fused_chain(ctx); }

static void add_in(hr_plan_subst *sub, const hr_tensor *t) {
    if (t) sub->in[sub->n_in++] = t;
}

static void add_out(hr_plan_subst *sub, const hr_tensor *t) {
    if (t) sub->out[sub->n_out++] = t;
}

/* A copy of the kernel's description for the plan to own. */
static void *own(const void *p, size_t n) {
    void *c = malloc(n);
    if (c) memcpy(c, p, n);
    return c;
}

/* Node i heads a group: gathers the linears after it that read the same
 * rows, then an epilogue; records the fused node when it saves an op. */
static hr_status fuse_from(hr_plan *p, int i) {
    const hr_plan_node *head = &p->nodes[i];
    const hr_tensor *x = t_in(p, head, 0);
    int members[HR_FUSED_MAX_LINEARS] = {i}, n = 1, next = next_running(p, i);
    while (n < HR_FUSED_MAX_LINEARS && next < p->n_nodes && fusable_linear(p, &p->nodes[next]) &&
           same_layout(t_in(p, &p->nodes[next], 0), x)) {
        int v = value_of(p, t_out(p, &p->nodes[next], 0)), clash = 0;
        for (int m = 0; m < n; m++) clash |= value_of(p, t_out(p, &p->nodes[members[m]], 0)) == v;
        if (clash) break;
        members[n++] = next;
        next = next_running(p, next);
    }
    hr_fused_linear k = {.epi = HR_FUSED_STORE, .n = n, .x = x};
    for (int m = 0; m < n; m++) {
        const hr_plan_node *mn = &p->nodes[members[m]];
        k.w[m] = t_in(p, mn, 1);
        k.b[m] = mn->n_in == 3 ? t_in(p, mn, 2) : NULL;
        k.out[m] = t_out(p, mn, 0);
    }
    int epi_node = -1;
    if (next < p->n_nodes && n == 2 && gated_epilogue(p, &p->nodes[next], next, k.out[0], k.out[1])) {
        k.epi = HR_FUSED_GATED;
        k.out[0] = t_out(p, &p->nodes[next], 0);
        k.out[1] = NULL;
        epi_node = next;
    } else if (next < p->n_nodes && n == 1 && (k.res = residual_epilogue(p, &p->nodes[next], next, k.out[0]))) {
        k.epi = HR_FUSED_RESIDUAL;
        k.out[0] = t_out(p, &p->nodes[next], 0);
        epi_node = next;
    }
    if (n == 1 && epi_node < 0) return HR_OK;
    hr_plan_subst sub = {.kind = "fused_linear", .run = run_fused_linear, .ctx = own(&k, sizeof k)};
    if (!sub.ctx) return hr_error(HR_ERR_OOM, "plan: out of memory fusing");
    add_in(&sub, k.x);
    add_in(&sub, k.res);
    for (int m = 0; m < n; m++) {
        add_in(&sub, k.w[m]);
        add_in(&sub, k.b[m]);
        add_out(&sub, k.out[m]);
    }
    int absorbed[HR_FUSED_MAX_LINEARS + 1], n_abs = 0;
    for (int m = 1; m < n; m++) absorbed[n_abs++] = members[m];
    if (epi_node >= 0) absorbed[n_abs++] = epi_node;
    return hr_plan_substitute(p, i, &sub, absorbed, n_abs);
}

hr_status hr_cpu_plan_fuse(hr_plan *p) {
    for (int i = 0; i < p->n_nodes; i++)
        if (fusable_linear(p, &p->nodes[i])) HR_TRY(fuse_from(p, i));
    return HR_OK;
}

/* ---- elementwise chains ------------------------------------------------------ */

static bool float_dtype(hr_dtype dt) { return dt == HR_F32 || dt == HR_BF16 || dt == HR_F16; }

/* The chain step for node n, when it is an eltwise op or a cast on float
 * tensors (the chain kernel runs the unfused kernel's arithmetic, split
 * as that kernel split it). Sets every field but operand and acc_right. */
static bool chain_step_of(const hr_plan *p, const hr_plan_node *n, hr_chain_step *s) {
    static const struct {
        hr_op op;
        hr_ew_op step;
    } map[] = {
        {HR_OP_add, HR_EW_ADD},       {HR_OP_sub, HR_EW_SUB},         {HR_OP_mul, HR_EW_MUL},
        {HR_OP_div, HR_EW_DIV},       {HR_OP_pow, HR_EW_POW},         {HR_OP_maximum, HR_EW_MAX},
        {HR_OP_minimum, HR_EW_MIN},   {HR_OP_neg, HR_EW_NEG},         {HR_OP_abs, HR_EW_ABS},
        {HR_OP_relu, HR_EW_RELU},     {HR_OP_sqrt, HR_EW_SQRT},       {HR_OP_rsqrt, HR_EW_RSQRT},
        {HR_OP_scale, HR_EW_SCALE},   {HR_OP_clamp, HR_EW_CLAMP},     {HR_OP_exp, HR_EW_EXP},
        {HR_OP_log, HR_EW_LOG},       {HR_OP_sigmoid, HR_EW_SIGMOID}, {HR_OP_tanh, HR_EW_TANH},
        {HR_OP_silu, HR_EW_SILU},     {HR_OP_gelu, HR_EW_GELU},       {HR_OP_silu_mul, HR_EW_SILU_MUL},
        {HR_OP_gelu_mul, HR_EW_GELU_MUL}, {HR_OP_cast, HR_EW_ADD}, /* a cast's op goes unused */
    };
    int m = 0, nm = (int)(sizeof map / sizeof map[0]);
    while (m < nm && map[m].op != n->op) m++;
    if (m == nm || !runs(n) || n->n_out != 1 || !float_dtype(t_out(p, n, 0)->dtype)) return false;
    for (int k = 0; k < n->n_in; k++)
        if (!float_dtype(t_in(p, n, k)->dtype)) return false;
    *s = (hr_chain_step){.op = map[m].step, .cast = n->op == HR_OP_cast, .operand = -1,
                         .round = t_out(p, n, 0)->dtype};
    if (n->op == HR_OP_scale) {
        const hr_attrs_scale *a = (const void *)n->attrs;
        s->p0 = (float)a->mul;
        s->p1 = (float)a->add;
    } else if (n->op == HR_OP_clamp) {
        const hr_attrs_clamp *a = (const void *)n->attrs;
        s->p0 = a->has_min ? (float)a->min : -INFINITY;
        s->p1 = a->has_max ? (float)a->max : INFINITY;
    } else if (n->op == HR_OP_gelu || n->op == HR_OP_gelu_mul) {
        const hr_attrs_gelu *a = (const void *)n->attrs;
        if (a->approximate == HR_GELU_TANH) s->op = n->op == HR_OP_gelu ? HR_EW_GELU_TANH : HR_EW_GELU_TANH_MUL;
    }
    return true;
}

/* The operand slot of t in the chain, added when new; -1 when full. */
static int chain_operand(hr_fused_chain *c, const hr_tensor *t) {
    for (int k = 0; k < c->n_operands; k++)
        if (same_layout(c->operands[k], t)) return k;
    if (c->n_operands == HR_FUSED_MAX_OPERANDS) return -1;
    c->operands[c->n_operands] = t;
    return c->n_operands++;
}

/* Whether out may be written block by block while the chain still reads
 * its operands: it shares no value with one, or covers it element for
 * element. */
static bool chain_out_safe(const hr_plan *p, const hr_fused_chain *c, const hr_tensor *out) {
    for (int k = 0; k < c->n_operands; k++)
        if (value_of(p, c->operands[k]) == value_of(p, out) && !same_layout(c->operands[k], out)) return false;
    return true;
}

/* Extends the chain ending in `cur` (written by the running node before
 * node j) with node j: j reads cur as it was written, writes its shape,
 * and cur is dead after j. */
static bool chain_extend(const hr_plan *p, hr_fused_chain *c, const hr_tensor *cur, int j) {
    const hr_plan_node *n = &p->nodes[j];
    hr_chain_step s;
    if (c->n_steps == HR_FUSED_MAX_STEPS || !chain_step_of(p, n, &s)) return false;
    const hr_tensor *out = t_out(p, n, 0);
    if (out->ndim != cur->ndim || memcmp(out->shape, cur->shape, sizeof(int64_t) * (size_t)cur->ndim)) return false;
    int at = -1;
    for (int k = 0; k < n->n_in; k++) {
        if (value_of(p, t_in(p, n, k)) != value_of(p, cur)) continue;
        if (!same_layout(t_in(p, n, k), cur)) return false;
        if (at < 0) at = k;
    }
    if (at < 0) return false;
    /* cur is never stored: nothing may read it later, unless j writes
     * over exactly its bytes (an in-place op), which later reads see. */
    if (value_of(p, cur) == value_of(p, out) ? !same_layout(out, cur) : !dead_after(p, cur, j)) return false;
    hr_fused_chain next = *c;
    if (n->n_in == 2) {
        const hr_tensor *other = t_in(p, n, 1 - at);
        s.acc_right = at == 1;
        s.operand = value_of(p, other) == value_of(p, cur) ? -1 : chain_operand(&next, other);
        if (value_of(p, other) != value_of(p, cur) && s.operand < 0) return false;
    }
    next.steps[next.n_steps++] = s;
    next.out = (hr_tensor *)out;
    if (!chain_out_safe(p, &next, out)) return false;
    *c = next;
    return true;
}

/* The node that runs next after i, fused or not. */
static int next_live(const hr_plan *p, int i) {
    for (i++; i < p->n_nodes && (!hr_plan_node_live(&p->nodes[i]) || p->nodes[i].absorbed); i++) continue;
    return i;
}

static hr_status chain_from(hr_plan *p, int i) {
    const hr_plan_node *head = &p->nodes[i];
    hr_chain_step s;
    if (!chain_step_of(p, head, &s)) return HR_OK;
    hr_fused_chain c = {.n_steps = 1, .n_operands = 1, .operands = {t_in(p, head, 0)}, .out = t_out(p, head, 0)};
    if (head->n_in == 2)
        s.operand = same_layout(t_in(p, head, 1), t_in(p, head, 0)) ? -1 : chain_operand(&c, t_in(p, head, 1));
    c.steps[0] = s;
    if (!chain_out_safe(p, &c, c.out)) return HR_OK;
    int members = 1, last = i;
    for (int j = next_live(p, i); j < p->n_nodes && chain_extend(p, &c, c.out, j); j = next_live(p, j)) {
        members++;
        last = j;
    }
    if (members < 2) return HR_OK;
    /* the chain reads each block of its operands before it writes that
     * block of its output */
    hr_plan_subst sub = {.kind = "chain", .run = run_chain, .ctx = own(&c, sizeof c), .inplace_ok = true};
    if (!sub.ctx) return hr_error(HR_ERR_OOM, "plan: out of memory fusing");
    for (int k = 0; k < c.n_operands; k++) add_in(&sub, c.operands[k]);
    add_out(&sub, c.out);
    int absorbed[HR_FUSED_MAX_STEPS], n_abs = 0;
    for (int j = next_live(p, i); j <= last; j = next_live(p, j)) absorbed[n_abs++] = j;
    return hr_plan_substitute(p, i, &sub, absorbed, n_abs);
}

hr_status hr_cpu_plan_fuse_chains(hr_plan *p) {
    for (int i = 0; i < p->n_nodes; i++)
        if (runs(&p->nodes[i])) HR_TRY(chain_from(p, i));
    return HR_OK;
}
