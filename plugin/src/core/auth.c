/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <string.h>
#include <sys/random.h>

#include "auth.h"

#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

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

/* --- CRC32C --- */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);
static const char *crc_name = "table";

static void crc_table_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++) {
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1; /* reflected Castagnoli */
		}
		crc_table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++) {
		for (int t = 1; t < 8; t++) {
			crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^
					  crc_table[0][crc_table[t - 1][i] & 0xff];
		}
	}
}

/* Slicing-by-8 on the inverted register. */
static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t n)
{
	while (n >= 8) {
		uint64_t v;

		memcpy(&v, p, 8);
		v ^= crc; /* little-endian hosts (x86-64, AArch64 Linux) */
		crc = crc_table[7][v & 0xff] ^ crc_table[6][(v >> 8) & 0xff] ^
		      crc_table[5][(v >> 16) & 0xff] ^ crc_table[4][(v >> 24) & 0xff] ^
		      crc_table[3][(v >> 32) & 0xff] ^ crc_table[2][(v >> 40) & 0xff] ^
		      crc_table[1][(v >> 48) & 0xff] ^ crc_table[0][v >> 56];
		p += 8;
		n -= 8;
	}
	while (n--) {
		crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
	}
	return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n)
{
	uint64_t c = crc;

	while (n >= 8) {
		uint64_t v;

		memcpy(&v, p, 8);
		c = __builtin_ia32_crc32di(c, v);
		p += 8;
		n -= 8;
	}
	while (n--) {
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
	}
	return (uint32_t)c;
}
#elif defined(__aarch64__)
__attribute__((target("+crc"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n)
{
	while (n >= 8) {
		uint64_t v;

		memcpy(&v, p, 8);
		crc = __builtin_aarch64_crc32cx(crc, v);
		p += 8;
		n -= 8;
	}
	while (n--) {
		crc = __builtin_aarch64_crc32cb(crc, *p++);
	}
	return crc;
}
#endif

static void crc_init(void)
{
	crc_table_init();
	crc_fn = crc_sw;
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("sse4.2")) {
		crc_fn = crc_hw;
		crc_name = "sse4.2";
	}
#elif defined(__aarch64__)
	if (getauxval(AT_HWCAP) & (1ul << 7)) { /* HWCAP_CRC32 */
		crc_fn = crc_hw;
		crc_name = "armv8-crc";
	}
#endif
}

uint32_t rh_crc32c(uint32_t crc, const void *buf, size_t len)
{
	pthread_once(&crc_once, crc_init);
	return ~crc_fn(~crc, buf, len);
}

uint32_t rh_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
	pthread_once(&crc_once, crc_init);
	return ~crc_sw(~crc, buf, len);
}

const char *rh_crc32c_impl(void)
{
	pthread_once(&crc_once, crc_init);
	return crc_name;
}
