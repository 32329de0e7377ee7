/* SPDX-License-Identifier: Apache-2.0 */
/* Frame MACs after the hello (fmac.h): HKDF stream keys, header HMAC tags, payload GMAC. */
#include <errno.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <pthread.h>
#include <string.h>

#include "auth.h"
#include "fmac.h"

static struct {
	pthread_once_t once;
	EVP_KDF *hkdf;
	EVP_MAC *hmac;
	EVP_CIPHER *gcm;
} algs = { .once = PTHREAD_ONCE_INIT };

static void algs_fetch(void)
{
	algs.hkdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
	algs.hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	algs.gcm = EVP_CIPHER_fetch(NULL, "AES-128-GCM", NULL);
}

static void put_le(uint8_t *b, uint64_t v, int n)
{
	for (int i = 0; i < n; i++) {
		b[i] = (uint8_t)(v >> (8 * i));
	}
}

#define FM_HKEY 32 /* HMAC-SHA256 key of the headers */
#define FM_PKEY 16 /* AES-128 key of the payload GMAC */

/* HKDF-SHA256: key = the connection secret, salt = both stream nonces, info = a label and the
 * stream's identity. */
static int fmac_derive(const uint8_t *secret, uint64_t conn_id, uint32_t lane_id, int stream,
		       int nstreams, const uint8_t *nonce_open, const uint8_t *nonce_acc,
		       uint8_t *out, size_t olen)
{
	static const char label[] = "railhop frame keys v1";
	uint8_t salt[2 * RH_NONCE_LEN], info[sizeof(label) + 14];
	char digest[] = "SHA256";
	OSSL_PARAM params[5];
	EVP_KDF_CTX *kctx;
	int ok;

	memcpy(salt, nonce_open, RH_NONCE_LEN);
	memcpy(salt + RH_NONCE_LEN, nonce_acc, RH_NONCE_LEN);
	memcpy(info, label, sizeof(label));
	put_le(info + sizeof(label), conn_id, 8);
	put_le(info + sizeof(label) + 8, lane_id, 4);
	info[sizeof(label) + 12] = (uint8_t)stream;
	info[sizeof(label) + 13] = (uint8_t)nstreams;
	params[0] = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0);
	params[1] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)secret,
						      RH_SECRET_LEN);
	params[2] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, salt, sizeof(salt));
	params[3] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, sizeof(info));
	params[4] = OSSL_PARAM_construct_end();
	kctx = EVP_KDF_CTX_new(algs.hkdf);
	if (!kctx) {
		return -ENOMEM;
	}
	ok = EVP_KDF_derive(kctx, out, olen, params);
	EVP_KDF_CTX_free(kctx);
	return ok == 1 ? 0 : -EIO;
}

int rh_fmac_init(struct rh_fmac *f, const uint8_t *secret, uint64_t conn_id, uint32_t lane_id,
		 int stream, int nstreams, const uint8_t *nonce_open, const uint8_t *nonce_acc,
		 bool opener)
{
	uint8_t key[FM_HKEY + FM_PKEY];
	char digest[] = "SHA256";
	OSSL_PARAM params[2];
	int rc;

	memset(f, 0, sizeof(*f));
	pthread_once(&algs.once, algs_fetch);
	if (!algs.hkdf || !algs.hmac || !algs.gcm) {
		return -EIO;
	}
	rc = fmac_derive(secret, conn_id, lane_id, stream, nstreams, nonce_open, nonce_acc, key,
			 sizeof(key));
	if (rc < 0) {
		goto fail;
	}
	rc = -ENOMEM;
	f->hmac = EVP_MAC_CTX_new(algs.hmac);
	f->gcm[0] = EVP_CIPHER_CTX_new();
	f->gcm[1] = EVP_CIPHER_CTX_new();
	if (!f->hmac || !f->gcm[0] || !f->gcm[1]) {
		goto fail;
	}
	rc = -EIO;
	params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0);
	params[1] = OSSL_PARAM_construct_end();
	if (EVP_MAC_init(f->hmac, key, FM_HKEY, params) != 1) {
		goto fail;
	}
	for (int d = 0; d < 2; d++) {
		if (EVP_EncryptInit_ex2(f->gcm[d], algs.gcm, key + FM_HKEY, NULL, NULL) != 1) {
			goto fail;
		}
	}
	f->dir = opener ? 0 : 1;
	OPENSSL_cleanse(key, sizeof(key));
	return 0;
fail:
	OPENSSL_cleanse(key, sizeof(key));
	rh_fmac_free(f);
	return rc;
}

