/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the core's frame headers and control payloads (core/wire.c: rh_hdr_get,
 * rh_cts_get, rh_resume_get, rh_dead_get, and rh_hello_get for HELLO/HELLO_ACK frames), fed as
 * a stream of frames back to back (header | payload | header | ...), as an ofi or verbs lane's
 * control message carries them and as a TCP stream does between its tags. Every decoded header
 * and payload is checked in bounds and re-encoded byte for byte (fuzz_common.h).
 */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_frames(data, size);
	return 0;
}
