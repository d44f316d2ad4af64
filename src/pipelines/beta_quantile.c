/* Quantiles of the Beta(a, b) distribution, for the beta sigma schedule
 * (diffusers takes them from scipy.stats.beta.ppf). The regularized
 * incomplete beta function I_x(a, b) comes from its continued fraction
 * (modified Lentz), on the side of x where it converges fast; the quantile
 * is found by bisection, which always converges, refined to the last bits
 * by Newton steps on the density. Relative accuracy ~1e-14: far below the
 * f32 rounding the schedule ends in. */
#include "pipelines/beta_quantile.h"

#include <math.h>

/* The continued fraction of I_x(a, b) / (x^a (1-x)^b / (a B(a, b))). */
static double beta_cf(double a, double b, double x) {
    const double tiny = 1e-300, eps = 1e-16;
    double qab = a + b, qap = a + 1, qam = a - 1;
    double c = 1, d = 1 - qab * x / qap;
    if (fabs(d) < tiny) d = tiny;
    d = 1 / d;
    double h = d;
    for (int m = 1; m <= 1000; m++) {
        int m2 = 2 * m;
        double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1 + aa * d;
        if (fabs(d) < tiny) d = tiny;
        c = 1 + aa / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1 / d;
        h *= d * c;
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1 + aa * d;
        if (fabs(d) < tiny) d = tiny;
        c = 1 + aa / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < eps) break;
    }
    return h;
}

static double log_beta(double a, double b) { return lgamma(a) + lgamma(b) - lgamma(a + b); }

double hr_beta_cdf(double x, double a, double b) {
    if (x <= 0) return 0;
    if (x >= 1) return 1;
    double front = exp(a * log(x) + b * log1p(-x) - log_beta(a, b));
    if (x < (a + 1) / (a + b + 2)) return front * beta_cf(a, b, x) / a;
    return 1 - front * beta_cf(b, a, 1 - x) / b;
}

double hr_beta_quantile(double p, double a, double b) {
    if (!(p > 0)) return 0;
    if (!(p < 1)) return 1;
    double lo = 0, hi = 1, x = 0.5;
    for (int i = 0; i < 200 && hi - lo > 1e-15; i++) {
        x = 0.5 * (lo + hi);
        if (hr_beta_cdf(x, a, b) < p)
            lo = x;
        else
            hi = x;
    }
    x = 0.5 * (lo + hi);
    double lb = log_beta(a, b);
    for (int i = 0; i < 3; i++) { /* Newton on the density, kept inside the bracket */
        double pdf = exp((a - 1) * log(x) + (b - 1) * log1p(-x) - lb);
        if (!(pdf > 0) || !isfinite(pdf)) break;
        double next = x - (hr_beta_cdf(x, a, b) - p) / pdf;
        if (!(next > lo && next < hi)) break;
        x = next;
    }
    return x;
}
