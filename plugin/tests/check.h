/* SPDX-License-Identifier: Apache-2.0 */
/* Minimal test helpers: EXPECT / EXPECT_EQ count failures; TEST_DONE returns 1 if any failed. */
#ifndef RH_TEST_CHECK_H
#define RH_TEST_CHECK_H

#include <stdio.h>

static int test_failures;

#define EXPECT(cond)                                                                        \
	do {                                                                                \
		if (!(cond)) {                                                              \
			fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
			test_failures++;                                                    \
		}                                                                           \
	} while (0)

#define EXPECT_EQ(a, b)                                                                       \
	do {                                                                                  \
		long long a_ = (long long)(a), b_ = (long long)(b);                           \
		if (a_ != b_) {                                                               \
			fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, \
				__LINE__, #a, a_, #b, b_);                                    \
			test_failures++;                                                      \
		}                                                                             \
	} while (0)

#define TEST_DONE()                                                             \
	do {                                                                    \
		if (test_failures) {                                            \
			fprintf(stderr, "%d check(s) failed\n", test_failures); \
		}                                                               \
		return test_failures ? 1 : 0;                                   \
	} while (0)

#endif
