/* The sums, minimum and maximum of a float32 block's features, for prepare's statistics.
 *
 * Part of the optional compiled kernel (_decode_rows.c holds the module; setup.py builds both
 * files into it). prep/stats/block.py calls it for a C-contiguous float32 block of n rows of
 * nf features, where numpy would run 7 reductions per cache-sized slab of rows: it makes the
 * same two passes over the block (sums, min and max; then the deviations from the mean rounded
 * to float32 and their squares), each value read once per pass, and adds in numpy's order, so
 * the results are the same bits:
 *
 *  - rows are taken `step` at a time; a slab of fewer than 16 rows is added row by row into
 *    the running sums, a longer one into a sum of its own (its first row, then each next row,
 *    as np.add.reduce(slab, axis=0, dtype=float64) adds along the row axis) that is then added
 *    to the running sums (_add_rows);
 *  - every value is widened to float64 before it is added; the deviation d = x - center and
 *    its square d * d are float32 operations, as np.subtract / np.multiply into a float32
 *    buffer (no fused multiply-add: a float32 product widened to float64 is not contracted).
 *
 * Minimum and maximum are exact whatever the order (no NaN reaches them: a NaN makes its
 * feature's sum NaN and the call returns 0, as numpy's path then hands the block on). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Each loop is built for AVX2 and AVX-512 too, picked at load time: wider vectors, the same
 * operations on each value (exact float adds, converts, min and max: the same bits). Only
 * with GCC on glibc (target_clones needs its ifunc): elsewhere one build, the same results. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && defined(__GLIBC__)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* `len` rows at x (`nf` values each, rows `ld` values apart): sums into acc (and, with lo/hi,
 * the minimum and maximum), in numpy's order: `direct`, row by row into acc (a slab of fewer
 * than 16 rows); else into t (the first row, then each next row added) and t into acc. With
 * center: the rows' deviations from it (float32) into acc and their squares into acc2 (t2 the
 * squares' slab sum). */
VECTOR_CLONES
static void slab_sums(const float *restrict x, Py_ssize_t len, Py_ssize_t nf, Py_ssize_t ld,
                      int direct, const float *restrict center, double *restrict acc,
                      double *restrict acc2, double *restrict t, double *restrict t2,
                      float *restrict lo, float *restrict hi) {
    for (Py_ssize_t i = 0; i < len; i++) {
        const float *row = x + i * ld;
        double *a = direct ? acc : t, *a2 = direct ? acc2 : t2;
        if (center == NULL && !direct && i == 0) {
            for (Py_ssize_t j = 0; j < nf; j++) {
                const float y = row[j];
                a[j] = (double)y;
                lo[j] = y < lo[j] ? y : lo[j];
                hi[j] = y > hi[j] ? y : hi[j];
            }
        } else if (center == NULL) {
            for (Py_ssize_t j = 0; j < nf; j++) {
                const float y = row[j];
                a[j] += (double)y;
                lo[j] = y < lo[j] ? y : lo[j];
                hi[j] = y > hi[j] ? y : hi[j];
            }
        } else if (!direct && i == 0) {
            for (Py_ssize_t j = 0; j < nf; j++) {
                const float d = row[j] - center[j];
                const float q = d * d;
                a[j] = (double)d;
                a2[j] = (double)q;
            }
        } else {
            for (Py_ssize_t j = 0; j < nf; j++) {
                const float d = row[j] - center[j];
                const float q = d * d;
                a[j] += (double)d;
                a2[j] += (double)q;
            }
        }
    }
    if (!direct) {
        for (Py_ssize_t j = 0; j < nf; j++)
            acc[j] += t[j];
        if (center != NULL)
            for (Py_ssize_t j = 0; j < nf; j++)
                acc2[j] += t2[j];
    }
}

/* One pass over the block: its slabs of `step` rows in order (slab_sums). Slabs of fewer than
 * 16 rows add every row straight into acc: then each feature's sums are the rows in order
 * whatever the slabs, and wide rows are taken TILE features at a time over all rows, so that
 * the sums stay in cache (a grid of 34,560 features: 0.8 MB of float64 sums and float32 bounds
 * for each row of 138 KB). */
