/* kmeans: Lloyd's K-means over points in one large malloc'd array.
 * usage: kmeans [points=4000000] [dims=16] [k=16] [iterations=8] [seed=1]
 * prints: result name=kmeans bytes=.. points=.. dims=.. k=.. iterations=.. seconds=..
 *         points_per_s=.. converged_at=.. center_error=.. checksum=..
 *
 * The setup follows the K-means case study of Zhang et al., "Performance Evaluation and
 * Analysis of a Disaggregated Memory System" (MEMSYS 2020, section 4.4): Rodinia's K-means,
 * whose feature array (points x features, floats) is the footprint that sits behind a local
 * buffer of X% of it, scanned once per iteration to find each point's nearest center and to
 * accumulate the new centers. Unlike Rodinia we run one thread (the paper's anomaly came from
 * false sharing between threads, which is not what we measure) and a fixed number of iterations,
 * so every setup does the same work.
 *
 * Points are drawn around k true centers (deterministic xorshift), the initial centers are
 * chosen by farthest-point traversal (deterministic, and one per blob when blobs are well
 * apart), the iterations are timed. converged_at is the first iteration that changed no
 * membership (0 if none); center_error is the largest distance from a true center to the
 * nearest found one. The checksum covers the memberships and the centers' bits, so it is the
 * same natively and under rackmem. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* uniform in [0, 1) */
static double unit(uint64_t *s) { return (xorshift(s) >> 11) * (1.0 / 9007199254740992.0); }

static float dist2(const float *a, const float *b, size_t d) {
    float s = 0;
    for (size_t t = 0; t < d; t++) {
        float x = a[t] - b[t];
        s += x * x;
    }
    return s;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], 0, 0) : 4000000;
    size_t d = argc > 2 ? strtoull(argv[2], 0, 0) : 16;
    size_t k = argc > 3 ? strtoull(argv[3], 0, 0) : 16;
    size_t iters = argc > 4 ? strtoull(argv[4], 0, 0) : 8;
    uint64_t seed = argc > 5 ? strtoull(argv[5], 0, 0) : 1;
    if (!n || !d || !k || k > n || !seed) {
        fprintf(stderr, "kmeans: need points >= k >= 1, dims >= 1, seed != 0\n");
        return 1;
    }
    float *pts = malloc(n * d * sizeof(float));
    int *member = malloc(n * sizeof(int));
    float *mind = malloc(n * sizeof(float));
    float *truth = malloc(k * d * sizeof(float));
    float *cent = malloc(k * d * sizeof(float));
    double *sum = malloc(k * d * sizeof(double));
    size_t *count = malloc(k * sizeof(size_t));
    if (!pts || !member || !mind || !truth || !cent || !sum || !count) {
        fprintf(stderr, "kmeans: malloc failed\n");
        return 1;
    }
    /* True centers in [0, 1000)^d, points within +-10 of one: blobs far apart. */
    for (size_t i = 0; i < k * d; i++) truth[i] = (float)(unit(&seed) * 1000.0);
    for (size_t i = 0; i < n; i++) {
        size_t c = xorshift(&seed) % k;
        for (size_t t = 0; t < d; t++) pts[i * d + t] = truth[c * d + t] + (float)((unit(&seed) - 0.5) * 20.0);
        member[i] = -1;
    }
    /* Farthest-point initialisation: point 0, then each time the point farthest from the
     * centers chosen so far. */
    memcpy(cent, pts, d * sizeof(float));
    for (size_t i = 0; i < n; i++) mind[i] = dist2(&pts[i * d], cent, d);
    for (size_t c = 1; c < k; c++) {
        size_t far = 0;
        for (size_t i = 1; i < n; i++)
            if (mind[i] > mind[far]) far = i;
        memcpy(&cent[c * d], &pts[far * d], d * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            float x = dist2(&pts[i * d], &cent[c * d], d);
            if (x < mind[i]) mind[i] = x;
        }
    }
    size_t converged_at = 0;
    double t0 = now();
    for (size_t it = 1; it <= iters; it++) {
        memset(sum, 0, k * d * sizeof(double));
        memset(count, 0, k * sizeof(size_t));
        size_t changed = 0;
        for (size_t i = 0; i < n; i++) {
            const float *p = &pts[i * d];
            int best = 0;
            float bd = dist2(p, cent, d);
            for (size_t c = 1; c < k; c++) {
                float x = dist2(p, &cent[c * d], d);
                if (x < bd) {
                    bd = x;
                    best = (int)c;
                }
            }
            if (member[i] != best) {
                member[i] = best;
                changed++;
            }
            count[best]++;
            for (size_t t = 0; t < d; t++) sum[best * d + t] += p[t];
        }
        for (size_t c = 0; c < k; c++)
            if (count[c])
                for (size_t t = 0; t < d; t++) cent[c * d + t] = (float)(sum[c * d + t] / count[c]);
        if (!changed && !converged_at) converged_at = it;
    }
    double dt = now() - t0;
    double err = 0;
    for (size_t c = 0; c < k; c++) {
        float best = INFINITY;
        for (size_t j = 0; j < k; j++) {
            float x = dist2(&truth[c * d], &cent[j * d], d);
            if (x < best) best = x;
        }
        if (sqrt(best) > err) err = sqrt(best);
    }
    uint64_t h = 1469598103934665603ull; /* FNV-1a over memberships and center bits */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint64_t)member[i]) * 1099511628211ull;
    for (size_t i = 0; i < k * d; i++) {
        uint32_t b;
        memcpy(&b, &cent[i], sizeof b);
        h = (h ^ b) * 1099511628211ull;
    }
    printf("result name=kmeans bytes=%zu points=%zu dims=%zu k=%zu iterations=%zu seconds=%.4f points_per_s=%.1f "
           "converged_at=%zu center_error=%.4f checksum=%016llx\n",
           n * d * sizeof(float), n, d, k, iters, dt, dt > 0 ? (double)n * iters / dt : 0.0, converged_at, err,
           (unsigned long long)h);
    free(pts);
    free(member);
    free(mind);
    free(truth);
    free(cent);
    free(sum);
    free(count);
    return 0;
}
