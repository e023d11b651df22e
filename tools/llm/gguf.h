/* SPDX-License-Identifier: MIT */
/*
 * gguf.h - read-only GGUF (v2, v3) reader for kvtier-llm.
 *
 * A GGUF file is a little-endian header (magic "GGUF", version, tensor count, metadata count),
 * the metadata key/value pairs, the tensor infos (name, dims, ggml type, offset), then the tensor
 * data section, which starts at the first multiple of `general.alignment` (default 32) after the
 * infos. Tensor offsets are relative to that section and multiples of the alignment.
 *
 * The file is mapped read-only; every string, array and tensor handed out points into the map and
 * lives until gguf_close(). The parser treats the file as untrusted: every length, count and
 * offset is checked against the bytes that are there with overflow-safe arithmetic, so a
 * truncated or corrupt file gives -EINVAL (or -ENOMEM for absurd counts) and a message, never a
 * read past the map. Nested arrays (arrays of arrays) are rejected: no known model uses them.
 */
#ifndef KVT_LLM_GGUF_H
#define KVT_LLM_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_MAGIC	       0x46554747u /* "GGUF" read as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS	       4

enum gguf_type {
	GGUF_TYPE_UINT8 = 0,
	GGUF_TYPE_INT8 = 1,
	GGUF_TYPE_UINT16 = 2,
	GGUF_TYPE_INT16 = 3,
	GGUF_TYPE_UINT32 = 4,
	GGUF_TYPE_INT32 = 5,
	GGUF_TYPE_FLOAT32 = 6,
	GGUF_TYPE_BOOL = 7,
	GGUF_TYPE_STRING = 8,
	GGUF_TYPE_ARRAY = 9,
	GGUF_TYPE_UINT64 = 10,
	GGUF_TYPE_INT64 = 11,
	GGUF_TYPE_FLOAT64 = 12,
	GGUF_TYPE__COUNT
};

/* ggml tensor types (ggml.h numbering); only those with a known block size are accepted. */
enum ggml_type {
	GGML_TYPE_F32 = 0,
	GGML_TYPE_F16 = 1,
	GGML_TYPE_Q4_0 = 2,
	GGML_TYPE_Q4_1 = 3,
	GGML_TYPE_Q5_0 = 6,
	GGML_TYPE_Q5_1 = 7,
	GGML_TYPE_Q8_0 = 8,
	GGML_TYPE_Q8_1 = 9,
	GGML_TYPE_Q2_K = 10,
	GGML_TYPE_Q3_K = 11,
	GGML_TYPE_Q4_K = 12,
	GGML_TYPE_Q5_K = 13,
	GGML_TYPE_Q6_K = 14,
	GGML_TYPE_Q8_K = 15,
	GGML_TYPE_I8 = 24,
	GGML_TYPE_I16 = 25,
	GGML_TYPE_I32 = 26,
	GGML_TYPE_I64 = 27,
	GGML_TYPE_F64 = 28,
	GGML_TYPE_BF16 = 30,
};

/* A string inside the map: not NUL-terminated. */
struct gguf_str {
	const char *ptr;
	uint64_t len;
};

struct gguf_value {
	uint32_t type; /* enum gguf_type */
	union {
		uint64_t u64;	     /* UINT8..UINT64 (zero-extended) */
		int64_t i64;	     /* INT8..INT64 (sign-extended) */
		double f64;	     /* FLOAT32, FLOAT64 */
		bool b;		     /* BOOL */
		struct gguf_str str; /* STRING */
		struct {
			uint32_t type; /* element type, never ARRAY */
			uint64_t n;
			const void *data;      /* numeric elements, packed, possibly unaligned */
			struct gguf_str *strs; /* STRING elements (owned by the gguf_file) */
		} arr;
	};
};

struct gguf_kv {
	struct gguf_str key;
	struct gguf_value val;
};

struct gguf_tensor {
	struct gguf_str name;
	uint32_t n_dims;
	uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the innermost (contiguous) dimension; unused = 1 */
	uint32_t type;		    /* enum ggml_type */
	uint64_t offset;	    /* from the start of the data section */
	uint64_t size;		    /* bytes */
	uint64_t n_elements;
	const void *data; /* in the map */
};

struct gguf_file {
	const uint8_t *base; /* the mapped file (or the caller's buffer for gguf_parse) */
	size_t size;
	bool mapped;
	uint32_t version;
	uint32_t alignment;
	uint64_t data_off; /* file offset of the data section */
	uint64_t n_kv;
	struct gguf_kv *kv;
	uint64_t n_tensors;
	struct gguf_tensor *tensors;
};

/*
 * gguf_open() - map and parse the GGUF file at @path.
 * On failure a one-line reason is written to @err (@errlen bytes, may be 0).
 * Returns 0, or -errno from open/fstat/mmap, -EINVAL for a malformed file, -ENOTSUP for an
 * unsupported version or tensor type, -ENOMEM.
 */
int gguf_open(const char *path, struct gguf_file **ret_file, char *err, size_t errlen);

/*
 * gguf_parse() - parse a GGUF image held in memory at @buf (@size bytes). The buffer must outlive
 * the returned file. Same errors as gguf_open().
 */
int gguf_parse(const void *buf, size_t size, struct gguf_file **ret_file, char *err, size_t errlen);

/* Unmaps and frees. Accepts NULL. */
void gguf_close(struct gguf_file *f);

/* Lookups by exact key / name; NULL when absent. Linear: metadata is small. */
const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/*
 * Typed getters. Integers of any GGUF integer type are accepted when the value fits; floats
 * accept FLOAT32 and FLOAT64. Return 0, -ENOENT (absent), -EINVAL (wrong type), -ERANGE.
 */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *ret_val);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *ret_val);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *ret_val);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *ret_val);
int gguf_get_arr(const struct gguf_file *f, const char *key, uint32_t elem_type, uint64_t *ret_n,
		 const struct gguf_kv **ret_kv);

/* Element @i of a numeric array value as int64 (integer element types only). */
int64_t gguf_arr_int(const struct gguf_value *v, uint64_t i);

/* True when @s equals the NUL-terminated @cstr. */
bool gguf_str_eq(struct gguf_str s, const char *cstr);

/* Names for messages. */
const char *gguf_type_name(uint32_t type);
const char *ggml_type_name(uint32_t type);

/* Elements per block and bytes per block of a ggml type; 0 for unknown types. */
uint32_t ggml_blck_size(uint32_t type);
uint32_t ggml_type_size(uint32_t type);

#endif /* KVT_LLM_GGUF_H */
