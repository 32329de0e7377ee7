/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The threads of this process that are still running code: the entries of /proc/self/task
 * without PF_EXITING. pthread_join() returns when the kernel clears the thread's tid, which
 * it does in the middle of do_exit(); the task stays listed until it is released a moment
 * later (about 1 in 1000 joins on a 2-core host still sees it). PF_EXITING is set before the
 * tid is cleared and never on a thread that can run user code, so this count is exact right
 * after a join: a thread that was not joined (or not stopped) is counted, a joined one is not.
 * Used by the lifecycle test and the harness to check that a finalized plugin left no thread;
 * open_fds() beside it, that it left no descriptor.
 */
#ifndef RAILHOP_LIVE_THREADS_H
#define RAILHOP_LIVE_THREADS_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>

#define RH_PF_EXITING 0x00000004ul /* include/linux/sched.h */

/* -1 when /proc/self/task cannot be read. */
static inline int live_threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	if (!d) {
		return -1;
	}
	while ((e = readdir(d))) {
		char path[300], line[1024], *tail;
		unsigned long flags = 0;
		FILE *f;

		if (e->d_name[0] == '.') {
			continue;
		}
		snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
		f = fopen(path, "r");
		if (!f) {
			continue; /* released between readdir and open: gone */
		}
		/* pid (comm) state ppid pgrp session tty_nr tpgid flags ...; comm may hold ')' */
		if (fgets(line, sizeof(line), f) && (tail = strrchr(line, ')')) &&
		    sscanf(tail + 1, " %*c %*d %*d %*d %*d %*d %lu", &flags) == 1 &&
		    !(flags & RH_PF_EXITING)) {
			n++;
		}
		fclose(f);
	}
	closedir(d);
	return n;
}

/* The descriptors this process has open (its own directory stream's not counted); -1 when
 * /proc/self/fd cannot be read. */
static inline int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d) {
		return -1;
	}
	while ((e = readdir(d))) {
		n += e->d_name[0] != '.';
	}
	closedir(d);
	return n - 1;
}

#endif
