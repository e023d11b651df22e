/* SPDX-License-Identifier: MIT */
/*
 * metrics.h - the optional HTTP /metrics endpoint on a loopback address (metrics.c).
 */
#ifndef KVTD_METRICS_H
#define KVTD_METRICS_H

#include <stdint.h>

struct kvtd;

/*
 * kvtd_metrics_parse() - "127.x.x.x:PORT" or "localhost:PORT" (PORT 0: any free port) into a
 * network-order IPv4 address and a host-order port. Returns 0 or -EINVAL (not that form, not a
 * loopback address, port out of range).
 */
int kvtd_metrics_parse(const char *s, uint32_t *ret_addr, uint16_t *ret_port);

/* Main thread. Binds and listens when cfg.metrics_listen is set (d->metrics_fd, d->metrics_port),
 * else sets d->metrics_fd to -1. Returns 0, -EINVAL or -errno of socket/bind/listen. */
int kvtd_metrics_init(struct kvtd *d);
void kvtd_metrics_fini(struct kvtd *d);
/* Main thread, the listening socket readable: answers every pending connection. */
void kvtd_metrics_serve(struct kvtd *d);

#endif
