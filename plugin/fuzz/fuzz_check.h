/* SPDX-License-Identifier: Apache-2.0 */
/* The libFuzzer targets' invariant check: abort, so that libFuzzer keeps the input as a crash. */
#ifndef RH_FUZZ_CHECK_H
#define RH_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond)                                                                     \
	do {                                                                                 \
		if (!(cond)) {                                                               \
			fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, \
				#cond);                                                      \
			abort();                                                             \
		}                                                                            \
	} while (0)

#endif
