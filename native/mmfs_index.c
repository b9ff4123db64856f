/* Megatron's index builders: the sample index and the blending indices.
 * See mmfs_native.h for the contract of each function.
 *
 * They follow megatron-core's helpers.cpp step for step (the arithmetic,
 * including its float32 sample count, is part of the product: samples must
 * match Megatron's bit for bit); unlike helpers.cpp they check every input and
 * never assert.
 */
#include "mmfs_native.h"

#include <errno.h>
#include <math.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

int64_t mmfs_sample_count(int32_t num_epochs, int64_t tokens_per_epoch,
                          int32_t seq_length, int drop_last, int extra) {
    if (num_epochs < 1 || tokens_per_epoch < 1 || seq_length < 1 ||
        (extra != 0 && extra != 1))
        return MMFS_E_ARG;
    if (tokens_per_epoch > INT64_MAX / num_epochs) return MMFS_E_OVERFLOW;
    int64_t total = (int64_t)num_epochs * tokens_per_epoch - extra;
    if (drop_last) return total / seq_length;
    /* helpers.cpp: ceil(float(total) / seq_length), in single precision. */
    float quotient = (float)total / (float)seq_length;
    return (int64_t)ceilf(quotient);
}

int mmfs_build_sample_index(const int32_t *sizes, int64_t num_sizes,
                            const int32_t *doc_index, int64_t num_doc_index,
                            int32_t seq_length, int32_t num_epochs,
                            int64_t tokens_per_epoch, int drop_last, int extra,
                            void *out, int64_t out_rows, int wide) {
    int64_t num_samples = mmfs_sample_count(num_epochs, tokens_per_epoch,
                                            seq_length, drop_last, extra);
    if (num_samples < 0) return (int)num_samples;
    if (!sizes || !doc_index || !out || num_sizes < 0 || num_doc_index < 1)
        return MMFS_E_ARG;
    if (out_rows != num_samples + 1) return MMFS_E_OUT_SIZE;
    if (!wide && num_doc_index > INT32_MAX) return MMFS_E_OVERFLOW;

    int32_t *out32 = (int32_t *)out;
    int64_t *out64 = (int64_t *)out;
#define RECORD(row, doc, off)                                                 \
    do {                                                                      \
        if (wide) {                                                           \
            out64[2 * (row)] = (doc);                                         \
            out64[2 * (row) + 1] = (off);                                     \
        } else {                                                              \
            if ((off) > INT32_MAX || (off) < INT32_MIN) return MMFS_E_OVERFLOW; \
            out32[2 * (row)] = (int32_t)(doc);                                \
            out32[2 * (row) + 1] = (int32_t)(off);                            \
        }                                                                     \
    } while (0)

    int64_t row = 0;
    int64_t doc_pos = 0;  /* position in doc_index */
    int64_t doc_offset = 0;
    RECORD(row, doc_pos, doc_offset);
    ++row;
    while (row <= num_samples) {
        int64_t remaining = (int64_t)seq_length + extra;
        while (remaining != 0) {
            int32_t seq = doc_index[doc_pos];
            if (seq < 0 || seq >= num_sizes) return MMFS_E_DOC_RANGE;
            if (sizes[seq] < 0) return MMFS_E_NEG_LENGTH;
            int64_t doc_length = (int64_t)sizes[seq] - doc_offset;
            remaining -= doc_length;
            if (remaining <= 0) {
                doc_offset += remaining + doc_length - extra;
                remaining = 0;
            } else {
                if (doc_pos == num_doc_index - 1) {
                    /* Out of documents: the kept partial last sample ends
                     * here. helpers.cpp asserts row == num_samples, but its
                     * release build (NDEBUG) goes on, repeating this row when
                     * the float32 count overshoots; so do we. */
                    doc_offset = (int64_t)sizes[seq] - extra;
                    break;
                }
                ++doc_pos;
                doc_offset = 0;
            }
        }
        RECORD(row, doc_pos, doc_offset);
        ++row;
    }
#undef RECORD
    return MMFS_OK;
}

/* The (k+1)-th largest of v[0..n) (k < n); reorders v. */
static double kth_largest(double *v, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        double pivot = v[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot) ++i;
            while (v[j] < pivot) --j;
            if (i <= j) { double t = v[i]; v[i] = v[j]; v[j] = t; ++i; --j; }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return v[k];
    }
    return v[k];
}

/* helpers.cpp's greedy: sample i goes to the first d maximising
 * weights[d] * max(i, 1) - counts[d], in that exact double arithmetic.
 *
 * Done in blocks of K = sqrt(8 D) steps (fastest here for D = 1,000) so that a
 * sample costs O(sqrt(D)), not O(D): at a
 * block's start, at most K datasets can be chosen within it, so one of the K+1
 * largest errors grows untouched and the maximum stays >= the (K+1)-th largest
 * error L. A dataset whose error cannot reach L within K steps (its error +
 * K * weight, with a rounding margin) cannot be the maximum, nor tie it, in the
 * block; the block is run over the others in ascending order, with the same
 * strict comparison, so it picks what the full scan picks. */
