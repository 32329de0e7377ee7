/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The harness's message contents: message k of connection c under a seed, 64-bit words
 * derived from one base (splitmix64 of seed, c, k). railhop-harness fills and checks with it;
 * so does any driver whose peer is a harness (plugin/tests/verbs_lifecycle.c).
 */
#ifndef RAILHOP_MSG_PATTERN_H
#define RAILHOP_MSG_PATTERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline uint64_t rh_msg_base(uint64_t seed, int c, long k)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)c << 40) ^ (uint64_t)k;

	x ^= x >> 31;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 29;
	return x | 1;
}

static inline void rh_msg_fill(uint64_t seed, char *buf, size_t size, int c, long k)
{
	uint64_t b = rh_msg_base(seed, c, k), *w = (uint64_t *)buf;
	size_t nw = size / 8;

	for (size_t i = 0; i < nw; i++) {
		w[i] = b ^ (i * 0x9E3779B97F4A7C15ull);
	}
	for (size_t i = nw * 8; i < size; i++) {
		buf[i] = (char)(b >> (8 * (i % 8)));
	}
}

static inline bool rh_msg_check(uint64_t seed, const char *buf, size_t size, int c, long k)
{
	uint64_t b = rh_msg_base(seed, c, k);
	const uint64_t *w = (const uint64_t *)buf;
	size_t nw = size / 8;

	for (size_t i = 0; i < nw; i++) {
		if (w[i] != (b ^ (i * 0x9E3779B97F4A7C15ull))) {
			return false;
		}
	}
	for (size_t i = nw * 8; i < size; i++) {
		if (buf[i] != (char)(b >> (8 * (i % 8)))) {
			return false;
		}
	}
	return true;
}

#endif
