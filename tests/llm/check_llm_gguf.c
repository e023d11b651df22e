/* SPDX-License-Identifier: MIT */
/*
 * GGUF reader: a file written here (every metadata type, arrays, a custom alignment, F32 and
 * Q4_1 tensors) parses back exactly, through gguf_open() (mmap) and gguf_parse(); malformed
 * images (every truncation, bad magic, bad version, offsets beyond the file or misaligned,
 * nested arrays, duplicate keys, absurd counts) are rejected with an error and a message.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "llm_quant.h"
#include "kvt_test.h"

/* ---- a minimal GGUF writer --------------------------------------------------------------- */

struct buf {
	uint8_t *p;
	size_t n, cap;
};

static void
put(struct buf *b, const void *p, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		ck_assert_ptr_nonnull(b->p);
	}
	memcpy(b->p + b->n, p, n);
	b->n += n;
}

static void
put_u32(struct buf *b, uint32_t v)
{
	put(b, &v, 4);
}

static void
put_u64(struct buf *b, uint64_t v)
{
	put(b, &v, 8);
}

static void
put_str(struct buf *b, const char *s)
{
	put_u64(b, strlen(s));
	put(b, s, strlen(s));
}

static void
put_key(struct buf *b, const char *key, uint32_t type)
{
	put_str(b, key);
	put_u32(b, type);
}

static void
pad_to(struct buf *b, size_t align)
{
	static const uint8_t zero[256];

	if (b->n % align)
		put(b, zero, align - b->n % align);
}

#define ALIGN 64
#define N_KV  16

/* Byte offsets of interesting fields, filled by build(), so corruptions can target them. */
struct layout {
	size_t version_off;
	size_t n_kv_off;
	size_t t1_offset_off; /* the second tensor's data offset field */
	size_t data_off;
};

static const float t0_vals[8] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, -1e6f, 42.0f, 0.5f};

/* Two 32-element Q4_1 rows: t1 is [32, 2]. */
static void
make_q4_1(struct block_q4_1 *b)
{
	for (int r = 0; r < 2; r++) {
		b[r].d = llm_f32_to_f16(0.25f * (r + 1));
		b[r].m = llm_f32_to_f16(-1.0f);
		for (int j = 0; j < 16; j++)
			b[r].qs[j] = (uint8_t)((j & 15) | ((15 - j) << 4));
	}
}

static struct buf
build(struct layout *lo)
{
	struct buf b = {0};
	int32_t i32s[5] = {-1, 0, 1, 2147483647, -2147483647 - 1};
	struct block_q4_1 q[2];

	put_u32(&b, GGUF_MAGIC);
	lo->version_off = b.n;
	put_u32(&b, 3);
	put_u64(&b, 2); /* tensors */
	lo->n_kv_off = b.n;
	put_u64(&b, N_KV);

	put_key(&b, "general.architecture", GGUF_TYPE_STRING);
	put_str(&b, "llama");
	put_key(&b, "general.alignment", GGUF_TYPE_UINT32);
	put_u32(&b, ALIGN);
	put_key(&b, "t.u8", GGUF_TYPE_UINT8);
	put(&b, &(uint8_t){200}, 1);
	put_key(&b, "t.i8", GGUF_TYPE_INT8);
	put(&b, &(int8_t){-100}, 1);
	put_key(&b, "t.u16", GGUF_TYPE_UINT16);
	put(&b, &(uint16_t){60000}, 2);
	put_key(&b, "t.i16", GGUF_TYPE_INT16);
	put(&b, &(int16_t){-30000}, 2);
	put_key(&b, "t.u32", GGUF_TYPE_UINT32);
	put_u32(&b, 4000000000u);
	put_key(&b, "t.i32", GGUF_TYPE_INT32);
	put(&b, &(int32_t){-2000000000}, 4);
	put_key(&b, "t.f32", GGUF_TYPE_FLOAT32);
	put(&b, &(float){0.125f}, 4);
	put_key(&b, "t.bool", GGUF_TYPE_BOOL);
	put(&b, &(uint8_t){1}, 1);
	put_key(&b, "t.u64", GGUF_TYPE_UINT64);
	put_u64(&b, UINT64_C(18000000000000000000));
	put_key(&b, "t.i64", GGUF_TYPE_INT64);
	put(&b, &(int64_t){INT64_MIN}, 8);
	put_key(&b, "t.f64", GGUF_TYPE_FLOAT64);
	put(&b, &(double){-1.0e300}, 8);
	put_key(&b, "t.arr_i32", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_INT32);
	put_u64(&b, 5);
	put(&b, i32s, sizeof(i32s));
	put_key(&b, "t.arr_str", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_STRING);
	put_u64(&b, 3);
	put_str(&b, "alpha");
	put_str(&b, "");
	put_str(&b, "γάμμα");
	put_key(&b, "t.arr_empty", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_FLOAT32);
	put_u64(&b, 0);

	/* tensor 0: F32 [8] at offset 0; tensor 1: Q4_1 [32, 2] at offset ALIGN */
	put_str(&b, "t0.weight");
	put_u32(&b, 1);
	put_u64(&b, 8);
	put_u32(&b, GGML_TYPE_F32);
	put_u64(&b, 0);
	put_str(&b, "t1.weight");
	put_u32(&b, 2);
	put_u64(&b, 32);
	put_u64(&b, 2);
	put_u32(&b, GGML_TYPE_Q4_1);
	lo->t1_offset_off = b.n;
	put_u64(&b, ALIGN);

	pad_to(&b, ALIGN);
	lo->data_off = b.n;
	put(&b, t0_vals, sizeof(t0_vals));
	pad_to(&b, ALIGN);
	make_q4_1(q);
	put(&b, q, sizeof(q));
	return b;
}

