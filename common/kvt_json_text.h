/* SPDX-License-Identifier: MIT */
/*
 * kvt_json_text.h - JSON values as text (and the lookup that finds them), shared by the daemon's
 * Prometheus formatter (daemon/metrics_format.c) and kvtierctl's tables
 * (tools/kvtierctl/ctl_fmt.c), so both print a number the same way. Header only; needs json-c.
 */
#ifndef KVT_JSON_TEXT_H
#define KVT_JSON_TEXT_H

#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* The member @key of @o, or NULL when @o is not an object (NULL included) or has no such key.
 * Documents from the daemon are read with it alone, so any member may be missing. */
static inline struct json_object *
kvt_json_get(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!o || !json_object_is_type(o, json_type_object))
		return NULL;
	if (!json_object_object_get_ex(o, key, &v))
		return NULL;
	return v;
}

/* The string in @v, or NULL when @v is not a string. */
static inline const char *
kvt_json_str(struct json_object *v)
{
	return json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

/*
 * A number the way a person and Prometheus both read it: integers exactly (json-c keeps them
 * as 64-bit), doubles with 15 significant digits so 0.03 does not print as 0.0299999...,
 * NaN and infinities as Prometheus spells them, booleans as 0 or 1. False when @v is none.
 */
static inline bool
kvt_json_num_text(struct json_object *v, char *buf, size_t len)
{
	double d;

	switch (json_object_get_type(v)) {
	case json_type_int:
		if (json_object_get_int64(v) == INT64_MAX)
			snprintf(buf, len, "%" PRIu64, json_object_get_uint64(v));
		else
			snprintf(buf, len, "%" PRId64, json_object_get_int64(v));
		return true;
	case json_type_double:
		d = json_object_get_double(v);
		if (isnan(d))
			snprintf(buf, len, "NaN");
		else if (isinf(d))
			snprintf(buf, len, d > 0 ? "+Inf" : "-Inf");
		else
			snprintf(buf, len, "%.15g", d);
		return true;
	case json_type_boolean:
		snprintf(buf, len, "%d", json_object_get_boolean(v) ? 1 : 0);
		return true;
	default:
		return false;
	}
}

#endif
