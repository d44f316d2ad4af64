/* Cephes' expf constants: Cody-Waite reduction by ln 2 (split in a part
 * exact in f32 and the rest) and the degree-5 polynomial of exp(r) - 1 - r
 * over r^2. The eltwise exps (8 and 16 lanes) and the softmax exp all use
 * these, so that they agree lane for lane where their operations do. */
#ifndef HR_BACKENDS_CPU_EXP_POLY_H
#define HR_BACKENDS_CPU_EXP_POLY_H

#define HR_EXP_LOG2E 1.44269504088896341f
#define HR_EXP_LN2_HI 0.693359375f
#define HR_EXP_LN2_LO (-2.12194440e-4f)
#define HR_EXP_P0 1.9875691500e-4f
#define HR_EXP_P1 1.3981999507e-3f
#define HR_EXP_P2 8.3334519073e-3f
#define HR_EXP_P3 4.1665795894e-2f
#define HR_EXP_P4 1.6666665459e-1f
#define HR_EXP_P5 5.0000001201e-1f

#endif
