/* torch.randperm (CPU) and its MT19937; see mmfs_randperm.h. */
#include "mmfs_randperm.h"

#include "mmfs_native.h"

#define MT_N 624
#define MT_M 397

typedef struct {
    uint32_t state[MT_N];
    int next; /* index of the next word to hand out; MT_N: regenerate first */
} mt19937;

static void mt_seed(mt19937 *g, uint64_t seed) {
    g->state[0] = (uint32_t)(seed & 0xffffffffu);
    for (int j = 1; j < MT_N; ++j) {
        uint32_t prev = g->state[j - 1];
        g->state[j] = 1812433253u * (prev ^ (prev >> 30)) + (uint32_t)j;
    }
    g->next = MT_N;
}

static void mt_regenerate(mt19937 *g) {
    uint32_t *s = g->state;
    for (int k = 0; k < MT_N; ++k) {
        uint32_t y = (s[k] & 0x80000000u) | (s[(k + 1) % MT_N] & 0x7fffffffu);
        uint32_t v = s[(k + MT_M) % MT_N] ^ (y >> 1);
        if (y & 1u) v ^= 0x9908b0dfu;
        s[k] = v;
    }
    g->next = 0;
}

static inline uint32_t mt_next32(mt19937 *g) {
    if (g->next >= MT_N) mt_regenerate(g);
    uint32_t y = g->state[g->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

static inline uint64_t mt_next64(mt19937 *g) {
    uint64_t hi = mt_next32(g);
    uint64_t lo = mt_next32(g);
    return (hi << 32) | lo;
}

int mmfs_mt19937_raw(uint64_t seed, int64_t n, uint32_t *out) {
    if (n < 0 || (n > 0 && !out)) return MMFS_E_ARG;
    mt19937 g;
    mt_seed(&g, seed);
    for (int64_t i = 0; i < n; ++i) out[i] = mt_next32(&g);
    return MMFS_OK;
}

/* The two algorithms, for each output type. The small one is bound by cache
 * misses on r[i + z]: the draws do not depend on the array, so they are made
 * AHEAD steps early and their targets prefetched. n < 2**32 there, so the
 * modulo is a 32-bit one (the same value as torch's 64-bit one). */
#define AHEAD 32
#define RANDPERM_SMALL(T, g, n, out)                                      \
    do {                                                                  \
        uint32_t z_ring_[AHEAD];                                          \
        for (int64_t i_ = 0; i_ < (n); ++i_) (out)[i_] = (T)i_;           \
        int64_t steps_ = (n) - 1;                                         \
        for (int64_t i_ = 0; i_ < steps_ && i_ < AHEAD; ++i_)             \
            z_ring_[i_] = mt_next32(g) % (uint32_t)((n) - i_);            \
        for (int64_t i_ = 0; i_ < steps_; ++i_) {                         \
            int64_t z_ = z_ring_[i_ % AHEAD];                             \
            int64_t a_ = i_ + AHEAD;                                      \
            if (a_ < steps_) {                                            \
                uint32_t za_ = mt_next32(g) % (uint32_t)((n) - a_);       \
                z_ring_[a_ % AHEAD] = za_;                                \
                __builtin_prefetch(&(out)[a_ + za_], 1);                  \
            }                                                             \
            T save_ = (out)[i_];                                          \
            (out)[i_] = (out)[i_ + z_];                                   \
            (out)[i_ + z_] = save_;                                       \
        }                                                                 \
    } while (0)

#define RANDPERM_LARGE(T, g, n, out)                                      \
    do {                                                                  \
        uint64_t z_ring_[AHEAD];                                          \
        for (int64_t i_ = 0; i_ < (n) && i_ < AHEAD; ++i_)                \
            z_ring_[i_] = mt_next64(g) % (uint64_t)(i_ + 1);              \
        for (int64_t i_ = 0; i_ < (n); ++i_) {                            \
            int64_t z_ = (int64_t)z_ring_[i_ % AHEAD];                    \
            int64_t a_ = i_ + AHEAD;                                      \
            if (a_ < (n)) {                                               \
                uint64_t za_ = mt_next64(g) % (uint64_t)(a_ + 1);         \
                z_ring_[a_ % AHEAD] = za_;                                \
                __builtin_prefetch(&(out)[za_], 1);                       \
            }                                                             \
            if (z_ != i_) (out)[i_] = (out)[z_];                          \
            (out)[z_] = (T)i_;                                            \
        }                                                                 \
    } while (0)

/* torch.randperm(n) into out (elements of type T, n <= max_n). */
#define DEFINE_RANDPERM(name, T, max_n)                                   \
    int name(uint64_t seed, int64_t n, T *out) {                          \
        if (n < 0 || n > (max_n) || (n > 0 && !out)) return MMFS_E_ARG;   \
        mt19937 g;                                                        \
        mt_seed(&g, seed);                                                \
        if (n < MMFS_RANDPERM_SMALL_LIMIT)                                \
            RANDPERM_SMALL(T, &g, n, out);                                \
        else                                                              \
            RANDPERM_LARGE(T, &g, n, out);                                \
        return MMFS_OK;                                                   \
    }

DEFINE_RANDPERM(mmfs_randperm_i64, int64_t, INT64_MAX)
DEFINE_RANDPERM(mmfs_randperm_i32, int32_t, ((int64_t)1 << 31))

int mmfs_randperm_large_path_i64(uint64_t seed, int64_t n, int64_t *out) {
    if (n < 0 || (n > 0 && !out)) return MMFS_E_ARG;
    mt19937 g;
    mt_seed(&g, seed);
    RANDPERM_LARGE(int64_t, &g, n, out);
    return MMFS_OK;
}
