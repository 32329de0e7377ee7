/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer authentication helpers:
 *  - secrets and nonces from getrandom(2);
 *  - HMAC-SHA256 from the system's libcrypto (OpenSSL 3): a hello proves that its sender knows
 *    the connection secret that only the connect handle carries (wire.h, rh_hello_mac_input);
 *  - (the frame MACs after the hello: fmac.h.)
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

#endif
