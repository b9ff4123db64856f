/* Placing many arrays at once (mmfs/megatron/placement.py): a mount of ten
 * thousand datasets describes some hundred thousand arrays, checks sixty thousand
 * .npy headers and registers forty thousand files; one call each, not one per array. */
#ifndef MMFS_PLACING_H
#define MMFS_PLACING_H

#include <stdint.h>

#include "mmfs_native.h"

/* Register n files in the open-files table (mmfs_file_add each): file i is the i-th
 * NUL-terminated path in `paths`, its identity the MMFS_IDENTITY_WORDS words at
 * identity + 4i (see mmfs_files.h; not known: taken when first opened). ids[i]: its id, or MMFS_E_NOMEM. */
void mmfs_files_add_many(const char *paths, int64_t n, const uint64_t *identity, int64_t *ids);

/* ok[i] = 1 when the first got[i] bytes at heads + i * head_size begin with the
 * header numpy's np.save writes (format 1.0) for an array of descr (the i-th
 * NUL-terminated string in `descrs`, e.g. "<i4"), ndim[i] dimensions (1 or 2;
 * shapes[2i], shapes[2i+1]) whose data starts at byte offsets[i]; else 0 (another
 * header, a header not read whole, or a shape of other dimensions: the caller
 * parses the header itself). */
void mmfs_npy_headers_match(const uint8_t *heads, const int32_t *got, int32_t head_size, int64_t n,
                            const char *descrs, const int32_t *ndim, const int64_t *shapes,
                            const int64_t *offsets, uint8_t *ok);

/* Describe n arrays, each in its struct structs[i]: in memory at address[i] when it
 * is not 0, else in the open-files table's file[i] (0: none) from byte offset[i];
 * count[i] elements of dtype code dtype[i]; never fetched. */
void mmfs_arrays_fill(mmfs_array *const *structs, int64_t n, const int64_t *address, const int64_t *file,
                      const int64_t *offset, const int64_t *count, const int32_t *dtype);

/* Copy n regions of one file into memory: the file opened once and checked to be the
 * file given (identity[0..3]: known, size, mtime_ns, inode, as mmfs_files_copy takes
 * a file's; known 0: not checked), region i
 * (lengths[i] bytes from offsets[i]; sorted by offset) to out + at[i]; regions
 * near each other read in one span (a pack of thousands of small arrays is a few
 * reads). 0, or MMFS_E_IO (not opened or read), MMFS_E_CHANGED (not the file given,
 * or shorter than a region), MMFS_E_NOMEM. */
int32_t mmfs_regions_copy(const char *path, const uint64_t *identity, int64_t n, const int64_t *offsets,
                          const int64_t *lengths, uint8_t *out, const int64_t *at);

#endif
