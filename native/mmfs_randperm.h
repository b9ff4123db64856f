/* torch.randperm on the CPU, without torch: the permutation Megatron's cyclic
 * sampler draws with torch.Generator().manual_seed(epoch).
 *
 * The generator is the MT19937 of torch's CPU generator (and of numpy's legacy
 * RandomState): manual_seed(s) initialises it from the low 32 bits of s.
 * randperm(n) is then, as torch >= 2.6 does it:
 *   n <  MMFS_RANDPERM_SMALL_LIMIT: r = 0..n-1; for i in 0..n-2:
 *                                   z = next32() % (n - i); swap(r[i], r[i + z])
 *   otherwise (inside-out):         for i in 0..n-1: z = next64() % (i + 1);
 *                                   r[i] = r[z]; r[z] = i
 *   with next64() = next32() << 32 | next32() (the first draw is the high half).
 * Functions return 0 (or a count) on success and a negative MMFS_E_* code of
 * mmfs_native.h on bad arguments; none writes outside the buffer it is given.
 */
#include <stdint.h>

/* torch's switch to the inside-out algorithm: (2**32 - 1) / 20 (the one copy;
 * Python reads it as lib.MMFS_RANDPERM_SMALL_LIMIT). */
#define MMFS_RANDPERM_SMALL_LIMIT (4294967295LL / 20)

/* out[0..n) = the first n raw 32-bit outputs after manual_seed(seed). */
int mmfs_mt19937_raw(uint64_t seed, int64_t n, uint32_t *out);

/* out[0..n) = torch.randperm(n, generator=manual_seed(seed)), as int64 or int32
 * (int32 only for n <= 2**31). */
int mmfs_randperm_i64(uint64_t seed, int64_t n, int64_t *out);
int mmfs_randperm_i32(uint64_t seed, int64_t n, int32_t *out);

/* The same, always by the large-n (inside-out) algorithm: for tests only. */
int mmfs_randperm_large_path_i64(uint64_t seed, int64_t n, int64_t *out);
