/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"

/* A cursor over the untrusted image; every read checks the bytes left first. */
struct rd {
	const uint8_t *p;
	size_t size;
	size_t off;
	char *err;
	size_t errlen;
};

static int
fail(struct rd *r, int code, const char *fmt, ...)
{
	va_list ap;
	int n = 0;

	if (r->errlen) {
		va_start(ap, fmt);
		n = vsnprintf(r->err, r->errlen, fmt, ap);
		va_end(ap);
		if (n >= 0 && (size_t)n < r->errlen)
			snprintf(r->err + n, r->errlen - n, " (at byte %zu)", r->off);
	}
	return code;
}

static int
rd_bytes(struct rd *r, size_t n, const void **ret_p, const char *what)
{
	if (n > r->size - r->off)
		return fail(r, -EINVAL, "truncated file: %s needs %zu bytes, %zu left", what, n,
			    r->size - r->off);
	*ret_p = r->p + r->off;
	r->off += n;
	return 0;
}

/* Little-endian fixed-width reads; the host is little-endian (x86-64, aarch64) as GGUF is. */
#define RD_FN(name, type)                                                                          \
	static int name(struct rd *r, type *ret_v, const char *what)                               \
	{                                                                                          \
		const void *p = NULL;                                                              \
		int ret = rd_bytes(r, sizeof(type), &p, what);                                     \
		if (ret < 0)                                                                       \
			return ret;                                                                \
		memcpy(ret_v, p, sizeof(type));                                                    \
		return 0;                                                                          \
	}
RD_FN(rd_u32, uint32_t)
RD_FN(rd_u64, uint64_t)

static int
rd_str(struct rd *r, struct gguf_str *ret_s, const char *what)
{
	uint64_t len;
	const void *p = NULL;
	int ret;

	ret = rd_u64(r, &len, what);
	if (ret < 0)
		return ret;
	if (len > r->size - r->off)
		return fail(r, -EINVAL, "truncated file: %s of %llu bytes, %zu left", what,
			    (unsigned long long)len, r->size - r->off);
	ret = rd_bytes(r, (size_t)len, &p, what);
	if (ret < 0)
		return ret;
	ret_s->ptr = p;
	ret_s->len = len;
	return 0;
}

static size_t
scalar_size(uint32_t type)
{
	switch (type) {
	case GGUF_TYPE_UINT8:
	case GGUF_TYPE_INT8:
	case GGUF_TYPE_BOOL:
		return 1;
	case GGUF_TYPE_UINT16:
	case GGUF_TYPE_INT16:
		return 2;
	case GGUF_TYPE_UINT32:
	case GGUF_TYPE_INT32:
	case GGUF_TYPE_FLOAT32:
		return 4;
	case GGUF_TYPE_UINT64:
	case GGUF_TYPE_INT64:
	case GGUF_TYPE_FLOAT64:
		return 8;
	default:
		return 0;
	}
}

static void
decode_scalar(uint32_t type, const void *p, struct gguf_value *v)
{
	switch (type) {
	case GGUF_TYPE_UINT8: {
		uint8_t x;
		memcpy(&x, p, 1);
		v->u64 = x;
		break;
	}
	case GGUF_TYPE_INT8: {
		int8_t x;
		memcpy(&x, p, 1);
		v->i64 = x;
		break;
	}
	case GGUF_TYPE_UINT16: {
		uint16_t x;
		memcpy(&x, p, 2);
		v->u64 = x;
		break;
	}
	case GGUF_TYPE_INT16: {
		int16_t x;
		memcpy(&x, p, 2);
		v->i64 = x;
		break;
	}
	case GGUF_TYPE_UINT32: {
		uint32_t x;
		memcpy(&x, p, 4);
		v->u64 = x;
		break;
	}
	case GGUF_TYPE_INT32: {
		int32_t x;
		memcpy(&x, p, 4);
		v->i64 = x;
		break;
	}
	case GGUF_TYPE_FLOAT32: {
		float x;
		memcpy(&x, p, 4);
		v->f64 = x;
		break;
	}
	case GGUF_TYPE_BOOL: {
		uint8_t x;
		memcpy(&x, p, 1);
		v->b = x != 0;
		break;
	}
	case GGUF_TYPE_UINT64:
		memcpy(&v->u64, p, 8);
		break;
	case GGUF_TYPE_INT64:
		memcpy(&v->i64, p, 8);
		break;
	case GGUF_TYPE_FLOAT64:
		memcpy(&v->f64, p, 8);
		break;
	}
}

