/* SPDX-License-Identifier: Apache-2.0 */
/* The lifecycle of a lane, as the failover core sees it. */
#ifndef RH_LANE_STATE_H
#define RH_LANE_STATE_H

enum rh_lane_state {
	/* Transport connecting / handshake in flight (deadline: probe timeout). Carries nothing. */
	RH_LANE_OPENING = 0,
	/* Handshake done on every stream: takes new data chunks and control frames. */
	RH_LANE_ACTIVE,
	/* No progress on cleared-to-send data for the completion timeout: a confirming probe of
	 * the same (local, remote) NIC pair is in flight. Takes no new chunks meanwhile. */
	RH_LANE_SUSPECT,
	/* Being retired after fail-back: carries only chunks of messages first scheduled before
	 * its retirement generation, then is closed gracefully (BYE). ACTIVE again if the
	 * fail-back's lane is lost before the BYE went out. */
	RH_LANE_DRAINING,
	/* Failed or fenced: transport shut down, frames from it ignored, never reused. */
	RH_LANE_DEAD,
	/* Warm standby (RAILHOP_STANDBY_LANES): handshake done on a backup pair, carries nothing
	 * (no data, no control) until a move promotes it to ACTIVE, or the peer sends a frame on
	 * it (the peer promoted it). Its failure drops it, it is not a failover. */
	RH_LANE_STANDBY,
};

#endif