static void
check_file(const struct gguf_file *f, const struct layout *lo)
{
	const struct gguf_kv *kv;
	const struct gguf_tensor *t;
	struct gguf_str s;
	uint64_t n;
	uint32_t u;
	float x;
	bool bl;
	float deq[64];
	struct block_q4_1 q[2];

	ck_assert_uint_eq(f->version, 3);
	ck_assert_uint_eq(f->n_kv, N_KV);
	ck_assert_uint_eq(f->n_tensors, 2);
	ck_assert_uint_eq(f->alignment, ALIGN);
	ck_assert_uint_eq(f->data_off, lo->data_off);

	ck_assert_int_eq(gguf_get_str(f, "general.architecture", &s), 0);
	ck_assert(gguf_str_eq(s, "llama"));
	ck_assert_uint_eq(gguf_find_kv(f, "t.u8")->val.u64, 200);
	ck_assert_int_eq(gguf_find_kv(f, "t.i8")->val.i64, -100);
	ck_assert_uint_eq(gguf_find_kv(f, "t.u16")->val.u64, 60000);
	ck_assert_int_eq(gguf_find_kv(f, "t.i16")->val.i64, -30000);
	ck_assert_int_eq(gguf_get_u32(f, "t.u32", &u), 0);
	ck_assert_uint_eq(u, 4000000000u);
	ck_assert_int_eq(gguf_get_u32(f, "t.i32", &u), -ERANGE);
	ck_assert_int_eq(gguf_find_kv(f, "t.i32")->val.i64, -2000000000);
	ck_assert_int_eq(gguf_get_f32(f, "t.f32", &x), 0);
	ck_assert(x == 0.125f);
	ck_assert_int_eq(gguf_get_bool(f, "t.bool", &bl), 0);
	ck_assert(bl);
	ck_assert_int_eq(gguf_get_u32(f, "t.u64", &u), -ERANGE);
	ck_assert(gguf_find_kv(f, "t.u64")->val.u64 == UINT64_C(18000000000000000000));
	ck_assert(gguf_find_kv(f, "t.i64")->val.i64 == INT64_MIN);
	ck_assert(gguf_find_kv(f, "t.f64")->val.f64 == -1.0e300);
	ck_assert_int_eq(gguf_get_u32(f, "general.architecture", &u), -EINVAL);
	ck_assert_int_eq(gguf_get_u32(f, "no.such.key", &u), -ENOENT);

	ck_assert_int_eq(gguf_get_arr(f, "t.arr_i32", GGUF_TYPE_INT32, &n, &kv), 0);
	ck_assert_uint_eq(n, 5);
	ck_assert_int_eq(gguf_arr_int(&kv->val, 0), -1);
	ck_assert_int_eq(gguf_arr_int(&kv->val, 3), 2147483647);
	ck_assert_int_eq(gguf_arr_int(&kv->val, 4), -2147483647 - 1);
	ck_assert_int_eq(gguf_get_arr(f, "t.arr_i32", GGUF_TYPE_UINT32, &n, &kv), -EINVAL);
	ck_assert_int_eq(gguf_get_arr(f, "t.arr_str", GGUF_TYPE_STRING, &n, &kv), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert(gguf_str_eq(kv->val.arr.strs[0], "alpha"));
	ck_assert(gguf_str_eq(kv->val.arr.strs[1], ""));
	ck_assert(gguf_str_eq(kv->val.arr.strs[2], "γάμμα"));
	ck_assert_int_eq(gguf_get_arr(f, "t.arr_empty", GGUF_TYPE_FLOAT32, &n, &kv), 0);
	ck_assert_uint_eq(n, 0);

	t = gguf_find_tensor(f, "t0.weight");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->n_dims, 1);
	ck_assert_uint_eq(t->ne[0], 8);
	ck_assert_uint_eq(t->ne[1], 1);
	ck_assert_uint_eq(t->size, sizeof(t0_vals));
	ck_assert_uint_eq((uintptr_t)t->data % ALIGN, ((uintptr_t)f->base) % ALIGN);
	ck_assert_mem_eq(t->data, t0_vals, sizeof(t0_vals));

	t = gguf_find_tensor(f, "t1.weight");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->type, GGML_TYPE_Q4_1);
	ck_assert_uint_eq(t->n_dims, 2);
	ck_assert_uint_eq(t->ne[0], 32);
	ck_assert_uint_eq(t->ne[1], 2);
	ck_assert_uint_eq(t->n_elements, 64);
	ck_assert_uint_eq(t->size, 40);
	ck_assert_uint_eq(t->offset, ALIGN);
	ck_assert_ptr_eq(t->data, f->base + lo->data_off + ALIGN);
	llm_dequant_row(t->type, t->data, deq, 64);
	make_q4_1(q);
	for (int r = 0; r < 2; r++)
		for (int j = 0; j < 16; j++) {
			float d = 0.25f * (r + 1);

			ck_assert(deq[r * 32 + j] == d * (float)j - 1.0f);
			ck_assert(deq[r * 32 + j + 16] == d * (float)(15 - j) - 1.0f);
		}
	ck_assert_ptr_null(gguf_find_tensor(f, "t2.weight"));
}

