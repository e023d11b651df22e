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
/* Main thread, the listening socket readable: takes every pending connection (metrics.c). */
void kvtd_metrics_serve(struct kvtd *d);

/* user_data of the scrapers' polls on the main ring: KVTD_METRICS_UD + slot, and of the
 * admin_gids resolver's eventfd the one after the last slot. Far below any heap address, which
 * the loop uses for its connections. */
#define KVTD_METRICS_UD 0x100
/* Is @ud a scraper's? */
int kvtd_metrics_owns(uint64_t ud);
/* Main thread: a scraper's poll completed with @res (revents or -errno). */
void kvtd_metrics_event(struct kvtd *d, uint64_t ud, int res);
/* Main thread, from the loop's timer: shuts down scrapers past their deadline. */
void kvtd_metrics_tick(struct kvtd *d, uint64_t now_ns);

#endif
