/* SPDX-License-Identifier: MIT */
/*
 * restart_int.h - what restart.c lends restart_restore.c: the two ends of the new process's
 * part in the watcher's protocol (restart.h) that the restore reaches.
 */
#ifndef KVTD_RESTART_INT_H
#define KVTD_RESTART_INT_H

struct kvtd;

/* Reaps the children this pid inherits (the previous process's teardown child, the watcher):
 * kvtierd has no others. */
void kvtd_restart_reaper_start(void);
/* The point of no return of a process started by a restart: it serves the sessions now; the
 * watcher lets go ('R'). Nothing without a watcher. */
void kvtd_restart_took_over(struct kvtd *d);

#endif
