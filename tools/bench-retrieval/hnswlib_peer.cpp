// SPDX-License-Identifier: MIT
// hnswlib baseline for kvtier-bench-retrieval (Debian's libhnswlib-dev, header only), behind the
// C interface in hnswlib_peer.h.
#include <algorithm>
#include <cmath>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <hnswlib/hnswlib.h>

#include "hnswlib_peer.h"

struct hpeer {
	std::unique_ptr<hnswlib::SpaceInterface<float>> space;
	std::unique_ptr<hnswlib::HierarchicalNSW<float>> graph;
	unsigned int d;
	bool l2;		// the MIPS-to-L2 reduction: keys and queries one dim longer
	std::vector<float> qbuf; // the query, padded
	std::string desc;
};

extern "C" int
hpeer_build(const float *keys, size_t n, unsigned int d, unsigned int m, unsigned int efc,
	    unsigned int threads, bool l2, struct hpeer **ret_peer)
{
	if (!n || !d || !m || !efc || !threads)
		return -EINVAL;
	try {
		std::unique_ptr<hpeer> p(new hpeer);
		std::atomic<size_t> next(1);
		std::vector<std::thread> pool;
		std::atomic<bool> failed(false);
		std::vector<float> aug; // l2: [key, sqrt(max |k|^2 - |key|^2)]
		const unsigned int da = l2 ? d + 1 : d;

		p->d = d;
		p->l2 = l2;
		if (l2) {
			double mx = 0.0;

			aug.resize(n * da);
			for (size_t i = 0; i < n; i++) {
				double s = 0.0;

				for (unsigned int j = 0; j < d; j++) {
					aug[i * da + j] = keys[i * d + j];
					s += (double)keys[i * d + j] * keys[i * d + j];
				}
				aug[i * da + d] = (float)s;
				mx = std::max(mx, s);
			}
			for (size_t i = 0; i < n; i++)
				aug[i * da + d] = (float)std::sqrt(std::max(0.0, mx - aug[i * da + d]));
			p->qbuf.assign(da, 0.0f);
			p->space.reset(new hnswlib::L2Space(da));
		} else {
			p->space.reset(new hnswlib::InnerProductSpace(d));
		}
		const float *base = l2 ? aug.data() : keys;

		p->graph.reset(new hnswlib::HierarchicalNSW<float>(p->space.get(), n, m, efc, 100));
		// The first point alone, so every thread starts from an entry point.
		p->graph->addPoint(base, 0);
		auto insert = [&]() {
			try {
				for (size_t i; !failed && (i = next.fetch_add(1)) < n;)
					p->graph->addPoint(base + i * da, i);
			} catch (const std::exception &e) {
				std::fprintf(stderr, "hnswlib: %s\n", e.what());
				failed = true;
			}
		};
		for (unsigned int t = 1; t < threads; t++)
			pool.emplace_back(insert);
		insert();
		for (auto &t : pool)
			t.join();
		if (failed)
			return -EIO;
		p->desc = std::string(l2 ? "hnswlib L2-reduced" : "hnswlib IP") + " M " +
			  std::to_string(m) + " efC " + std::to_string(efc) +
			  " (built on " + std::to_string(threads) + " threads)";
		*ret_peer = p.release();
		return 0;
	} catch (const std::bad_alloc &) {
		return -ENOMEM;
	} catch (const std::exception &e) {
		std::fprintf(stderr, "hnswlib: %s\n", e.what());
		return -EIO;
	}
}

extern "C" int
hpeer_search(struct hpeer *p, const float *q, unsigned int k, unsigned int ef, int64_t *ret_ids)
{
	try {
		if (p->l2) {
			std::copy(q, q + p->d, p->qbuf.begin());
			q = p->qbuf.data();
		}
		p->graph->setEf(std::max(ef, k));
		auto res = p->graph->searchKnn(q, k);
		// A max-heap on distance (1 - inner product): popped worst first.
		size_t got = res.size();

		for (size_t i = got; i < k; i++)
			ret_ids[i] = -1;
		for (size_t i = got; i-- > 0; res.pop())
			ret_ids[i] = (int64_t)res.top().second;
		return 0;
	} catch (const std::exception &e) {
		std::fprintf(stderr, "hnswlib: %s\n", e.what());
		return -EIO;
	}
}

extern "C" const char *
hpeer_describe(const struct hpeer *p)
{
	return p->desc.c_str();
}

extern "C" void
hpeer_free(struct hpeer *p)
{
	delete p;
}
