/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Single-core speed of the keyed MACs considered for RAILHOP_CHECKSUM=1's payload MAC (issue
 * 29, 2), through OpenSSL 3 as the plugin calls it, over 128 KiB chunks (the default
 * RAILHOP_CHUNK_SIZE) and over a 48-byte frame header (the header MAC):
 *
 *     cc -O2 -o /tmp/mac_speed bench/mac_speed.c -lcrypto && /tmp/mac_speed
 */
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static unsigned char buf[128 << 10], key[32] = "railhop mac_speed key 0123456789", tag[64];

static double gmac(size_t len, int iters)
{
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	unsigned char iv[12] = { 0 };
	double t0;
	int outl;

	EVP_EncryptInit_ex2(c, EVP_aes_128_gcm(), key, NULL, NULL);
	t0 = now();
	for (int i = 0; i < iters; i++) {
		memcpy(iv + 4, &i, sizeof(i));
		EVP_EncryptInit_ex2(c, NULL, NULL, iv, NULL);
		EVP_EncryptUpdate(c, NULL, &outl, buf, (int)len);
		EVP_EncryptFinal_ex(c, tag, &outl);
		EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag);
	}
	t0 = now() - t0;
	EVP_CIPHER_CTX_free(c);
	return t0;
}

static double mac(const char *name, const char *digest, size_t keylen, size_t len, int iters)
{
	EVP_MAC *m = EVP_MAC_fetch(NULL, name, NULL);
	EVP_MAC_CTX *c = EVP_MAC_CTX_new(m);
	OSSL_PARAM p[2] = { OSSL_PARAM_END, OSSL_PARAM_END };
	double t0;
	size_t ol;

	if (digest) {
		p[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)digest, 0);
	}
	EVP_MAC_init(c, key, keylen, p);
	t0 = now();
	for (int i = 0; i < iters; i++) {
		EVP_MAC_init(c, NULL, 0, NULL);
		EVP_MAC_update(c, buf, len);
		EVP_MAC_final(c, tag, &ol, sizeof(tag));
	}
	t0 = now() - t0;
	EVP_MAC_CTX_free(c);
	EVP_MAC_free(m);
	return t0;
}

int main(void)
{
	const int big = 4000, small = 1000000;

	memset(buf, 0x5a, sizeof(buf));
	printf("payload, 128 KiB chunks (GB/s, one core):\n");
	printf("  GMAC (AES-128-GCM)  %6.2f\n", big * sizeof(buf) / gmac(sizeof(buf), big) / 1e9);
	printf("  HMAC-SHA256         %6.2f\n",
	       big * sizeof(buf) / mac("HMAC", "SHA256", 32, sizeof(buf), big) / 1e9);
	printf("  BLAKE2b-MAC         %6.2f\n",
	       big * sizeof(buf) / mac("BLAKE2BMAC", NULL, 32, sizeof(buf), big) / 1e9);
	printf("header, 57 bytes (ns per tag):\n");
	printf("  HMAC-SHA256         %6.0f\n", mac("HMAC", "SHA256", 32, 57, small) / small * 1e9);
	printf("  GMAC (AES-128-GCM)  %6.0f\n", gmac(57, small) / small * 1e9);
	return 0;
}
