/* ctl.h — a client of tqkvd's control API (tqkv.v1.Control over gRPC):
 * unary calls with protobuf-c messages.  Used by tqctl; libtqkv reuses it
 * for session open/close.
 *
 *   struct ctl *c;
 *   struct ctl_status st;
 *   if (ctl_open(&c, "unix:/run/tqkvd/control.sock", &st) < 0) ...;
 *   Tqkv__V1__HealthRequest q = TQKV__V1__HEALTH_REQUEST__INIT;
 *   ProtobufCMessage *rep;
 *   int r = ctl_call(c, "Health", &q.base, &rep, 5000, &st);
 *   // r == 0: rep is a Tqkv__V1__HealthReply; free it with
 *   //         protobuf_c_message_free_unpacked(rep, NULL)
 *   // r > 0: the daemon's gRPC status (st.msg says why); r < 0: -errno
 *   ctl_close(c);
 *
 * A struct ctl may be used by one thread at a time.  Nothing here logs.
 */
#ifndef TQKV_CTL_H
#define TQKV_CTL_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

struct ctl;

struct ctl_status {
	int code;          /* gRPC status code; 0 = OK */
	char msg[512];     /* the daemon's message, or a local error */
};

/* target: "unix:PATH" or "HOST:PORT".  Does not connect yet. */
int ctl_open(struct ctl **out, const char *target, struct ctl_status *st);
void ctl_close(struct ctl *c);

/* Call method `name` of tqkv.v1.Control ("Health", "OpenSession", ...). */
int ctl_call(struct ctl *c, const char *name, const ProtobufCMessage *req,
	     ProtobufCMessage **reply, int timeout_ms, struct ctl_status *st);
/* The same with raw bytes (tests send malformed or oversized messages);
 * *reply is malloc'd.  path: "/tqkv.v1.Control/Health". */
int ctl_call_raw(struct ctl *c, const char *path, const void *req, size_t len,
		 void **reply, size_t *reply_len, int timeout_ms, struct ctl_status *st);

/* "OK", "NOT_FOUND", ... */
const char *ctl_status_name(int code);

/* Sizes as in the daemon's config: an integer with an optional binary unit
 * (K, M, G, T, P, each optionally + "iB" or "B").  0 or -EINVAL/-ERANGE. */
int ctl_parse_size(const char *s, uint64_t *out);
/* "1.50 GiB" */
void ctl_format_size(uint64_t v, char *buf, size_t n);

#endif
