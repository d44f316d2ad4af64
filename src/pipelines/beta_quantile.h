/* The Beta(a, b) distribution's CDF (the regularized incomplete beta
 * function) and its inverse, in double precision. */
#ifndef HR_PIPELINES_BETA_QUANTILE_H
#define HR_PIPELINES_BETA_QUANTILE_H

double hr_beta_cdf(double x, double a, double b);
/* x with hr_beta_cdf(x, a, b) = p; 0 for p <= 0, 1 for p >= 1. */
double hr_beta_quantile(double p, double a, double b);

#endif