START_TEST(test_roundtrip_mmap)
{
	struct layout lo;
	struct buf b = build(&lo);
	char path[64];
	struct gguf_file *f = NULL;
	char err[256];
	int fd = kvt_test_tmpfile(path, sizeof(path), "llm-gguf");

	ck_assert_int_eq(write(fd, b.p, b.n), (ssize_t)b.n);
	close(fd);
	ck_assert_msg(gguf_open(path, &f, err, sizeof(err)) == 0, "gguf_open: %s", err);
	check_file(f, &lo);
	ck_assert(f->mapped);
	gguf_close(f);
	unlink(path);
	free(b.p);
}
END_TEST

START_TEST(test_roundtrip_memory)
{
	struct layout lo;
	struct buf b = build(&lo);
	struct gguf_file *f = NULL;
	char err[256];

	ck_assert_msg(gguf_parse(b.p, b.n, &f, err, sizeof(err)) == 0, "gguf_parse: %s", err);
	check_file(f, &lo);
	gguf_close(f);
	gguf_close(NULL);
	free(b.p);
}
END_TEST

START_TEST(test_missing_file)
{
	struct gguf_file *f = NULL;
	char err[256];

	ck_assert_int_eq(gguf_open("/nonexistent/model.gguf", &f, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "/nonexistent/model.gguf"));
}
END_TEST

/* Every proper prefix of the file is rejected, with a message, and never read past. */
START_TEST(test_truncated)
{
	struct layout lo;
	struct buf b = build(&lo);
	char err[256];

	for (size_t n = 0; n < b.n; n++) {
		struct gguf_file *f = NULL;
		uint8_t *copy = malloc(n ? n : 1);
		int ret;

		memcpy(copy, b.p, n);
		ret = gguf_parse(copy, n, &f, err, sizeof(err));
		ck_assert_msg(ret == -EINVAL, "prefix of %zu bytes: ret %d", n, ret);
		ck_assert_msg(err[0] != '\0', "prefix of %zu bytes: no message", n);
		free(copy);
	}
	free(b.p);
}
END_TEST

static int
parse_corrupt(struct buf *b, char *err, size_t errlen)
{
	struct gguf_file *f = NULL;
	int ret = gguf_parse(b->p, b->n, &f, err, errlen);

	gguf_close(f);
	return ret;
}

START_TEST(test_bad_magic)
{
	struct layout lo;
	struct buf b = build(&lo);
	char err[256];

	memcpy(b.p, "GGML", 4);
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "magic"));
	free(b.p);
}
END_TEST

START_TEST(test_bad_version)
{
	struct layout lo;
	struct buf b = build(&lo);
	char err[256];
	uint32_t v = 1;

	memcpy(b.p + lo.version_off, &v, 4);
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -ENOTSUP);
	ck_assert_ptr_nonnull(strstr(err, "version"));
	free(b.p);
}
END_TEST

