/* SPDX-License-Identifier: MIT */
/* Uses the installed header and library only: connecting to no daemon must fail cleanly. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <kvtier.h>

int
main(void)
{
	struct kvt_client *c = NULL;
	int r = kvt_connect("/nonexistent/kvtierd.sock", NULL, &c);

	if (r != -ENOENT || c) {
		fprintf(stderr, "kvt_connect: %d (%s), want -ENOENT\n", r, kvt_strerror(r));
		return 1;
	}
	printf("ok: %s\n", kvt_strerror(r));
	return 0;
}