#define TILE 2048
static int all_finite(const double *x, Py_ssize_t nf) {
    int finite = 1;
    for (Py_ssize_t j = 0; j < nf; j++)
        finite &= isfinite(x[j]) != 0;
    return finite;
}

/* ... returns the rows summed: n, or fewer where `check` stopped it after the first slab
 * whose sums are not all finite (a NaN: numpy's path stops there too, _CHECK_ROWS) */
static Py_ssize_t passes(const float *v, Py_ssize_t n, Py_ssize_t nf, Py_ssize_t step, int check,
                         const float *center, double *acc, double *acc2, double *t, double *t2,
                         float *lo, float *hi) {
    if (step < 16) {
        for (Py_ssize_t j = 0; j < nf; j += TILE) {
            const Py_ssize_t w = nf - j < TILE ? nf - j : TILE;
            slab_sums(v + j, n, w, nf, 1, center ? center + j : NULL, acc + j,
                      acc2 ? acc2 + j : NULL, t, t2, lo ? lo + j : NULL, hi ? hi + j : NULL);
        }
        return n;
    }
    for (Py_ssize_t r = 0; r < n; r += step) {
        const Py_ssize_t len = n - r < step ? n - r : step;
        slab_sums(v + r * nf, len, nf, nf, len < 16, center, acc, acc2, t, t2, lo, hi);
        if (check && !all_finite(acc, nf))
            return r + len;
    }
    return n;
}

/* stats_f32(v, n, nf, step, check, s1, sd, sq, mn, mx, scratch) -> 1, or minus the rows
 * summed where a sum is not finite
 *
 * v: float32[n * nf] (C order); s1, sd, sq: float64[nf], zeroed by the caller: the sums of the
 * values, of their deviations from the mean rounded to float32 and of the deviations'
 * squares; mn, mx: float32[nf]; scratch: 3 * nf float64. Where a feature's sum is not finite
 * (a NaN or an infinity) the first pass ends (with `check`, at the first slab where one is
 * not: its rows summed so far, negated, are returned; else after every row: -n), and sd and
 * sq are left as they are. */
PyObject *stats_f32(PyObject *self, PyObject *args) {
    unsigned long long v_a, s1_a, sd_a, sq_a, mn_a, mx_a, scratch_a;
    Py_ssize_t n, nf, step;
    int check;
    if (!PyArg_ParseTuple(args, "KnnnpKKKKKK", &v_a, &n, &nf, &step, &check, &s1_a, &sd_a,
                          &sq_a, &mn_a, &mx_a, &scratch_a))
        return NULL;
    if (n < 1 || nf < 1 || step < 1) {
        PyErr_SetString(PyExc_ValueError, "stats_f32: n, nf and step must be positive");
        return NULL;
    }
    const float *v = (const float *)(uintptr_t)v_a;
    double *s1 = (double *)(uintptr_t)s1_a, *sd = (double *)(uintptr_t)sd_a;
    double *sq = (double *)(uintptr_t)sq_a;
    float *mn = (float *)(uintptr_t)mn_a, *mx = (float *)(uintptr_t)mx_a;
    double *t = (double *)(uintptr_t)scratch_a, *t2 = t + nf;
    float *center = (float *)(t2 + nf);
    Py_ssize_t rows;
    int finite;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < nf; j++)
        mn[j] = mx[j] = v[j];
    rows = passes(v, n, nf, step, check, NULL, s1, NULL, t, NULL, mn, mx);
    finite = rows == n && all_finite(s1, nf);
    if (finite) {
        for (Py_ssize_t j = 0; j < nf; j++)
            center[j] = (float)(s1[j] / (double)n);
        passes(v, n, nf, step, 0, center, sd, sq, t, t2, NULL, NULL);
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromSsize_t(finite ? 1 : -rows);
}
