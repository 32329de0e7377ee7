/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>
#include <sys/random.h>

#include "auth.h"

int rh_auth_random(void *buf, size_t n)
{
	uint8_t *p = buf;

	while (n > 0) {
		ssize_t r = getrandom(p, n, 0);

		if (r < 0) {
			if (errno == EINTR) {
				continue;
			}
			return -errno;
		}
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static int hello_mac(const uint8_t *key, const struct rh_hello *h, bool reply, uint64_t conn_id,
		     uint32_t epoch, const uint8_t *bind1, const uint8_t *bind2,
		     uint8_t out[RH_MAC_LEN])
{
	uint8_t in[RH_MAC_INPUT_MAX];
	unsigned int olen = RH_MAC_LEN;
	int n = rh_hello_mac_input(h, reply, conn_id, epoch, bind1, bind2, in, sizeof(in));

	if (n < 0) {
		return n;
	}
	if (!HMAC(EVP_sha256(), key, RH_SECRET_LEN, in, (size_t)n, out, &olen) ||
	    olen != RH_MAC_LEN) {
		return -EIO;
	}
	return 0;
}

int rh_auth_sign(const uint8_t *key, struct rh_hello *h, bool reply, uint64_t conn_id,
		 uint32_t epoch, const uint8_t *bind1, const uint8_t *bind2)
{
	return hello_mac(key, h, reply, conn_id, epoch, bind1, bind2, h->mac);
}

bool rh_auth_verify(const uint8_t *key, const struct rh_hello *h, bool reply, uint64_t conn_id,
		    uint32_t epoch, const uint8_t *bind1, const uint8_t *bind2)
{
	uint8_t mac[RH_MAC_LEN];

	return hello_mac(key, h, reply, conn_id, epoch, bind1, bind2, mac) == 0 &&
	       rh_auth_equal(mac, h->mac, RH_MAC_LEN);
}

bool rh_auth_equal(const void *a, const void *b, size_t n)
{
	return CRYPTO_memcmp(a, b, n) == 0;
}