static int
rd_value(struct rd *r, uint32_t type, struct gguf_value *v, const struct gguf_str *key)
{
	const void *p = NULL;
	size_t sz;
	int ret;

	v->type = type;
	if (type == GGUF_TYPE_STRING)
		return rd_str(r, &v->str, "string value");
	if (type == GGUF_TYPE_ARRAY) {
		uint32_t et;
		uint64_t n;

		ret = rd_u32(r, &et, "array type");
		if (ret < 0)
			return ret;
		ret = rd_u64(r, &n, "array length");
		if (ret < 0)
			return ret;
		v->arr.type = et;
		v->arr.n = n;
		v->arr.data = NULL;
		v->arr.strs = NULL;
		if (et == GGUF_TYPE_ARRAY)
			return fail(r, -ENOTSUP, "key '%.*s': nested arrays are not supported",
				    (int)key->len, key->ptr);
		if (et == GGUF_TYPE_STRING) {
			/* Each element takes at least its 8-byte length: bound n before allocating.
			 */
			if (n > (r->size - r->off) / 8)
				return fail(r, -EINVAL, "key '%.*s': %llu strings cannot fit",
					    (int)key->len, key->ptr, (unsigned long long)n);
			v->arr.strs = calloc(n ? n : 1, sizeof(*v->arr.strs));
			if (!v->arr.strs)
				return -ENOMEM;
			for (uint64_t i = 0; i < n; i++) {
				ret = rd_str(r, &v->arr.strs[i], "array string");
				if (ret < 0)
					return ret;
			}
			return 0;
		}
		sz = scalar_size(et);
		if (!sz)
			return fail(r, -EINVAL, "key '%.*s': bad array element type %u",
				    (int)key->len, key->ptr, et);
		if (n > (r->size - r->off) / sz)
			return fail(r, -EINVAL, "truncated file: array '%.*s' of %llu elements",
				    (int)key->len, key->ptr, (unsigned long long)n);
		ret = rd_bytes(r, (size_t)(n * sz), &p, "array data");
		if (ret < 0)
			return ret;
		v->arr.data = p;
		return 0;
	}
	sz = scalar_size(type);
	if (!sz)
		return fail(r, -EINVAL, "key '%.*s': bad value type %u", (int)key->len, key->ptr,
			    type);
	ret = rd_bytes(r, sz, &p, "value");
	if (ret < 0)
		return ret;
	decode_scalar(type, p, v);
	return 0;
}

uint32_t
ggml_blck_size(uint32_t type)
{
	switch (type) {
	case GGML_TYPE_F32:
	case GGML_TYPE_F16:
	case GGML_TYPE_BF16:
	case GGML_TYPE_I8:
	case GGML_TYPE_I16:
	case GGML_TYPE_I32:
	case GGML_TYPE_I64:
	case GGML_TYPE_F64:
		return 1;
	case GGML_TYPE_Q4_0:
	case GGML_TYPE_Q4_1:
	case GGML_TYPE_Q5_0:
	case GGML_TYPE_Q5_1:
	case GGML_TYPE_Q8_0:
	case GGML_TYPE_Q8_1:
		return 32;
	case GGML_TYPE_Q2_K:
	case GGML_TYPE_Q3_K:
	case GGML_TYPE_Q4_K:
	case GGML_TYPE_Q5_K:
	case GGML_TYPE_Q6_K:
	case GGML_TYPE_Q8_K:
		return 256;
	default:
		return 0;
	}
}

uint32_t
ggml_type_size(uint32_t type)
{
	switch (type) {
	case GGML_TYPE_F32:
		return 4;
	case GGML_TYPE_F16:
	case GGML_TYPE_BF16:
		return 2;
	case GGML_TYPE_Q4_0:
		return 18;
	case GGML_TYPE_Q4_1:
		return 20;
	case GGML_TYPE_Q5_0:
		return 22;
	case GGML_TYPE_Q5_1:
		return 24;
	case GGML_TYPE_Q8_0:
		return 34;
	case GGML_TYPE_Q8_1:
		return 36;
	case GGML_TYPE_Q2_K:
		return 84;
	case GGML_TYPE_Q3_K:
		return 110;
	case GGML_TYPE_Q4_K:
		return 144;
	case GGML_TYPE_Q5_K:
		return 176;
	case GGML_TYPE_Q6_K:
		return 210;
	case GGML_TYPE_Q8_K:
		return 292;
	case GGML_TYPE_I8:
		return 1;
	case GGML_TYPE_I16:
		return 2;
	case GGML_TYPE_I32:
		return 4;
	case GGML_TYPE_I64:
	case GGML_TYPE_F64:
		return 8;
	default:
		return 0;
	}
}

