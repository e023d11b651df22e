/* SPDX-License-Identifier: MIT */
/*
 * kvdump.c - writer of the key/query dump (kvdump.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvdump.h"
#include "llm_quant.h"
#include "model.h"

struct llm_kvdump {
	int fd;
	struct llm_kvdump_hdr hdr;
	uint64_t seq_tokens; /* records of this sequence written so far */
	uint8_t *rec;	     /* one token record */
};

static int
write_all(int fd, const void *buf, size_t len, off_t off)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t w = pwrite(fd, p, len, off);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		len -= (size_t)w;
		off += w;
	}
	return 0;
}

int
llm_kvdump_open(const char *path, const struct llm_config *cfg, struct llm_kvdump **ret_d,
		char *err, size_t errlen)
{
	struct llm_kvdump *d = calloc(1, sizeof(*d));
	struct llm_kvdump_hdr *h;
	struct stat st;
	const char *why;
	int ret;

	if (!d)
		return -ENOMEM;
	h = &d->hdr;
	d->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (d->fd < 0) {
		ret = -errno;
		snprintf(err, errlen, "cannot open %s: %s", path, strerror(-ret));
		goto err_free;
	}
	if (fstat(d->fd, &st) < 0) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(-ret));
		goto err_close;
	}
	if (st.st_size == 0) {
		memcpy(h->magic, LLM_KVDUMP_MAGIC, sizeof(h->magic));
		h->version = LLM_KVDUMP_VERSION;
		h->hdr_bytes = sizeof(*h);
		h->layers = cfg->n_layer;
		h->kv_heads = cfg->n_head_kv;
		h->q_heads = cfg->n_head;
		h->head_dim = cfg->head_dim;
		h->dtype = LLM_KVDUMP_F16;
		h->rec_bytes =
		    (uint32_t)llm_kvdump_rec_bytes(h->layers, h->kv_heads, h->q_heads, h->head_dim);
		ret = write_all(d->fd, h, sizeof(*h), 0);
		if (ret < 0) {
			snprintf(err, errlen, "%s: %s", path, strerror(-ret));
			goto err_close;
		}
	} else {
		ssize_t r = pread(d->fd, h, sizeof(*h), 0);

		if (r < 0) {
			ret = -errno;
			snprintf(err, errlen, "%s: %s", path, strerror(-ret));
			goto err_close;
		}
		ret = -EINVAL;
		why = r == (ssize_t)sizeof(*h) ? llm_kvdump_hdr_check(h, (uint64_t)st.st_size)
					       : "shorter than a dump header";
		if (why) {
			snprintf(err, errlen, "%s: %s; remove it or pick another file", path, why);
			goto err_close;
		}
		if (h->layers != cfg->n_layer || h->kv_heads != cfg->n_head_kv ||
		    h->q_heads != cfg->n_head || h->head_dim != cfg->head_dim) {
			snprintf(err, errlen,
				 "%s holds another model's keys (%u layers, %u/%u heads, head_dim "
				 "%u); remove it or pick another file",
				 path, h->layers, h->q_heads, h->kv_heads, h->head_dim);
			goto err_close;
		}
		/* drop the uncounted tail of a run that did not finish */
		if (ftruncate(d->fd, (off_t)(sizeof(*h) + h->n_tokens * h->rec_bytes)) < 0) {
			ret = -errno;
			snprintf(err, errlen, "%s: %s", path, strerror(-ret));
			goto err_close;
		}
	}
	d->rec = calloc(1, h->rec_bytes);
	if (!d->rec) {
		ret = -ENOMEM;
		goto err_close;
	}
	*ret_d = d;
	return 0;

err_close:
	close(d->fd);
err_free:
	free(d);
	return ret;
}

void
llm_kvdump_layer(struct llm_kvdump *d, uint32_t layer, const float *q, const float *k)
{
	const struct llm_kvdump_hdr *h = &d->hdr;
	uint32_t kn = h->kv_heads * h->head_dim, qn = h->q_heads * h->head_dim;
	uint16_t *kd = (uint16_t *)(d->rec + 8) + (size_t)layer * kn;
	uint16_t *qd = (uint16_t *)(d->rec + 8) + (size_t)h->layers * kn + (size_t)layer * qn;

	for (uint32_t i = 0; i < kn; i++)
		kd[i] = llm_f32_to_f16(k[i]);
	for (uint32_t i = 0; i < qn; i++)
		qd[i] = llm_f32_to_f16(q[i]);
}

int
llm_kvdump_token(struct llm_kvdump *d, uint32_t pos)
{
	const struct llm_kvdump_hdr *h = &d->hdr;
	uint32_t id[2] = {h->n_seqs, pos};

	memcpy(d->rec, id, sizeof(id));
	return write_all(d->fd, d->rec, h->rec_bytes,
			 (off_t)(sizeof(*h) + (h->n_tokens + d->seq_tokens++) * h->rec_bytes));
}

int
llm_kvdump_close(struct llm_kvdump *d)
{
	int ret;

	if (!d)
		return 0;
	d->hdr.n_tokens += d->seq_tokens;
	d->hdr.n_seqs++;
	/* records first, then the header that counts them */
	ret = fdatasync(d->fd) < 0 ? -errno : 0;
	if (!ret)
		ret = write_all(d->fd, &d->hdr, sizeof(d->hdr), 0);
	if (close(d->fd) < 0 && !ret)
		ret = -errno;
	free(d->rec);
	free(d);
	return ret;
}

void
llm_kvdump_discard(struct llm_kvdump *d)
{
	close(d->fd);
	free(d->rec);
	free(d);
}