int mmfs_build_blending_index(const double *weights, int32_t num_datasets,
                              int64_t size, int16_t *dataset_index,
                              int64_t *dataset_sample_index) {
    if (!weights || num_datasets < 1 || num_datasets > INT16_MAX || size < 0 ||
        (size > 0 && (!dataset_index || !dataset_sample_index)))
        return MMFS_E_ARG;
    int32_t n = num_datasets;
    int64_t *counts = calloc((size_t)n, sizeof(int64_t));
    double *scratch = malloc((size_t)n * sizeof(double));
    double *error0 = malloc((size_t)n * sizeof(double));
    int32_t *cand = malloc((size_t)n * sizeof(int32_t));
    double *cand_w = malloc((size_t)n * sizeof(double));
    double *cand_c = malloc((size_t)n * sizeof(double));
    if (!counts || !scratch || !error0 || !cand || !cand_w || !cand_c) {
        free(counts); free(scratch); free(error0); free(cand); free(cand_w); free(cand_c);
        return MMFS_E_NOMEM;
    }
    double wmax = 0.0;
    for (int32_t d = 0; d < n; ++d) {
        if (!(weights[d] >= 0.0) || !isfinite(weights[d])) {  /* the bound needs w >= 0 */
            wmax = -1.0;
            break;
        }
        if (weights[d] > wmax) wmax = weights[d];
    }
    int32_t block = (int32_t)sqrt((double)n * 8.0);
    if (wmax < 0.0 || block < 2 || block >= n) block = 0;  /* plain scan */
    int64_t i = 0;
    while (i < size) {
        int64_t end = size;
        int32_t m = n;
        if (block) {
            end = i + block < size ? i + block : size;
            double at0 = i > 1 ? (double)i : 1.0;
            int64_t cmax = 0;
            for (int32_t d = 0; d < n; ++d) {
                error0[d] = weights[d] * at0 - (double)counts[d];
                scratch[d] = error0[d];
                if (counts[d] > cmax) cmax = counts[d];
            }
            double floor_max = kth_largest(scratch, n, block);
            double at_end = (double)end;
            /* generous bound on the rounding of any error in the block */
            double margin = 64.0 * 2.220446049250313e-16 * (wmax * at_end + (double)cmax + (double)block + 2.0);
            double reach = (double)block;
            m = 0;
            for (int32_t d = 0; d < n; ++d)
                if (error0[d] + weights[d] * reach + margin >= floor_max - margin) cand[m++] = d;
        }
        if (!block) {
            for (; i < end; ++i) {
                double at = i > 1 ? (double)i : 1.0;
                int32_t best = 0;
                double best_error = weights[0] * at - (double)counts[0];
                for (int32_t d = 1; d < n; ++d) {
                    double error = weights[d] * at - (double)counts[d];
                    if (error > best_error) {
                        best_error = error;
                        best = d;
                    }
                }
                dataset_index[i] = (int16_t)best;
                dataset_sample_index[i] = counts[best];
                counts[best] += 1;
            }
            continue;
        }
        /* the candidates' weights and counts side by side: a contiguous scan */
        for (int32_t k = 0; k < m; ++k) {
            cand_w[k] = weights[cand[k]];
            cand_c[k] = (double)counts[cand[k]];  /* exact: counts < 2**53 */
        }
        for (; i < end; ++i) {
            double at = i > 1 ? (double)i : 1.0;
            int32_t best = 0;
            double best_error = cand_w[0] * at - cand_c[0];
            for (int32_t k = 1; k < m; ++k) {
                double error = cand_w[k] * at - cand_c[k];
                if (error > best_error) {
                    best_error = error;
                    best = k;
                }
            }
            int32_t d = cand[best];
            dataset_index[i] = (int16_t)d;
            dataset_sample_index[i] = counts[d];
            counts[d] += 1;
            cand_c[best] += 1.0;
        }
    }
    free(counts); free(scratch); free(error0); free(cand); free(cand_w); free(cand_c);
    return MMFS_OK;
}

int mmfs_build_exhaustive_blending_index(const int64_t *sizes,
                                         int32_t num_datasets, int64_t total,
                                         int16_t *dataset_index,
                                         int64_t *dataset_sample_index) {
    if (!sizes || num_datasets < 1 || num_datasets > INT16_MAX || total < 0)
        return MMFS_E_ARG;
    int64_t sum = 0;
    for (int32_t d = 0; d < num_datasets; ++d) {
        if (sizes[d] <= 0 || sizes[d] > INT64_MAX - sum) return MMFS_E_ARG;
        sum += sizes[d];
    }
    if (sum != total || !dataset_index || !dataset_sample_index)
        return MMFS_E_OUT_SIZE;
    int64_t *counts = calloc((size_t)num_datasets, sizeof(int64_t));
    double *weights = malloc((size_t)num_datasets * sizeof(double));
    char *spent = calloc((size_t)num_datasets, 1);
    if (!counts || !weights || !spent) {
        free(counts); free(weights); free(spent);
        return MMFS_E_NOMEM;
    }
    for (int32_t d = 0; d < num_datasets; ++d)
        weights[d] = (double)sizes[d] / (double)total;
    for (int64_t i = 0; i < total; ++i) {
        double at = i > 1 ? (double)i : 1.0;
        int32_t best = -1;
        double best_error = 0.0;
        /* Ascending over unspent datasets, as helpers.cpp's std::set. */
        for (int32_t d = 0; d < num_datasets; ++d) {
            if (spent[d]) continue;
            double error = weights[d] * at - (double)counts[d];
            if (best < 0 || error > best_error) {
                best_error = error;
                best = d;
            }
        }
        dataset_index[i] = (int16_t)best;
        dataset_sample_index[i] = counts[best];
        counts[best] += 1;
        if ((double)sizes[best] - (double)counts[best] == 0) spent[best] = 1;
    }
    free(counts); free(weights); free(spent);
    return MMFS_OK;
}
