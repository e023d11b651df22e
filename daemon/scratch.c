/* SPDX-License-Identifier: MIT */
#include <stdlib.h>

#include "scratch.h"

void *
kvtd_scratch_get(struct kvtd_scratch *sc, unsigned i, size_t size)
{
	void *p;

	if (size <= sc->size[i])
		return sc->buf[i];
	/* Room to spare, so a sequence that grows a little does not reallocate every op. */
	size = (size + size / 4 + 4095) & ~(size_t)4095;
	p = aligned_alloc(64, size);
	if (!p)
		return NULL;
	free(sc->buf[i]);
	sc->buf[i] = p;
	sc->size[i] = size;
	sc->grows++;
	return p;
}

void
kvtd_scratch_fini(struct kvtd_scratch *sc)
{
	for (unsigned i = 0; i < KVTD_SCRATCH_BUFS; i++) {
		free(sc->buf[i]);
		sc->buf[i] = NULL;
		sc->size[i] = 0;
	}
}