void rh_fmac_free(struct rh_fmac *f)
{
	EVP_MAC_CTX_free(f->hmac);
	EVP_CIPHER_CTX_free(f->gcm[0]);
	EVP_CIPHER_CTX_free(f->gcm[1]);
	memset(f, 0, sizeof(*f));
}

/* HMAC-SHA256(direction, counter, hdr, p) truncated to RH_TAG_LEN. */
static int fmac_tag(struct rh_fmac *f, uint8_t dir, uint64_t ctr, const uint8_t *hdr, const void *p,
		    size_t len, uint8_t *tag)
{
	uint8_t pre[9], mac[32];
	size_t olen = 0;

	pre[0] = dir;
	put_le(pre + 1, ctr, 8);
	if (!f->hmac || EVP_MAC_init(f->hmac, NULL, 0, NULL) != 1 ||
	    EVP_MAC_update(f->hmac, pre, sizeof(pre)) != 1 ||
	    EVP_MAC_update(f->hmac, hdr, RH_HDR_LEN) != 1 ||
	    (len && EVP_MAC_update(f->hmac, p, len) != 1) ||
	    EVP_MAC_final(f->hmac, mac, &olen, sizeof(mac)) != 1 || olen != sizeof(mac)) {
		return -EIO;
	}
	memcpy(tag, mac, RH_TAG_LEN);
	return 0;
}

int rh_fmac_seal(struct rh_fmac *f, const uint8_t *hdr, const void *p, size_t len, uint8_t *tag)
{
	return fmac_tag(f, f->dir, f->ctr[RH_FM_TX]++, hdr, p, len, tag);
}

bool rh_fmac_open(struct rh_fmac *f, const uint8_t *hdr, const void *p, size_t len,
		  const uint8_t *tag)
{
	uint8_t want[RH_TAG_LEN];

	f->pay_ctr = f->ctr[RH_FM_RX]++;
	return fmac_tag(f, f->dir ^ 1, f->pay_ctr, hdr, p, len, want) == 0 &&
	       rh_auth_equal(want, tag, RH_TAG_LEN);
}

/* GMAC nonce: the sending side's direction byte and the DATA frame's counter. */
static int pay_begin(struct rh_fmac *f, int d, uint8_t dir, uint64_t ctr)
{
	uint8_t iv[12] = { dir };

	put_le(iv + 4, ctr, 8);
	return f->gcm[d] && EVP_EncryptInit_ex2(f->gcm[d], NULL, NULL, iv, NULL) == 1 ? 0 : -EIO;
}

static int pay_update(struct rh_fmac *f, int d, const void *p, size_t len)
{
	const uint8_t *b = p;
	int outl;

	while (len > 0) {
		int n = len > (1u << 30) ? 1 << 30 : (int)len;

		if (EVP_EncryptUpdate(f->gcm[d], NULL, &outl, b, n) != 1) {
			return -EIO;
		}
		b += n;
		len -= (size_t)n;
	}
	return 0;
}

static int pay_end(struct rh_fmac *f, int d, uint8_t *tag)
{
	uint8_t none[16];
	int outl;

	return EVP_EncryptFinal_ex(f->gcm[d], none, &outl) == 1 &&
			       EVP_CIPHER_CTX_ctrl(f->gcm[d], EVP_CTRL_GCM_GET_TAG, RH_TAG_LEN,
						   tag) == 1 ?
		       0 :
		       -EIO;
}

int rh_fmac_pay_seal(struct rh_fmac *f, const void *p, size_t len, uint8_t *tag)
{
	int rc = pay_begin(f, RH_FM_TX, f->dir, f->ctr[RH_FM_TX]);

	if (rc == 0) {
		rc = pay_update(f, RH_FM_TX, p, len);
	}
	return rc ? rc : pay_end(f, RH_FM_TX, tag);
}

int rh_fmac_pay_begin(struct rh_fmac *f)
{
	return pay_begin(f, RH_FM_RX, f->dir ^ 1, f->pay_ctr);
}

int rh_fmac_pay_update(struct rh_fmac *f, const void *p, size_t len)
{
	return pay_update(f, RH_FM_RX, p, len);
}

bool rh_fmac_pay_end(struct rh_fmac *f, const uint8_t *tag)
{
	uint8_t want[RH_TAG_LEN];

	return pay_end(f, RH_FM_RX, want) == 0 && rh_auth_equal(want, tag, RH_TAG_LEN);
}

int rh_fmac_pay_policy(const struct rh_hdr *h, bool required)
{
	if (h->type != RH_F_DATA || (h->flags & RH_FLAG_PMAC) || !required) {
		return 0;
	}
	return -EBADMSG;
}
