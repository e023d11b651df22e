/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "llm_pool.h"

struct llm_pool {
	uint32_t n;
	pthread_t *tids; /* n - 1 workers */
	uint32_t started;
	pthread_mutex_t lock;
	pthread_cond_t go;   /* gen changed or stop set */
	pthread_cond_t done; /* pending reached 0 */
	uint64_t gen;	     /* bumped once per job, under lock */
	uint32_t pending;    /* workers still running the current job */
	bool stop;
	llm_job_fn fn;
	void *arg;
};

struct worker_arg {
	struct llm_pool *p;
	uint32_t t;
};

static void *
worker(void *a)
{
	struct worker_arg wa = *(struct worker_arg *)a;
	struct llm_pool *p = wa.p;
	uint64_t seen = 0;

	free(a);
	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (p->gen == seen && !p->stop)
			pthread_cond_wait(&p->go, &p->lock);
		if (p->stop)
			break;
		seen = p->gen;
		/* fn and arg were written under the lock before gen was bumped. */
		llm_job_fn fn = p->fn;
		void *arg = p->arg;

		pthread_mutex_unlock(&p->lock);
		fn(arg, wa.t, p->n);
		pthread_mutex_lock(&p->lock);
		if (--p->pending == 0)
			pthread_cond_signal(&p->done);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int
llm_pool_create(uint32_t n, struct llm_pool **ret_pool)
{
	struct llm_pool *p;
	int ret;

	if (!n)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->n = n;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->go, NULL);
	pthread_cond_init(&p->done, NULL);
	p->tids = calloc(n, sizeof(*p->tids));
	if (!p->tids) {
		ret = -ENOMEM;
		goto err_free;
	}
	for (uint32_t t = 1; t < n; t++) {
		struct worker_arg *wa = malloc(sizeof(*wa));

		if (!wa) {
			ret = -ENOMEM;
			goto err_free;
		}
		wa->p = p;
		wa->t = t;
		ret = -pthread_create(&p->tids[t - 1], NULL, worker, wa);
		if (ret < 0) {
			free(wa);
			goto err_free;
		}
		p->started++;
	}
	*ret_pool = p;
	return 0;

err_free:
	llm_pool_free(p);
	return ret;
}

void
llm_pool_run(struct llm_pool *p, llm_job_fn fn, void *arg)
{
	if (p->n == 1) {
		fn(arg, 0, 1);
		return;
	}
	pthread_mutex_lock(&p->lock);
	p->fn = fn;
	p->arg = arg;
	p->pending = p->n - 1;
	p->gen++;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->lock);

	fn(arg, 0, p->n);

	pthread_mutex_lock(&p->lock);
	while (p->pending)
		pthread_cond_wait(&p->done, &p->lock);
	pthread_mutex_unlock(&p->lock);
}

void
llm_pool_free(struct llm_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->lock);
	for (uint32_t i = 0; i < p->started; i++)
		pthread_join(p->tids[i], NULL);
	pthread_cond_destroy(&p->go);
	pthread_cond_destroy(&p->done);
	pthread_mutex_destroy(&p->lock);
	free(p->tids);
	free(p);
}
