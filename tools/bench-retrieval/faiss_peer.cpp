// SPDX-License-Identifier: MIT
// FAISS baselines for kvtier-bench-retrieval. Debian's libfaiss-dev 1.7.3 ships a static C++
// library without the C API, hence this small C++ file behind a C interface (faiss_peer.h).
#include <cerrno>
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <omp.h>

#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexIVFPQ.h>

#include "faiss_peer.h"

struct fpeer {
	enum fpeer_kind kind;
	size_t nlist;				 // IVFPQ
	std::unique_ptr<faiss::Index> quantizer; // IVF coarse quantizer, owned here
	std::unique_ptr<faiss::Index> index;
	std::string desc;
	std::vector<float> dist;
	std::vector<faiss::Index::idx_t> labels;
};

static size_t
pow2_floor(size_t v)
{
	size_t p = 1;

	while (p * 2 <= v)
		p *= 2;
	return p;
}

extern "C" int
fpeer_build(enum fpeer_kind kind, const float *keys, size_t n, unsigned int d, size_t ntrain,
	    struct fpeer **ret_peer)
{
	try {
		std::unique_ptr<fpeer> p(new fpeer);

		omp_set_num_threads(1); // the benchmark compares single-thread costs
		p->kind = kind;
		p->nlist = 0;
		switch (kind) {
		case FPEER_FLAT:
			p->index.reset(new faiss::IndexFlatIP(d));
			p->index->add((faiss::Index::idx_t)n, keys);
			p->desc = "IndexFlatIP";
			break;
		case FPEER_IVFPQ: {
			// nlist: ~64 training keys per list, a power of two in [16, 1024]; nprobe:
			// 1/8 of the lists, the same order as kvtier's 10 % candidate set.
			size_t nlist = pow2_floor(ntrain / 64);

			nlist = nlist < 16 ? 16 : nlist > 1024 ? 1024 : nlist;
			p->quantizer.reset(new faiss::IndexFlatIP(d));
			auto *ivf = new faiss::IndexIVFPQ(p->quantizer.get(), d, nlist, d / 4, 8,
							  faiss::METRIC_INNER_PRODUCT);
			p->index.reset(ivf);
			ivf->verbose = false;
			ivf->train((faiss::Index::idx_t)ntrain, keys);
			ivf->add((faiss::Index::idx_t)n, keys);
			ivf->nprobe = nlist / 8;
			p->nlist = nlist;
			p->desc = "IndexIVFPQ nlist " + std::to_string(nlist) + " M " +
				  std::to_string(d / 4) + "x8 nprobe " + std::to_string(nlist / 8);
			break;
		}
		case FPEER_HNSW: {
			auto *h = new faiss::IndexHNSWFlat(d, 32, faiss::METRIC_INNER_PRODUCT);
			p->index.reset(h);
			h->hnsw.efConstruction = 40;
			h->hnsw.efSearch = 256;
			h->add((faiss::Index::idx_t)n, keys);
			p->desc = "IndexHNSWFlat M 32 efC 40 efS 256";
			break;
		}
		default:
			return -EINVAL;
		}
		*ret_peer = p.release();
		return 0;
	} catch (const std::bad_alloc &) {
		return -ENOMEM;
	} catch (const std::exception &e) {
		std::fprintf(stderr, "faiss: %s\n", e.what());
		return -EIO;
	}
}

extern "C" int
fpeer_search(struct fpeer *p, const float *q, unsigned int k, int64_t *ret_ids)
{
	try {
		p->dist.resize(k);
		p->labels.resize(k);
		p->index->search(1, q, k, p->dist.data(), p->labels.data());
		for (unsigned int i = 0; i < k; i++)
			ret_ids[i] = (int64_t)p->labels[i];
		return 0;
	} catch (const std::exception &e) {
		std::fprintf(stderr, "faiss: %s\n", e.what());
		return -EIO;
	}
}

extern "C" int
fpeer_knob(struct fpeer *p, unsigned int value)
{
	if (p->kind == FPEER_IVFPQ) {
		auto *ivf = static_cast<faiss::IndexIVFPQ *>(p->index.get());

		ivf->nprobe = value < 1 ? 1 : value > p->nlist ? p->nlist : value;
		p->desc = "IndexIVFPQ nlist " + std::to_string(p->nlist) + " M " +
			  std::to_string(ivf->pq.M) + "x8 nprobe " + std::to_string(ivf->nprobe);
		return (int)ivf->nprobe;
	}
	if (p->kind == FPEER_HNSW) {
		auto *h = static_cast<faiss::IndexHNSWFlat *>(p->index.get());

		h->hnsw.efSearch = (int)value;
		p->desc = "IndexHNSWFlat M 32 efC 40 efS " + std::to_string(value);
		return (int)value;
	}
	return -EINVAL;
}

extern "C" unsigned int
fpeer_knob_max(const struct fpeer *p)
{
	return p->kind == FPEER_IVFPQ ? (unsigned int)p->nlist : 0;
}

extern "C" const char *
fpeer_describe(const struct fpeer *p)
{
	return p->desc.c_str();
}

extern "C" void
fpeer_free(struct fpeer *p)
{
	delete p;
}