START_TEST(test_offset_beyond_file)
{
	struct layout lo;
	struct buf b = build(&lo);
	char err[256];
	uint64_t off = 4096;

	memcpy(b.p + lo.t1_offset_off, &off, 8);
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "t1.weight"));
	ck_assert_ptr_nonnull(strstr(err, "beyond"));
	/* The tensor fits by offset but its last bytes are cut off. */
	off = ALIGN;
	memcpy(b.p + lo.t1_offset_off, &off, 8);
	b.n -= 1;
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "beyond"));
	/* An offset that would wrap around 2^64 when the size is added. */
	b.n += 1;
	off = UINT64_MAX - 7 - (UINT64_MAX - 7) % ALIGN;
	memcpy(b.p + lo.t1_offset_off, &off, 8);
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -EINVAL);
	free(b.p);
}
END_TEST

START_TEST(test_misaligned_offset)
{
	struct layout lo;
	struct buf b = build(&lo);
	char err[256];
	uint64_t off = ALIGN / 2;

	memcpy(b.p + lo.t1_offset_off, &off, 8);
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "aligned"));
	free(b.p);
}
END_TEST

START_TEST(test_absurd_counts)
{
	struct layout lo;
	struct buf b = build(&lo);
	char err[256];
	uint64_t n = UINT64_C(1) << 60;

	memcpy(b.p + lo.n_kv_off, &n, 8);
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "cannot fit"));
	free(b.p);
}
END_TEST

static struct buf
header(uint64_t n_tensors, uint64_t n_kv)
{
	struct buf b = {0};

	put_u32(&b, GGUF_MAGIC);
	put_u32(&b, 3);
	put_u64(&b, n_tensors);
	put_u64(&b, n_kv);
	return b;
}

START_TEST(test_nested_array_and_duplicates)
{
	struct buf b = header(0, 1);
	char err[256];

	put_key(&b, "t.nested", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_ARRAY);
	put_u64(&b, 1);
	put_u32(&b, GGUF_TYPE_UINT8);
	put_u64(&b, 1);
	put(&b, "x", 1);
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -ENOTSUP);
	ck_assert_ptr_nonnull(strstr(err, "nested"));
	free(b.p);

	b = header(0, 2);
	put_key(&b, "k", GGUF_TYPE_UINT8);
	put(&b, "a", 1);
	put_key(&b, "k", GGUF_TYPE_UINT8);
	put(&b, "b", 1);
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "duplicate"));
	free(b.p);

	b = header(0, 1);
	put_key(&b, "k", 99);
	put(&b, "abcdefgh", 8);
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -EINVAL);
	free(b.p);

	/* A string array whose count cannot fit in what is left. */
	b = header(0, 1);
	put_key(&b, "k", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_STRING);
	put_u64(&b, UINT64_C(1) << 40);
	put_str(&b, "only one");
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -EINVAL);
	free(b.p);
}
END_TEST

START_TEST(test_bad_tensor_info)
{
	struct buf b = header(1, 0);
	char err[256];

	/* A Q4_1 row of 40 elements is not a whole number of 32-element blocks. */
	put_str(&b, "bad");
	put_u32(&b, 1);
	put_u64(&b, 40);
	put_u32(&b, GGML_TYPE_Q4_1);
	put_u64(&b, 0);
	pad_to(&b, 32);
	put(&b, (uint8_t[64]){0}, 64);
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "multiple"));
	free(b.p);

	b = header(1, 0);
	put_str(&b, "bad");
	put_u32(&b, 1);
	put_u64(&b, 32);
	put_u32(&b, 77); /* no such ggml type */
	put_u64(&b, 0);
	pad_to(&b, 32);
	put(&b, (uint8_t[64]){0}, 64);
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -ENOTSUP);
	free(b.p);

	b = header(1, 0);
	put_str(&b, "bad");
	put_u32(&b, 5); /* more than GGUF_MAX_DIMS */
	ck_assert_int_eq(parse_corrupt(&b, err, sizeof(err)), -EINVAL);
	free(b.p);
}
END_TEST

KVT_CHECK_MAIN("llm_gguf", 0, NULL, NULL, test_roundtrip_mmap, test_roundtrip_memory,
	       test_missing_file, test_truncated, test_bad_magic, test_bad_version,
	       test_offset_beyond_file, test_misaligned_offset, test_absurd_counts,
	       test_nested_array_and_duplicates, test_bad_tensor_info)
