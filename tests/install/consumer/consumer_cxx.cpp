// SPDX-License-Identifier: MIT
// A C++ consumer: kvtier.h and kvt_abi.h must compile as C++ (static asserts, extern "C").
#include <cerrno>
#include <cstdio>

#include <kvtier.h>

static_assert(sizeof(kvt_sqe) == 64, "kvt_sqe seen from C++");
static_assert(sizeof(kvt_seq_params) == 160, "kvt_seq_params seen from C++");

int
main()
{
	kvt_client *c = nullptr;
	int r = kvt_connect("/nonexistent/kvtierd.sock", nullptr, &c);

	if (r != -ENOENT || c) {
		std::fprintf(stderr, "kvt_connect: %d (%s), want -ENOENT\n", r, kvt_strerror(r));
		return 1;
	}
	std::printf("ok (C++): %s\n", kvt_strerror(r));
	return 0;
}
