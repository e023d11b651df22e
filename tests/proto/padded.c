/* SPDX-License-Identifier: MIT */
/*
 * Compiled, never run, with -Wpadded -Werror: every ABI struct spells out its padding, so no
 * compiler can lay it out differently from the _Static_asserts. Only <stdint.h>-level headers
 * may be needed by proto/.
 */
#include "kvt_abi.h"
#include "kvt_ctl.h"
#include "kvt_ring.h"

int
main(void)
{
	return 0;
}
