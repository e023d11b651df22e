/* SPDX-License-Identifier: MIT */
/*
 * kvtierd: parse options, start each subsystem, tell systemd we are ready, run the loop, stop
 * in reverse order.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "kvt_dev.h"
#include "kvt_version.h"
#include "kvtd.h"
#include "log.h"
#include "loop.h"
#include "poller.h"
#include "restart.h"
#include "restart_image.h"
#include "spill.h"

/* [spill]: the store, when a path is set (spill.h). Nothing spills into it yet. */
static int
spill_open(struct kvtd *d)
{
	struct kvtd_spill_params p = {
	    .path = d->cfg.spill_path,
	    .size = d->cfg.spill_size,
	    .queue_depth = d->cfg.spill_queue_depth,
	    .uid_share = d->cfg.spill_uid_share_pct < 0 ? d->cfg.spill_uid_share : 0,
	    .uid_share_pct =
		d->cfg.spill_uid_share_pct < 0 ? 0 : (unsigned)d->cfg.spill_uid_share_pct,
	    .owner = geteuid(),
	};
	struct kvtd_spill_stats st;
	char err[512];
	int r;

	if (!d->cfg.spill_path[0])
		return 0;
	r = kvtd_spill_open(&p, &d->spill, err, sizeof(err));
	if (r < 0) {
		log_err("%s", err);
		return r;
	}
	kvtd_spill_get_stats(d->spill, &st);
	log_notice("spill store: %s, %llu MiB (%s), queue depth %u", d->cfg.spill_path,
		   (unsigned long long)(st.size >> 20), st.block_device ? "block device" : "file",
		   st.queue_depth);
	return 0;
}

int
main(int argc, char **argv)
{
	struct kvtd_image *img = NULL;
	struct kvtd d;
	char err[512];
	int r, restore_fd, check;

	memset(&d, 0, sizeof(d));
	d.exe_fd = -1;
	/* started by a restart: the old process's watcher */
	d.watch_fd = kvtd_restart_take_watch(&d.watch_ack_fd);
	/* A restart in place (restart.h) appends --restore-fd: the rest is the original command. */
	restore_fd = kvtd_restart_take_fd(&argc, argv);
	check = kvtd_restart_take_check(&argc, argv);
	r = kvtd_config_load(&d.cfg, argc, argv, err, sizeof(err));
	if (check && r == 0) {
		printf("%s %d %s\n", KVTD_RESTART_READY, KVTD_IMAGE_VERSION, KVTD_RESTART_VERDICT);
		return fflush(stdout) == 0 ? 0 : 1;
	}
	if (r > 0)
		return 0;
	if (r < 0) {
		fprintf(stderr, "kvtierd: %s\n", err);
		if (restore_fd >= 0) {
			char why[600];

			snprintf(why, sizeof(why), "refused its configuration: %s", err);
			kvtd_restart_give_up(&d, why);
		}
		return 2;
	}
	d.fell_back = kvtd_restart_take_fallback(); /* a fallback: why the new binary failed */
	kvtd_restart_record(&d, argc, argv);
	if (restore_fd >= 0 && (r = kvtd_image_load(restore_fd, &img)) < 0) {
		char why[160];

		snprintf(why, sizeof(why), "refused the restart image: %s", strerror(-r));
		kvtd_restart_give_up(&d, why);
		kvtd_restart_drop_inherited(); /* logged: the old sessions end, start afresh */
	}
	d.start_ns = kvtd_now_ns();
	/* Signals arrive through signalfd in the main loop; every thread inherits this mask. */
	kvtd_loop_block_signals();
	signal(SIGPIPE, SIG_IGN);

	/* The socket first: a second daemon on a taken socket (or a path that is no socket) is
	 * refused before it opens a device or allocates and pins a pool. */
	r = img ? kvtd_restart_listener(&d, img) : kvtd_loop_listen(&d);
	if (r < 0) {
		kvtd_restart_give_up(&d, "found no listening socket in the image");
		goto err_listen;
	}
	r = kvt_dev_open(d.cfg.backend, &d.dev);
	if (r < 0) {
		log_err("device backend '%s' unavailable: %s",
			d.cfg.backend == KVT_DEV_CUDA ? "cuda" : "auto", strerror(-r));
		kvtd_restart_give_up(&d, "found its device backend unavailable");
		goto err_listen;
	}
	log_notice("kvtierd %s starting: backend %s", KVT_VERSION, kvt_dev_name(d.dev));
	if (img) {
		r = kvtd_restart_pool(&d, img);
		if (r < 0) {
			char why[160];

			snprintf(why, sizeof(why), "could not keep the pool: %s", strerror(-r));
			kvtd_restart_give_up(&d, why);
			log_err("restart: the pool cannot be kept (%s): the previous sessions are "
				"dropped",
				strerror(-r));
			kvtd_restart_drop_inherited();
			kvtd_image_free(img);
			img = NULL;
			/* the listener went too: bind it again */
			kvtd_loop_fini(&d);
			r = kvtd_loop_listen(&d);
			if (r < 0)
				goto err_dev;
		}
	}
	if (!img)
		r = kvtd_pool_init(&d.pool, &d.cfg, d.dev);
	if (r < 0)
		goto err_dev;
	r = kvtd_prefix_init(&d.prefix, &d.pool, kvtd_config_prefix_bytes(&d.cfg));
	if (r < 0)
		goto err_loop;
	kvtd_prefix_limits(&d.prefix, d.cfg.prefix_namespaces_per_uid, d.cfg.pool_bytes_per_uid);
	r = spill_open(&d);
	if (r < 0)
		goto err_loop;
	r = kvtd_loop_init(&d);
	if (r < 0)
		goto err_loop;
	r = kvtd_pollers_start(&d);
	if (r < 0) {
		log_err("starting pollers: %s", strerror(-r));
		if (img)
			kvtd_restart_give_up(&d, "could not start its pollers");
		goto err_pollers;
	}
	if (img) {
		/* logged; on failure it serves with a new, empty pool */
		r = kvtd_restart_sessions(&d, img);
		kvtd_image_free(img);
		img = NULL;
		if (r < 0 && !d.pool.base)
			goto err_pollers;
		kvtd_pool_populate(&d.pool);
		kvtd_restart_await_main(&d); /* under systemd: READY=1 is the main pid's */
	}
	sd_notifyf(0, "READY=1\nSTATUS=serving on %s, pool %llu MiB", d.cfg.socket_path,
		   (unsigned long long)(d.pool.size >> 20));
	log_notice("ready: %u poller(s), spin %u us", d.n_pollers, d.cfg.spin_us);
	r = kvtd_loop_run(&d);
	sd_notify(0, "STOPPING=1");
err_pollers:
	kvtd_loop_fini(&d);
	kvtd_pollers_stop(&d);
	kvtd_spill_close(d.spill);
	kvtd_prefix_fini(&d.prefix);
	kvtd_pool_fini(&d.pool);
	kvt_dev_close(d.dev);
	log_notice("kvtierd stopped");
	free(d.fell_back);
	return r < 0 ? 1 : 0;
err_loop:
	if (img)
		kvtd_restart_give_up(&d,
				     "could not set up its prefix store, spill store or main loop");
	kvtd_spill_close(d.spill);
	kvtd_prefix_fini(&d.prefix);
	kvtd_pool_fini(&d.pool);
err_dev:
	kvt_dev_close(d.dev);
err_listen:
	kvtd_image_free(img);
	kvtd_loop_fini(&d);
	log_notice("kvtierd stopped");
	free(d.fell_back);
	return 1;
}