const char *
ggml_type_name(uint32_t type)
{
	static const char *const names[] = {
	    [GGML_TYPE_F32] = "F32",   [GGML_TYPE_F16] = "F16",	  [GGML_TYPE_Q4_0] = "Q4_0",
	    [GGML_TYPE_Q4_1] = "Q4_1", [GGML_TYPE_Q5_0] = "Q5_0", [GGML_TYPE_Q5_1] = "Q5_1",
	    [GGML_TYPE_Q8_0] = "Q8_0", [GGML_TYPE_Q8_1] = "Q8_1", [GGML_TYPE_Q2_K] = "Q2_K",
	    [GGML_TYPE_Q3_K] = "Q3_K", [GGML_TYPE_Q4_K] = "Q4_K", [GGML_TYPE_Q5_K] = "Q5_K",
	    [GGML_TYPE_Q6_K] = "Q6_K", [GGML_TYPE_Q8_K] = "Q8_K", [GGML_TYPE_I8] = "I8",
	    [GGML_TYPE_I16] = "I16",   [GGML_TYPE_I32] = "I32",	  [GGML_TYPE_I64] = "I64",
	    [GGML_TYPE_F64] = "F64",   [GGML_TYPE_BF16] = "BF16",
	};

	if (type < sizeof(names) / sizeof(names[0]) && names[type])
		return names[type];
	return "unknown";
}

const char *
gguf_type_name(uint32_t type)
{
	static const char *const names[GGUF_TYPE__COUNT] = {
	    "u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
	    "bool", "string", "array", "u64", "i64", "f64",
	};

	return type < GGUF_TYPE__COUNT ? names[type] : "unknown";
}

static int
parse_tensor(struct rd *r, struct gguf_tensor *t)
{
	uint64_t blocks;
	uint32_t bs, ts;
	int ret;

	ret = rd_str(r, &t->name, "tensor name");
	if (ret < 0)
		return ret;
	ret = rd_u32(r, &t->n_dims, "tensor dims");
	if (ret < 0)
		return ret;
	if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
		return fail(r, -EINVAL, "tensor '%.*s': %u dimensions", (int)t->name.len,
			    t->name.ptr, t->n_dims);
	t->n_elements = 1;
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
		t->ne[d] = 1;
		if (d >= t->n_dims)
			continue;
		ret = rd_u64(r, &t->ne[d], "tensor dim");
		if (ret < 0)
			return ret;
		/* Cap every product at 2^62 so size arithmetic below cannot wrap. */
		if (t->ne[d] == 0 || t->ne[d] > (UINT64_C(1) << 62) / t->n_elements)
			return fail(r, -EINVAL, "tensor '%.*s': bad dimension %llu",
				    (int)t->name.len, t->name.ptr, (unsigned long long)t->ne[d]);
		t->n_elements *= t->ne[d];
	}
	ret = rd_u32(r, &t->type, "tensor type");
	if (ret < 0)
		return ret;
	ret = rd_u64(r, &t->offset, "tensor offset");
	if (ret < 0)
		return ret;
	bs = ggml_blck_size(t->type);
	ts = ggml_type_size(t->type);
	if (!bs || !ts)
		return fail(r, -ENOTSUP, "tensor '%.*s': unsupported ggml type %u",
			    (int)t->name.len, t->name.ptr, t->type);
	if (t->ne[0] % bs)
		return fail(r, -EINVAL,
			    "tensor '%.*s': row of %llu is not a multiple of the %s block %u",
			    (int)t->name.len, t->name.ptr, (unsigned long long)t->ne[0],
			    ggml_type_name(t->type), bs);
	blocks = t->n_elements / bs;
	t->size = blocks * ts;
	return 0;
}

static bool
str_eq(struct gguf_str a, struct gguf_str b)
{
	return a.len == b.len && !memcmp(a.ptr, b.ptr, a.len);
}

