/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer authentication and integrity helpers:
 *  - secrets and nonces from getrandom(2);
 *  - HMAC-SHA256 from the system's libcrypto (OpenSSL 3): a hello proves that its sender knows
 *    the connection secret that only the connect handle carries (wire.h, rh_hello_mac_input);
 *  - CRC32C (Castagnoli) of DATA chunks (RAILHOP_CHECKSUM=1): the CPU's CRC32 instruction
 *    (x86-64 SSE4.2, AArch64 CRC) when present, a table otherwise.
 */
#ifndef RH_AUTH_H
#define RH_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

/* Fill buf with n random bytes (getrandom, never a weaker fallback): 0 or -errno. */
int rh_auth_random(void *buf, size_t n);
/* Sign h (fills h->mac) / check h's MAC, as rh_hello_mac_input() describes. */
int rh_auth_sign(const uint8_t *key, struct rh_hello *h, bool reply, uint64_t conn_id,
		 uint32_t epoch, const uint8_t *bind1, const uint8_t *bind2);
bool rh_auth_verify(const uint8_t *key, const struct rh_hello *h, bool reply, uint64_t conn_id,
		    uint32_t epoch, const uint8_t *bind1, const uint8_t *bind2);
/* Constant-time comparison. */
bool rh_auth_equal(const void *a, const void *b, size_t n);

/* CRC32C of buf continuing crc (start with 0). */
uint32_t rh_crc32c(uint32_t crc, const void *buf, size_t len);
/* The portable table implementation (unit tests compare both). */
uint32_t rh_crc32c_sw(uint32_t crc, const void *buf, size_t len);
/* Which implementation rh_crc32c uses: "sse4.2", "armv8-crc" or "table". */
const char *rh_crc32c_impl(void);

#endif
