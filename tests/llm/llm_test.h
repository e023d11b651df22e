/* SPDX-License-Identifier: MIT */
/*
 * Shared by the tests that need the real model: find it where tools/fetch-model.sh puts it, or
 * skip (exit 77, ctest SKIP_RETURN_CODE) with a message saying how to get it.
 */
#ifndef KVT_TEST_LLM_H
#define KVT_TEST_LLM_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "generate.h"

#define SKIP_CODE 77

static char llm_test_path[PATH_MAX];

static inline const char *
llm_test_model_or_skip(const char *test)
{
	if (llm_default_model_path(llm_test_path, sizeof(llm_test_path)) < 0 ||
	    access(llm_test_path, R_OK) < 0) {
		fprintf(
		    stderr,
		    "%s: SKIP: model %s not found; run tools/fetch-model.sh (or set KVT_MODEL / "
		    "KVT_MODEL_DIR)\n",
		    test, llm_test_path[0] ? llm_test_path : LLM_MODEL_FILE);
		exit(SKIP_CODE);
	}
	return llm_test_path;
}

#endif /* KVT_TEST_LLM_H */