static int
parse(struct gguf_file *f, char *err, size_t errlen)
{
	struct rd r = {.p = f->base, .size = f->size, .err = err, .errlen = errlen};
	uint32_t magic;
	uint64_t data_size;
	int ret;

	ret = rd_u32(&r, &magic, "magic");
	if (ret < 0)
		return ret;
	if (magic != GGUF_MAGIC)
		return fail(&r, -EINVAL, "bad magic 0x%08x, not a GGUF file", magic);
	ret = rd_u32(&r, &f->version, "version");
	if (ret < 0)
		return ret;
	if (f->version != 2 && f->version != 3)
		return fail(&r, -ENOTSUP, "GGUF version %u is not supported (2 or 3)", f->version);
	ret = rd_u64(&r, &f->n_tensors, "tensor count");
	if (ret < 0)
		return ret;
	ret = rd_u64(&r, &f->n_kv, "metadata count");
	if (ret < 0)
		return ret;
	/* A key/value pair takes at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 8 + 4 + 8. */
	if (f->n_kv > (r.size - r.off) / 13 || f->n_tensors > (r.size - r.off) / 32)
		return fail(&r, -EINVAL, "counts (%llu keys, %llu tensors) cannot fit in the file",
			    (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors);
	f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof(*f->kv));
	f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof(*f->tensors));
	if (!f->kv || !f->tensors)
		return -ENOMEM;

	f->alignment = GGUF_DEFAULT_ALIGNMENT;
	for (uint64_t i = 0; i < f->n_kv; i++) {
		struct gguf_kv *kv = &f->kv[i];
		uint32_t type;

		ret = rd_str(&r, &kv->key, "key");
		if (ret < 0)
			return ret;
		for (uint64_t j = 0; j < i; j++)
			if (str_eq(f->kv[j].key, kv->key))
				return fail(&r, -EINVAL, "duplicate key '%.*s'", (int)kv->key.len,
					    kv->key.ptr);
		ret = rd_u32(&r, &type, "value type");
		if (ret < 0)
			return ret;
		ret = rd_value(&r, type, &kv->val, &kv->key);
		if (ret < 0)
			return ret;
		if (gguf_str_eq(kv->key, "general.alignment")) {
			if (type != GGUF_TYPE_UINT32 || kv->val.u64 == 0 ||
			    (kv->val.u64 & (kv->val.u64 - 1)))
				return fail(&r, -EINVAL,
					    "general.alignment must be a u32 power of two");
			f->alignment = (uint32_t)kv->val.u64;
		}
	}
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		ret = parse_tensor(&r, &f->tensors[i]);
		if (ret < 0)
			return ret;
		for (uint64_t j = 0; j < i; j++)
			if (str_eq(f->tensors[j].name, f->tensors[i].name))
				return fail(&r, -EINVAL, "duplicate tensor '%.*s'",
					    (int)f->tensors[i].name.len, f->tensors[i].name.ptr);
	}

	f->data_off = (r.off + f->alignment - 1) & ~(uint64_t)(f->alignment - 1);
	if (f->data_off > f->size) {
		if (f->n_tensors)
			return fail(&r, -EINVAL, "truncated file: no data section");
		f->data_off = f->size; /* metadata-only file */
	}
	data_size = f->size - f->data_off;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		struct gguf_tensor *t = &f->tensors[i];

		if (t->offset % f->alignment)
			return fail(&r, -EINVAL, "tensor '%.*s': offset %llu not aligned to %u",
				    (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
				    f->alignment);
		if (t->offset > data_size || t->size > data_size - t->offset)
			return fail(
			    &r, -EINVAL,
			    "tensor '%.*s': bytes [%llu, +%llu) lie beyond the data section "
			    "of %llu bytes (truncated file?)",
			    (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
			    (unsigned long long)t->size, (unsigned long long)data_size);
		t->data = f->base + f->data_off + t->offset;
	}
	return 0;
}

int
gguf_parse(const void *buf, size_t size, struct gguf_file **ret_file, char *err, size_t errlen)
{
	struct gguf_file *f;
	int ret;

	if (errlen)
		err[0] = '\0';
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->base = buf;
	f->size = size;
	ret = parse(f, err, errlen);
	if (ret < 0) {
		if (ret == -ENOMEM && errlen)
			snprintf(err, errlen, "out of memory");
		gguf_close(f);
		return ret;
	}
	*ret_file = f;
	return 0;
}

int
gguf_open(const char *path, struct gguf_file **ret_file, char *err, size_t errlen)
{
	struct gguf_file *f;
	struct stat st;
	void *map;
	int fd, ret;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		if (errlen)
			snprintf(err, errlen, "cannot open %s: %s", path, strerror(-ret));
		return ret;
	}
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		goto err_close;
	}
	if (st.st_size < 24) {
		if (errlen)
			snprintf(err, errlen, "%s: %lld bytes is too short for a GGUF file", path,
				 (long long)st.st_size);
		ret = -EINVAL;
		goto err_close_quiet;
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		ret = -errno;
		goto err_close;
	}
	close(fd);
	ret = gguf_parse(map, (size_t)st.st_size, &f, err, errlen);
	if (ret < 0) {
		munmap(map, (size_t)st.st_size);
		return ret;
	}
	f->mapped = true;
	*ret_file = f;
	return 0;

