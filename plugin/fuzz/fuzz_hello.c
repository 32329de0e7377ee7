/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the handshake's decoders (core/wire.c). Byte 0 picks one:
 *   0: rh_hello_get, the rest is a hello payload (every lane's HELLO / HELLO_ACK, the verbs
 *      lane's queue pair address inside its transport bytes included);
 *   1: rh_handle_get, the rest is the 128-byte connect handle (zero-padded when shorter: NCCL
 *      always hands over the whole handle).
 * A decoded hello must re-encode and decode to the same fields (byte for byte when the input
 * was canonical) and fit rh_hello_mac_input or be refused by it; a decoded handle must be in
 * bounds and re-encode to the same bytes where the encoder writes them.
 */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_handle(const uint8_t *data, size_t size)
{
	uint8_t b[RH_HANDLE_LEN] = { 0 }, enc[RH_HANDLE_LEN];
	struct rh_handle h, again;

	memcpy(b, data, size < sizeof(b) ? size : sizeof(b));
	memset(&h, 0, sizeof(h));
	if (rh_handle_get(b, &h) < 0) {
		return;
	}
	FUZZ_CHECK(h.nnics >= 1 && h.nnics <= RH_HANDLE_NICS && h.listen_nic < h.nnics);
	rh_handle_put(&h, enc);
	/* the encoder writes magic, counts, listen id, the NICs in use and the secret */
	FUZZ_CHECK(!memcmp(enc, b, 6) && !memcmp(enc + 8, b + 8, 8 + 8 * (size_t)h.nnics));
	FUZZ_CHECK(!memcmp(enc + RH_HANDLE_SECRET_OFF, b + RH_HANDLE_SECRET_OFF, RH_SECRET_LEN));
	memset(&again, 0, sizeof(again));
	FUZZ_CHECK(rh_handle_get(enc, &again) == 0);
	FUZZ_CHECK(again.nnics == h.nnics && again.listen_nic == h.listen_nic &&
		   again.listen_id == h.listen_id &&
		   !memcmp(again.secret, h.secret, RH_SECRET_LEN));
	for (int i = 0; i < h.nnics; i++) {
		FUZZ_CHECK(again.nics[i].ipv4 == h.nics[i].ipv4 &&
			   again.nics[i].port == h.nics[i].port &&
			   again.nics[i].rail == h.nics[i].rail &&
			   again.nics[i].up == h.nics[i].up);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct rh_hello h;

	if (size < 1) {
		return 0;
	}
	if (data[0] % 2 == 0) {
		memset(&h, 0, sizeof(h));
		if (rh_hello_get(data + 1, size - 1, &h) == 0) {
			fuzz_check_hello(data + 1, size - 1, &h);
		}
	} else {
		check_handle(data + 1, size - 1);
	}
	return 0;
}