err_close:
	if (errlen)
		snprintf(err, errlen, "%s: %s", path, strerror(-ret));
err_close_quiet:
	close(fd);
	return ret;
}

void
gguf_close(struct gguf_file *f)
{
	if (!f)
		return;
	if (f->kv)
		for (uint64_t i = 0; i < f->n_kv; i++)
			if (f->kv[i].val.type == GGUF_TYPE_ARRAY)
				free(f->kv[i].val.arr.strs);
	free(f->kv);
	free(f->tensors);
	if (f->mapped)
		munmap((void *)f->base, f->size);
	free(f);
}

bool
gguf_str_eq(struct gguf_str s, const char *cstr)
{
	size_t n = strlen(cstr);

	return s.len == n && !memcmp(s.ptr, cstr, n);
}

const struct gguf_kv *
gguf_find_kv(const struct gguf_file *f, const char *key)
{
	for (uint64_t i = 0; i < f->n_kv; i++)
		if (gguf_str_eq(f->kv[i].key, key))
			return &f->kv[i];
	return NULL;
}

const struct gguf_tensor *
gguf_find_tensor(const struct gguf_file *f, const char *name)
{
	for (uint64_t i = 0; i < f->n_tensors; i++)
		if (gguf_str_eq(f->tensors[i].name, name))
			return &f->tensors[i];
	return NULL;
}

static bool
is_signed(uint32_t type)
{
	return type == GGUF_TYPE_INT8 || type == GGUF_TYPE_INT16 || type == GGUF_TYPE_INT32 ||
	       type == GGUF_TYPE_INT64;
}

static bool
is_unsigned(uint32_t type)
{
	return type == GGUF_TYPE_UINT8 || type == GGUF_TYPE_UINT16 || type == GGUF_TYPE_UINT32 ||
	       type == GGUF_TYPE_UINT64;
}

int
gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *ret_val)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);

	if (!kv)
		return -ENOENT;
	if (is_unsigned(kv->val.type)) {
		if (kv->val.u64 > UINT32_MAX)
			return -ERANGE;
		*ret_val = (uint32_t)kv->val.u64;
		return 0;
	}
	if (is_signed(kv->val.type)) {
		if (kv->val.i64 < 0 || kv->val.i64 > UINT32_MAX)
			return -ERANGE;
		*ret_val = (uint32_t)kv->val.i64;
		return 0;
	}
	return -EINVAL;
}

int
gguf_get_f32(const struct gguf_file *f, const char *key, float *ret_val)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->val.type != GGUF_TYPE_FLOAT32 && kv->val.type != GGUF_TYPE_FLOAT64)
		return -EINVAL;
	*ret_val = (float)kv->val.f64;
	return 0;
}

int
gguf_get_bool(const struct gguf_file *f, const char *key, bool *ret_val)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->val.type != GGUF_TYPE_BOOL)
		return -EINVAL;
	*ret_val = kv->val.b;
	return 0;
}

int
gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *ret_val)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->val.type != GGUF_TYPE_STRING)
		return -EINVAL;
	*ret_val = kv->val.str;
	return 0;
}

int
gguf_get_arr(const struct gguf_file *f, const char *key, uint32_t elem_type, uint64_t *ret_n,
	     const struct gguf_kv **ret_kv)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->val.type != GGUF_TYPE_ARRAY || kv->val.arr.type != elem_type)
		return -EINVAL;
	*ret_n = kv->val.arr.n;
	*ret_kv = kv;
	return 0;
}

int64_t
gguf_arr_int(const struct gguf_value *v, uint64_t i)
{
	struct gguf_value e = {0};
	size_t sz = scalar_size(v->arr.type);

	if (!sz || i >= v->arr.n || v->arr.type == GGUF_TYPE_FLOAT32 ||
	    v->arr.type == GGUF_TYPE_FLOAT64)
		return 0;
	decode_scalar(v->arr.type, (const uint8_t *)v->arr.data + i * sz, &e);
	if (is_signed(v->arr.type))
		return e.i64;
	if (v->arr.type == GGUF_TYPE_BOOL)
		return e.b;
	return (int64_t)e.u64;
}
